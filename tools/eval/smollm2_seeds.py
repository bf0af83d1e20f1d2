"""Collect the SmolLM2 recipe's runs into one results file and print the tables docs/smollm2.md shows.

    python tools/eval/smollm2_seeds.py --collect s42 s1 s2 s42_lr0 --out docs/results/smollm2_seeds.json
    python tools/eval/smollm2_seeds.py --tables docs/results/smollm2_seeds.json

A run NAME is `output/smollm2_NAME` (from `python run_rl.py configs/smollm2_grpo.yaml --seed S --output_dir
output/smollm2_NAME ...`; `_lr0` in the name marks a `--learning_rate 0` control). Per run the file keeps the seed,
every held-out evaluation (step, `eval/accuracy`), the training reward and step time of every step, and the CPU
seconds per step when `--cpu-log` gives a log of `time pid output_dir cpu_ticks step load` lines (the runs here
shared 2 cores with other jobs, so wall time alone says little), and with `--keep-metric KEY...` those metrics at
every step (the distillation runs of configs/smollm2_opd.yaml keep `opd/reverse_kl`: `--config
configs/smollm2_opd.yaml --keep-metric opd/reverse_kl`). tests/test_smollm2.py checks docs/smollm2.md against the
committed file.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Dict, List, Optional

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _REPO not in sys.path:
    sys.path.insert(0, _REPO)

from tools.eval.run_metrics import metric_rows  # noqa: E402  (after the path)


def collect_run(name: str, root: str = _REPO, keep: tuple = ()) -> Dict:
    """One run's row from `output/smollm2_<name>/metrics.jsonl` and its resolved config.yaml; `keep`: metric keys
    whose value at every training step goes into `metrics` (None where a step did not log it)."""
    out = os.path.join(root, "output", f"smollm2_{name}")
    eval_rows, step_rows = metric_rows(out)
    evals = [[row["step"], row["eval/accuracy"]] for row in eval_rows]
    steps = [[row["step"], round(row["train/reward"], 4), round(row["perf/step_s"], 2)] for row in step_rows]
    kept = {k: [None if row.get(k) is None else round(row[k], 4) for row in step_rows] for k in keep}
    seed = lr = None
    with open(os.path.join(out, "config.yaml"), encoding="utf-8") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key == "seed":
                seed = int(value)
            elif key == "learning_rate":
                lr = float(value)
    return {"name": name, "seed": seed, "learning_rate": lr, "evals": evals, "steps": steps,
            "wall_s": round(sum(s[2] for s in steps)), **({"metrics": kept} if keep else {})}


def cpu_per_step(log: str, name: str) -> Optional[float]:
    """CPU seconds per step of run `name` between the first and last sample of `log` at which it had logged a step."""
    points = []
    with open(log, encoding="utf-8") as f:
        for line in f:
            parts = line.split()
            if len(parts) == 6 and parts[2] == f"output/smollm2_{name}" and parts[4].isdigit():
                points.append((int(parts[4]), int(parts[3]) / 100.0))  # /proc ticks: 100 per second (CLK_TCK)
    if len(points) < 2 or points[-1][0] == points[0][0]:
        return None
    return round((points[-1][1] - points[0][1]) / (points[-1][0] - points[0][0]), 1)


def tables(results: Dict) -> str:
    """The markdown of docs/smollm2.md: held-out accuracy at every evaluation of every run."""
    steps = sorted({s for r in results["runs"] for s, _ in r["evals"]})
    lines = ["| run | " + " | ".join(f"step {s}" for s in steps) + " | change | s per step | CPU s per step |",
             "|---|" + "---|" * (len(steps) + 3)]
    for r in results["runs"]:
        acc = dict((s, a) for s, a in r["evals"])
        label = _label(r)
        cells = [f"{acc[s]:.2f}" if s in acc else "" for s in steps]
        change = 100 * (r["evals"][-1][1] - r["evals"][0][1])
        mean_step = sum(s[2] for s in r["steps"]) / len(r["steps"])
        cpu = "" if r.get("cpu_s_per_step") is None else f"{r['cpu_s_per_step']:.1f}"
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {change:+.0f} (step {r['evals'][-1][0]}) | "
                     f"{mean_step:.0f} | {cpu} |")
    return "\n".join(lines) + "\n"


def trl_run(path: str) -> Dict:
    """A run of tools/bench/trl_smollm2.py (its JSON file) in collect_run's form, marked `peer: trl`."""
    with open(path, encoding="utf-8") as f:
        rec = json.load(f)
    steps = [[s["step"], None if s.get("reward") is None else round(s["reward"], 4), s["step_s"]]
             for s in rec["steps"]]
    cpu = [s["cpu_s"] for s in rec["steps"] if "cpu_s" in s]
    return {"name": f"trl_s{rec['seed']}", "peer": "trl", "trl_version": rec["trl_version"], "seed": rec["seed"],
            "learning_rate": rec["learning_rate"], "evals": [[e["step"], e["accuracy"]] for e in rec["evals"]], "steps": steps,
            "wall_s": round(sum(s[2] for s in steps)),
            "cpu_s_per_step": round(sum(cpu) / len(cpu), 1) if cpu else None,
            "threads": rec.get("threads"), "peak_rss_mb": rec.get("peak_rss_mb")}


