"""Record what three reference runs compute, and check later that a refactoring left every number unchanged.

    python tools/eval/regression_snapshot.py record output/snapshot_before.json     # before a change
    python tools/eval/regression_snapshot.py record output/snapshot_after.json      # after it, same machine
    python tools/eval/regression_snapshot.py compare output/snapshot_before.json output/snapshot_after.json

The runs (each into its own directory under output/regression/, policies under build/):
- `quickstart`: the default command, `python run_rl.py configs/quickstart.yaml` (GRPO, 300 steps, evaluations);
- `reinforce_pp`: the quickstart policy trained 20 steps with REINFORCE++ and a KL penalty in the reward (so the
  reference model, the KL estimator and the batch whitening run);
- `dp2`: the quickstart config, 20 steps on 2 data-parallel CPU ranks under `paddle.distributed.launch` (gloo).
The snapshot keeps every metric except timings (`perf/*`) from each run's metrics.jsonl. Runs are bitwise
reproducible on one machine with one thread count, so `compare` demands equality, and reports the first
difference of each run. Numbers differ between CPUs: compare snapshots made on the same machine only.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from typing import Dict, List

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_OUT = "output/regression"

RUNS: Dict[str, List[str]] = {
    "quickstart": ["run_rl.py", "configs/quickstart.yaml"],
    "reinforce_pp": ["run_rl.py", "configs/quickstart.yaml", "--rl_algorithm", "reinforce_plus_plus",
                     "--kl_coeff", "0.01", "--max_steps", "20", "--eval_steps", "10"],
    "dp2": ["-m", "paddle.distributed.launch", "--devices", "", "--nproc_per_node", "2", "--log_dir",
            f"{_OUT}/dp2/log", "run_rl.py", "configs/quickstart.yaml", "--max_steps", "20", "--eval_steps", "10"],
}


def run(name: str) -> List[dict]:
    """Run `name` from scratch and return its metric rows without timings."""
    out = os.path.join(_OUT, name)
    shutil.rmtree(os.path.join(_REPO, out), ignore_errors=True)
    cmd = [sys.executable, *RUNS[name], "--output_dir", out, "--logging_dir", f"{out}/vdl_log",
           "--disable_tqdm", "true"]
    log = os.path.join(_REPO, _OUT, f"{name}.log")
    os.makedirs(os.path.dirname(log), exist_ok=True)
    with open(log, "w", encoding="utf-8") as f:
        status = subprocess.run(cmd, cwd=_REPO, stdout=f, stderr=subprocess.STDOUT).returncode
    if status != 0:
        raise SystemExit(f"{name}: {' '.join(cmd)} exited {status}; see {log}")
    with open(os.path.join(_REPO, out, "metrics.jsonl"), encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [{k: v for k, v in row.items() if not k.startswith("perf/")} for row in rows]


def compare(before: Dict, after: Dict) -> List[str]:
    """One line per run: identical, or its first differing step and key."""
    lines = []
    for name in sorted(set(before["runs"]) | set(after["runs"])):
        a, b = before["runs"].get(name), after["runs"].get(name)
        if a is None or b is None:
            lines.append(f"{name}: only in {'the second' if a is None else 'the first'} snapshot")
        elif a == b:
            lines.append(f"{name}: identical ({len(a)} rows, {sum(len(r) - 1 for r in a)} values)")
        else:
            lines.append(f"{name}: DIFFERENT: {_first_difference(a, b)}")
    return lines


def _first_difference(a: List[dict], b: List[dict]) -> str:
    for ra, rb in zip(a, b):
        for key in sorted(set(ra) | set(rb)):
            if ra.get(key) != rb.get(key):
                return f"step {ra.get('step')}, {key}: {ra.get(key)!r} vs {rb.get(key)!r}"
    return f"{len(a)} rows vs {len(b)} rows"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="run the reference runs and write their metrics")
    rec.add_argument("out", help="JSON file to write")
    rec.add_argument("--runs", default=",".join(RUNS), help=f"comma-separated subset of {','.join(RUNS)}")
    cmp_ = sub.add_parser("compare", help="compare two snapshots; exit 1 when they differ")
    cmp_.add_argument("before")
    cmp_.add_argument("after")
    args = parser.parse_args(argv)
    if args.command == "record":
        names = [n for n in args.runs.split(",") if n]
        unknown = [n for n in names if n not in RUNS]
        if unknown:
            parser.error(f"unknown run(s) {', '.join(unknown)}; choose from {', '.join(RUNS)}")
        snapshot = {"commit": _commit(), "runs": {name: run(name) for name in names}}
        os.makedirs(os.path.dirname(os.path.abspath(args.out)) or ".", exist_ok=True)
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(snapshot, f, indent=1)
            f.write("\n")
        print(f"wrote {args.out}: " + ", ".join(f"{n} {len(r)} rows" for n, r in snapshot["runs"].items()))
        return 0
    with open(args.before, encoding="utf-8") as f:
        before = json.load(f)
    with open(args.after, encoding="utf-8") as f:
        after = json.load(f)
    lines = compare(before, after)
    print("\n".join(lines))
    return 0 if all(": identical" in line for line in lines) else 1


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=_REPO, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


if __name__ == "__main__":
    sys.exit(main())
