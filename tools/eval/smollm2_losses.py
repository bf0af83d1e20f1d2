"""Collect runs of the SmolLM2 recipe that differ only in the policy loss, and print the table docs/smollm2.md shows.

    python tools/eval/smollm2_losses.py --collect output/loss_grpo output/loss_cispo ... \
        --out docs/results/smollm2_losses.json --note "what the machine was doing"
    python tools/eval/smollm2_losses.py --tables docs/results/smollm2_losses.json

Each DIR is a run's output directory (`python run_rl.py configs/smollm2_grpo.yaml --policy_loss NAME ...`; the
commands are in docs/smollm2.md). Per run the file keeps the loss and the keys that shape it (from the run's
resolved config.yaml), every held-out evaluation, and per step the training reward, step seconds, entropy, the
clip fractions and `train/approx_kl_old` (how far the later optimizer steps of a rollout moved the policy; the
losses differ only where that is not 0). tests/tools/test_smollm2_side_results.py checks the page against the file.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from typing import Dict, List, Optional

import yaml

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _REPO not in sys.path:
    sys.path.insert(0, _REPO)

from tools.eval.run_metrics import metric_rows  # noqa: E402  (after the path)

# Config keys that decide what a policy loss computes (docs/algorithms.md section 4), kept per run.
LOSS_KEYS = ("policy_loss", "importance_sampling_level", "loss_agg_mode", "clip_range_ratio", "clip_range_ratio_low",
             "clip_range_ratio_high", "sapo_temperature_pos", "sapo_temperature_neg", "clip_cov_ratio", "clip_cov_lb",
             "clip_cov_ub", "kl_cov_ratio", "ppo_kl_coef", "global_mini_batch_size", "update_iters", "learning_rate",
             "seed")
# Per-step metrics kept: [step, reward, step s, entropy, clip_frac_low, clip_frac_high, approx_kl_old]; a step whose
# every mini-batch had nothing to learn logs no entropy or clip fraction (docs/algorithms.md section 6): None.
STEP_KEYS = ("train/reward", "perf/step_s", "train/entropy", "train/clip_frac_low", "train/clip_frac_high",
             "train/approx_kl_old")


def collect_run(directory: str) -> Dict:
    """One run's record from `directory`'s metrics.jsonl and resolved config.yaml."""
    with open(os.path.join(directory, "config.yaml"), encoding="utf-8") as f:
        config = yaml.safe_load(f)
    eval_rows, step_rows = metric_rows(directory)
    return {"name": os.path.basename(os.path.normpath(directory)), "config": {k: config.get(k) for k in LOSS_KEYS},
            "evals": [[row["step"], row["eval/accuracy"]] for row in eval_rows],
            "steps": [[row["step"]] + [None if row.get(k) is None else round(row[k], 4) for k in STEP_KEYS]
                      for row in step_rows]}


def _mean(values: List[Optional[float]]) -> Optional[float]:
    kept = [v for v in values if v is not None]
    return statistics.mean(kept) if kept else None


def label(run: Dict) -> str:
    """The loss and the settings that shape it, e.g. "`gspo`, clip 0.0003 / 0.0004"."""
    c = run["config"]
    name = c["policy_loss"]
    if name in (None, "clip", "gspo", "gmpo", "geo_mean", "clip_cov"):
        low = c["clip_range_ratio_low"] if c["clip_range_ratio_low"] is not None else c["clip_range_ratio"]
        high = c["clip_range_ratio_high"] if c["clip_range_ratio_high"] is not None else c["clip_range_ratio"]
        return ("unset (PPO clip, GRPO's)" if name is None else f"`{name}`") + f", clip {low:g} / {high:g}"
    if name == "cispo":
        return f"`cispo`, weight capped at {1 + c['clip_range_ratio_high']:g}"
    if name == "sapo":
        return f"`sapo`, temperatures {c['sapo_temperature_pos']:g} / {c['sapo_temperature_neg']:g}"
    if name == "kl_cov":
        return f"`kl_cov`, ratio {c['kl_cov_ratio']:g}, coefficient {c['ppo_kl_coef']:g}"
    return f"`{name}`"


def row_cells(run: Dict, eval_steps: List[int]) -> List[str]:
    """The table's cells for one run: held-out accuracy at `eval_steps`, correct training samples (rewards are 0 or
    1, 32 samples a step), mean clip fractions low / high, entropy of the first / last 5 steps, minutes of training."""
    acc = dict((s, a) for s, a in run["evals"])
    steps = run["steps"]
    correct = round(sum(s[1] for s in steps) * 32)
    low, high = _mean([s[4] for s in steps]), _mean([s[5] for s in steps])
    entropy = [s[3] for s in steps if s[3] is not None]
    kl = _mean([s[6] for s in steps])
    return [" / ".join(f"{acc[s]:.2f}" for s in eval_steps), str(correct),
            f"{100 * low:.1f} / {100 * high:.1f}" if low is not None else "-",
            f"{statistics.mean(entropy[:5]):.2f} -> {statistics.mean(entropy[-5:]):.2f}",
            f"{kl:.3f}" if kl is not None else "-",
            f"{sum(s[2] for s in steps) / 60:.1f}"]


def tables(results: Dict) -> str:
    """The markdown table of docs/smollm2.md: one row per loss."""
    eval_steps = sorted({s for r in results["runs"] for s, _ in r["evals"]})
    lines = [f"| policy loss | seed | held-out accuracy, steps {' / '.join(map(str, eval_steps))} | correct "
             f"training samples (of {32 * max(len(r['steps']) for r in results['runs']):,}) | clip fraction low / "
             "high, % | entropy, first / last 5 steps | `approx_kl_old`, mean | minutes of training |",
             "|---|---|---|---|---|---|---|---|"]
    for run in results["runs"]:
        lines.append(f"| {label(run)} | {run['config']['seed']} | " + " | ".join(row_cells(run, eval_steps)) + " |")
    return "\n".join(lines) + "\n"


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--collect", nargs="+", metavar="DIR", help="run output directories to collect")
    parser.add_argument("--note", default="", help="what the machine was doing meanwhile, kept in the file")
    parser.add_argument("--out", default="output/smollm2_losses.json")
    parser.add_argument("--tables", metavar="JSON", help="print the table of a results file")
    args = parser.parse_args(argv)
    if args.tables:
        with open(args.tables, encoding="utf-8") as f:
            print(tables(json.load(f)), end="")
        return 0
    if not args.collect:
        parser.error("give --collect DIR... or --tables JSON")
    if os.path.exists(args.out):
        parser.error(f"{args.out} exists: remove it first (a results file is never overwritten)")
    from tools.eval.quickstart_seeds import machine

    results = {"config": "configs/smollm2_grpo.yaml", "machine": machine(), "note": args.note,
               "runs": [collect_run(d) for d in args.collect]}
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(results, f, indent=1)
        f.write("\n")
    print(tables(results), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
