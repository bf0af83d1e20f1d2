"""The end-of-run summary: what the evaluation did, how long it took, and where everything was written.

Built from metrics.jsonl (so a resumed run summarises its whole history), printed by rank 0 and saved as
`<output_dir>/summary.json`.
"""
from __future__ import annotations

import json
import os
from typing import Dict, List, Optional

from .logging import visualdl_command


def eval_key(rows: List[dict]) -> Optional[str]:
    """The headline evaluation metric present in the rows: eval/accuracy, else eval/reward (None: no eval)."""
    for key in ("eval/accuracy", "eval/reward"):
        if any(key in r for r in rows):
            return key
    return None


def run_summary(rows: List[dict], *, output_dir: str, logging_dir: str, checkpoint: Optional[str],
                wall_s: float, steps_this_run: int, last_step: int,
                cpu_s: Optional[Dict[str, Optional[float]]] = None) -> Dict:
    """A plain dict of the run: first, last and best evaluation (value and step), timings and paths (`samples`:
    rollouts.jsonl, None when the run wrote no sample completions). `cpu_s`: CPU seconds of each process of this
    run (the trainer, the rollout worker), reported as `busy`, its share of the wall time (1.0: one core all along;
    more with threads)."""
    samples = os.path.join(output_dir, "rollouts.jsonl")
    out: Dict = {"last_step": last_step, "steps_this_run": steps_this_run, "wall_s": round(wall_s, 1),
                 "metrics": os.path.join(output_dir, "metrics.jsonl"),
                 # sample completions are logged every few steps: a short run may have written none
                 "samples": samples if os.path.isfile(samples) else None,
                 "config": os.path.join(output_dir, "config.yaml"), "checkpoint": checkpoint,
                 "visualdl_logdir": logging_dir or None}
    if cpu_s:
        out["busy"] = {name: round(s / max(wall_s, 1e-9), 3) for name, s in cpu_s.items() if s is not None}
    key = eval_key(rows)
    if key is not None:
        evals = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), (int, float))]
        if evals:
            best = max(evals, key=lambda e: e[1])
            out["eval"] = {"metric": key, "first": evals[0][1], "first_step": evals[0][0], "last": evals[-1][1],
                           "last_step": evals[-1][0], "best": best[1], "best_step": best[0]}
    return out


def format_summary(s: Dict) -> str:
    """The summary as the lines printed at the end of a run."""
    minutes, seconds = divmod(int(round(s["wall_s"])), 60)
    lines = [f"done: step {s['last_step']} ({s['steps_this_run']} steps in this run, {minutes} min {seconds:02d} s)"]
    ev = s.get("eval")
    if ev:
        lines.append(f"  {ev['metric']}: {ev['first']:.3f} at step {ev['first_step']} -> {ev['last']:.3f} at step "
                     f"{ev['last_step']} ({100 * (ev['last'] - ev['first']):+.1f} points; best {ev['best']:.3f} at "
                     f"step {ev['best_step']})")
    if s.get("busy"):
        lines.append("  busy:       " + ", ".join(f"{name} {100 * share:.0f} %" for name, share in s["busy"].items())
                     + " of the wall time (CPU time / wall)")
    lines.append(f"  metrics:    {s['metrics']}")
    if s.get("samples"):
        lines.append(f"  samples:    {s['samples']}")
    if s.get("checkpoint"):
        lines.append(f"  checkpoint: {s['checkpoint']}")
    lines.append(f"  config:     {s['config']}")
    lines.append(f"  plot:       python tools/plot_metrics.py {s['metrics']} --metrics "
                 f"{ev['metric'] + ',' if ev else ''}train/reward --out {os.path.join(os.path.dirname(s['metrics']), 'plot.png')}")
    if s.get("visualdl_logdir"):
        lines.append(f"  VisualDL:   {visualdl_command(s['visualdl_logdir'])}   (then open http://127.0.0.1:8040)")
    return "\n".join(lines) + "\n"


def write_summary(s: Dict, output_dir: str) -> str:
    """Write `summary.json` into `output_dir`; returns its path."""
    path = os.path.join(output_dir, "summary.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(s, f, indent=1)
        f.write("\n")
    return path
