"""Collect the SmolLM2 tool recipe's RL runs into one results file and print the tables docs/smollm2_tools.md shows.

    python tools/eval/smollm2_tools_runs.py --collect s42 s1 s2 s42_lr0 s42_off \\
        [--cpu-log NAME=FILE ...] [--heldout NAME=FILE ...] --out docs/results/smollm2_tools_rl.json
    python tools/eval/smollm2_tools_runs.py --tables docs/results/smollm2_tools_rl.json [--plot PNG]

A run NAME is `output/smollm2_tools_NAME` (`python run_rl.py configs/smollm2_tools.yaml --seed S --output_dir
output/smollm2_tools_NAME ...`). Per run the file keeps the seed, learning rate, tools, whether the rollouts were
asynchronous, the warm start's build_info.json, every held-out evaluation (accuracy, tool-use rate, accuracy of the
samples with and without a call) and every training step's reward, tool-use rate, tool-error rate (calls whose
result is an error), turns per sample, mean completion length (actions and tool tokens) and wall seconds.
`--cpu-log NAME=FILE`: lines of `unix_time cpu_ticks load_average` sampled from the run's /proc/PID/stat (100 ticks
a second), for the CPU seconds the run got on a shared machine (an async run's trainer process only, not its
rollout worker). `--threads NAME=N`: the run's OMP_NUM_THREADS (default 1). `--heldout NAME=FILE`: a results file of
tools/eval/smollm2_tools_baseline.py whose keys are `step<N>` (its evaluations of the run's checkpoints, for a run
trained with `--do_eval false`), taken as the run's evaluations. `--keep JSON`: the runs of an earlier results file
that are not collected again, as they are (a run measured before, whose output directory is gone).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Dict, List, Optional

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _REPO not in sys.path:  # `from tools.eval...` when run as a script
    sys.path.insert(0, _REPO)

from tools.eval.run_metrics import metric_rows  # noqa: E402  (after the path)

STEP_KEYS = {"reward": "train/reward", "tool_use_rate": "rollout/tool_use_rate",
             "tool_error_rate": "rollout/tool_error_rate", "turns_per_sample": "rollout/turns_per_sample",
             "completion_length": "response_length/mean", "step_s": "perf/step_s"}
EVAL_KEYS = {"accuracy": "eval/accuracy", "tool_use_rate": "eval/tool_use_rate",
             "accuracy_with_tools": "eval/accuracy_with_tools", "accuracy_without_tools": "eval/accuracy_without_tools",
             "eval_s": "perf/eval_s"}


def _config(path: str) -> Dict[str, str]:
    out = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            key, sep, value = line.partition(":")
            if sep and not line.startswith((" ", "#")):
                out[key.strip()] = value.split("#")[0].strip()
    return out


def _round(value: Any) -> Any:
    """4 decimals; NaN (metrics.jsonl writes it as the string "nan": no sample of that kind) as None."""
    if value == "nan" or (isinstance(value, float) and value != value):
        return None
    return round(value, 4) if isinstance(value, float) else value


def heldout_evals(path: str) -> List[Dict[str, Any]]:
    """The `step<N>` entries of a smollm2_tools_baseline.py results file, as evaluations (the script's names)."""
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    out = []
    for key, r in data.items():
        if key.startswith("step"):
            out.append({"step": int(key[4:]), "accuracy": r["accuracy"], "tool_use_rate": r["tool_use_rate"],
                        "accuracy_with_tools": r["accuracy_with_tool_call"],
                        "accuracy_without_tools": r["accuracy_without_tool_call"], "eval_s": r["wall_s"],
                        "tool_error_rate": r["tool_error_rate"], "turns_per_sample": r["turns_per_sample"],
                        "seed": r["seed"], "model": r["model"]})
    return sorted(out, key=lambda e: e["step"])


def collect_run(name: str, root: str = _REPO, cpu_log: Optional[str] = None,
                heldout: Optional[str] = None, threads: int = 1) -> Dict[str, Any]:
    """One run's record from `output/smollm2_tools_<name>/` (metrics.jsonl, config.yaml, the warm start's info)."""
    out = os.path.join(root, "output", f"smollm2_tools_{name}")
    cfg = _config(os.path.join(out, "config.yaml"))
    eval_rows, step_rows = metric_rows(out)
    evals = [{"step": row["step"], **{k: _round(row.get(v)) for k, v in EVAL_KEYS.items()}} for row in eval_rows]
    steps = [{"step": row["step"], **{k: _round(row.get(v)) for k, v in STEP_KEYS.items()}} for row in step_rows]
    if heldout:
        evals = sorted(evals + heldout_evals(heldout), key=lambda e: e["step"])
    info_path = os.path.join(root, cfg.get("actor_model_name_or_path", ""), "build_info.json")
    warm = json.load(open(info_path, encoding="utf-8")) if os.path.isfile(info_path) else None
    run = {"name": name, "seed": int(cfg.get("seed", 42)), "learning_rate": float(cfg.get("learning_rate", "nan")),
           "tools": cfg.get("tools", ""), "async_rollout": cfg.get("async_rollout", "false") == "true",
           "threads": threads, "warm_start": warm, "evals": evals, "steps": steps}
    if cpu_log:
        samples = [line.split() for line in open(cpu_log, encoding="utf-8") if line.strip()]
        wall = int(samples[-1][0]) - int(samples[0][0])
        cpu = (int(samples[-1][1]) - int(samples[0][1])) / 100.0
        loads = [float(s[2]) for s in samples]
        run["cpu"] = {"wall_s": wall, "cpu_s": cpu, "load_min": min(loads), "load_max": max(loads),
                      "load_mean": round(sum(loads) / len(loads), 2)}
    return run


def _cell(value: Any, fmt: str = "{:.2f}") -> str:
    return "" if value is None else fmt.format(value)


def tables(results: Dict[str, Any]) -> str:
    """The held-out evaluations and the training steps (means over windows of 5 steps), as markdown."""
    lines = []
    for run in results["runs"]:
        lines += [f"Run `{run['name']}` (seed {run['seed']}, learning rate {run['learning_rate']:g}), held out:", "",
                  "| step | accuracy | tool-use rate | accuracy with a call | accuracy without | eval minutes |",
                  "|---|---|---|---|---|---|"]
        for e in run["evals"]:
            three = [_cell(e[k], "{:.3f}") for k in ("accuracy", "tool_use_rate", "accuracy_with_tools",
                                                     "accuracy_without_tools")]
            lines.append(f"| {e['step']} | {' | '.join(three)} | "
                         f"{_cell(e['eval_s'] and e['eval_s'] / 60, '{:.1f}')} |")
        lines += ["", "Training (means over the steps of each window):", "",
                  "| steps | reward | tool-use rate | tool-error rate | turns per sample | completion tokens per step "
                  "| s per step |", "|---|---|---|---|---|---|---|"]
        steps = run["steps"]
        for first in range(0, len(steps), 5):
            window = steps[first:first + 5]

            def mean(key: str) -> Optional[float]:
                values = [s[key] for s in window if s[key] is not None]
                return sum(values) / len(values) if values else None

            length = mean("completion_length")
            lines.append(f"| {window[0]['step']}-{window[-1]['step']} | {_cell(mean('reward'))} | "
                         f"{_cell(mean('tool_use_rate'))} | {_cell(mean('tool_error_rate'))} | "
                         f"{_cell(mean('turns_per_sample'))} | {_cell(length and length * 32, '{:.0f}')} | "
                         f"{_cell(mean('step_s'), '{:.0f}')} |")
        lines.append("")
    return "\n".join(lines)


def kind(run: Dict[str, Any]) -> str:
    """What a run is, for the tables and the plot: `tools off`, `learning_rate 0`, `async` or `GRPO` (with the
    trainer's threads when more than 1)."""
    if run["tools"] in ("", "[]"):
        return "tools off"
    if run["learning_rate"] == 0:
        return "learning_rate 0"
    if run.get("async_rollout"):
        return "async"
    return "GRPO" if run.get("threads", 1) == 1 else f"GRPO, {run['threads']} threads"


def training_minutes(run: Dict[str, Any], up_to: Optional[int] = None) -> float:
    """Minutes of the run's training steps up to step `up_to` (all: None), evaluations excluded."""
    return sum(s["step_s"] or 0.0 for s in run["steps"] if up_to is None or s["step"] <= up_to) / 60


def first_step_at(run: Dict[str, Any], accuracy: float) -> Optional[int]:
    """The first evaluated step whose held-out accuracy is at least `accuracy` (None: none is)."""
    return next((e["step"] for e in run["evals"] if e["accuracy"] >= accuracy), None)


def summary(results: Dict[str, Any], target: float = 0.9) -> str:
    """One row per run: held-out accuracy at each evaluation, the gain, the training rollouts' tool use, and the
    minutes (of training steps, evaluations excluded) to the first evaluation at `target` or above."""
    lines = ["| run | seed | held-out accuracy by step | gain (points) | tool-use rate, last evaluation | "
             "tool-error rate (training calls) | turns per sample | completion tokens per step | "
             f"training minutes | minutes to held-out >= {target:g} |", "|---|---|---|---|---|---|---|---|---|---|"]
    for run in results["runs"]:
        evals, steps = run["evals"], run["steps"]
        by_step = ", ".join(f"{e['step']}: {e['accuracy']:.3f}" for e in evals)
        gain = 100 * (evals[-1]["accuracy"] - evals[0]["accuracy"])
        calls = [s for s in steps if s["tool_use_rate"]]
        errors = (sum(s["tool_error_rate"] * s["tool_use_rate"] for s in calls) / sum(s["tool_use_rate"] for s in calls)
                  if calls else None)
        turns = sum(s["turns_per_sample"] or 1.0 for s in steps) / len(steps)
        tokens = 32 * sum(s["completion_length"] for s in steps) / len(steps)
        reached = first_step_at(run, target)
        lines.append(f"| {kind(run)} | {run['seed']} | {by_step} | {gain:+.1f} | "
                     f"{_cell(evals[-1]['tool_use_rate'], '{:.3f}')} | {_cell(errors, '{:.3f}')} | {turns:.2f} | "
                     f"{tokens:.0f} | {training_minutes(run):.1f} | "
                     f"{'-' if reached is None else f'{training_minutes(run, reached):.1f} (step {reached})'} |")
    return "\n".join(lines) + "\n"


def plot(results: Dict[str, Any], out: str) -> None:
    """Held-out accuracy by step, the training samples' tool-use rate by step, and held-out accuracy by minute of
    training, one line per one-thread synchronous run (the seeds and the controls; PNG)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (acc, use, by_time) = plt.subplots(1, 3, figsize=(15, 4))
    styles = {"learning_rate 0": ":", "tools off": "--"}
    for run in results["runs"]:
        if run.get("async_rollout") or run.get("threads", 1) != 1:  # the async comparison is a table of its own
            continue
        label, style = f"{kind(run)}, seed {run['seed']}", styles.get(kind(run), "-")
        steps = [e["step"] for e in run["evals"]]
        acc.plot(steps, [e["accuracy"] for e in run["evals"]], style, marker="o", markersize=3, label=label)
        use.plot([s["step"] for s in run["steps"]], [s["tool_use_rate"] for s in run["steps"]], style, label=label)
        by_time.plot([training_minutes(run, s) for s in steps], [e["accuracy"] for e in run["evals"]], style,
                     marker="o", markersize=3, label=label)
    acc.set_ylabel("held-out accuracy (200 problems, T = 1)")
    use.set_ylabel("tool-use rate of the training samples")
    for ax, xlabel in ((acc, "step (4 prompts x 8 samples)"), (use, "step"),
                       (by_time, "minutes of training from the warm start (evaluations excluded)")):
        ax.set_xlabel(xlabel)
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
    by_time.legend(fontsize=8)
    fig.suptitle("SmolLM2-135M-Instruct learns to call a calculator (GRPO from a 10-step warm start)")
    fig.tight_layout()
    fig.savefig(out, dpi=100)


def _named(pairs: List[str], flag: str) -> Dict[str, str]:
    out = {}
    for pair in pairs:
        name, sep, path = pair.partition("=")
        if not sep:
            raise SystemExit(f"{flag} {pair!r}: expected NAME=FILE")
        out[name] = path
    return out


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--collect", nargs="*", default=[])
    parser.add_argument("--cpu-log", nargs="*", default=[], metavar="NAME=FILE", help="a run's CPU samples")
    parser.add_argument("--heldout", nargs="*", default=[], metavar="NAME=FILE",
                        help="a run's checkpoint evaluations (tools/eval/smollm2_tools_baseline.py)")
    parser.add_argument("--threads", nargs="*", default=[], metavar="NAME=N",
                        help="a run's OMP_NUM_THREADS (default 1; an async run's trainer and worker each)")
    parser.add_argument("--keep", default=None, metavar="JSON",
                        help="an earlier results file whose runs not collected again are kept as they are")
    parser.add_argument("--note", default="", help="the conditions, kept in the results file")
    parser.add_argument("--out", default=None)
    parser.add_argument("--tables", default=None)
    parser.add_argument("--plot", default=None, metavar="PNG", help="with --tables: draw the runs")
    args = parser.parse_args(argv)
    if args.collect:
        from tools.eval.quickstart_seeds import machine

        cpu, heldout = _named(args.cpu_log, "--cpu-log"), _named(args.heldout, "--heldout")
        threads = _named(args.threads, "--threads")
        runs = [collect_run(n, cpu_log=cpu.get(n), heldout=heldout.get(n), threads=int(threads.get(n, 1)))
                for n in args.collect]
        if args.keep:
            with open(args.keep, encoding="utf-8") as f:
                runs = [r for r in json.load(f)["runs"] if r["name"] not in args.collect] + runs
        results = {"config": "configs/smollm2_tools.yaml", "machine": machine(), "note": args.note, "runs": runs}
        if args.out:
            with open(args.out, "w", encoding="utf-8") as f:
                json.dump(results, f, indent=1)
                f.write("\n")
        print(summary(results) + "\n" + tables(results))
    if args.tables:
        with open(args.tables, encoding="utf-8") as f:
            results = json.load(f)
        if args.plot:
            plot(results, args.plot)
        print(summary(results) + "\n" + tables(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