def _label(r: Dict) -> str:
    if r.get("peer") == "trl":
        return f"TRL {r['trl_version']}, seed {r['seed']}"
    return f"`--seed {r['seed']}" + (" --learning_rate 0`" if r["learning_rate"] == 0 else "`")


def wall_clock_table(results: Dict, target: float = 0.5) -> str:
    """The side-by-side in training time (evaluations excluded): per run the median step, the minutes to each
    evaluation's step, the first evaluation reaching `target` and the last accuracy."""
    lines = ["| run | median s per step | minutes of training to the last step | first held-out accuracy "
             f">= {target:.1f} at | last held-out accuracy |", "|---|---|---|---|---|"]
    for r in results["runs"]:
        if r["learning_rate"] == 0:
            continue
        times = sorted(s[2] for s in r["steps"])
        median = times[len(times) // 2] if len(times) % 2 else (times[len(times) // 2 - 1] + times[len(times) // 2]) / 2
        elapsed, cum = {}, 0.0
        for s in r["steps"]:
            cum += s[2]
            elapsed[s[0]] = cum
        first = next(((s, a) for s, a in r["evals"] if a >= target), None)
        reached = "not reached" if first is None else \
            f"step {first[0]}, {elapsed.get(first[0], 0.0) / 60:.1f} min ({first[1]:.2f})"
        last = r["evals"][-1]
        lines.append(f"| {_label(r)} | {median:.1f} | {cum / 60:.1f} (step {r['steps'][-1][0]}) | {reached} | "
                     f"{last[1]:.2f} (step {last[0]}) |")
    return "\n".join(lines) + "\n"


def plot(results: Dict, out: str) -> None:
    """Held-out accuracy against minutes of training (evaluations excluded), one line per run, into a PNG."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (by_step, by_time) = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for r in results["runs"]:
        elapsed, cum = {0: 0.0}, 0.0
        for s in r["steps"]:
            cum += s[2]
            elapsed[s[0]] = cum / 60
        evals = [(s, a) for s, a in r["evals"] if s in elapsed]
        style = "--" if r.get("peer") == "trl" else (":" if r["learning_rate"] == 0 else "-")
        label = _label(r).replace("`", "")
        by_step.plot([s for s, _ in evals], [a for _, a in evals], style, marker="o", markersize=3, label=label)
        by_time.plot([elapsed[s] for s, _ in evals], [a for _, a in evals], style, marker="o", markersize=3,
                     label=label)
    by_step.set_xlabel("step (4 prompts x 8 samples)")
    by_time.set_xlabel("minutes of training (evaluations excluded)")
    by_step.set_ylabel("held-out accuracy (T = 1, 100 problems)")
    for ax in (by_step, by_time):
        ax.set_ylim(-0.02, 1.0)
        ax.grid(alpha=0.3)
    by_time.legend(fontsize=8)
    fig.suptitle("SmolLM2-135M-Instruct, GRPO on a + b: paddle_grpo and TRL")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--collect", nargs="+", metavar="NAME", help="runs output/smollm2_NAME to collect")
    parser.add_argument("--trl", nargs="*", default=[], metavar="JSON",
                        help="runs of tools/bench/trl_smollm2.py to set beside them")
    parser.add_argument("--cpu-log", help="log of CPU ticks per run (see the module docstring)")
    parser.add_argument("--keep-metric", nargs="+", default=[], metavar="KEY",
                        help="metrics kept at every step, e.g. opd/reverse_kl")
    parser.add_argument("--note", default="", help="what the machine was doing meanwhile, kept in the file")
    parser.add_argument("--config", default="configs/smollm2_grpo.yaml", help="the runs' YAML file, kept in the file")
    parser.add_argument("--out", default="output/smollm2_seeds.json")
    parser.add_argument("--tables", metavar="JSON", help="print the tables of a results file")
    parser.add_argument("--plot", metavar="PNG", help="with --tables: also draw accuracy against training minutes")
    args = parser.parse_args(argv)
    if args.tables:
        with open(args.tables, encoding="utf-8") as f:
            results = json.load(f)
        if args.plot:
            plot(results, args.plot)
        print(tables(results) + "\n" + wall_clock_table(results), end="")
        return 0
    if not args.collect:
        parser.error("give --collect NAME... or --tables JSON")
    from tools.eval.quickstart_seeds import machine

    runs = [collect_run(name, keep=tuple(args.keep_metric)) for name in args.collect]
    if args.cpu_log:
        for r in runs:
            r["cpu_s_per_step"] = cpu_per_step(args.cpu_log, r["name"])
    for path in args.trl:
        runs.append(trl_run(path))
    results = {"config": args.config, "machine": machine(), "note": args.note, "runs": runs}
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(results, f, indent=1)
        f.write("\n")
    print(tables(results) + "\n" + wall_clock_table(results), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
