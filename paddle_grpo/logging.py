"""Where metrics go: `<output_dir>/metrics.jsonl`, VisualDL (`report_to: visualdl`), progress, rollout samples,
the evaluation's per-problem results (`eval_per_problem.jsonl`).

Progress: a tqdm bar on a terminal; when stderr is not a terminal (a log file, a pipe, a job scheduler), plain lines
instead (`PlainProgress`), since a bar's carriage-return updates all land on one line of a file.

Only rank 0 writes; other ranks get a logger whose methods do nothing. Each step appends exactly one JSON object per
line to metrics.jsonl (`{"step": N, "train/reward": ...}`), so a crashed run keeps every finished step.
"""
from __future__ import annotations

import hashlib
import json
import logging as _pylogging
import math
import os
import shlex
import sys
import time
from typing import Any, Callable, Mapping, Optional

logger = _pylogging.getLogger("paddle_grpo")

EVAL_PROBLEMS_FILE = "eval_per_problem.jsonl"  # an evaluation's results per problem (step/evaluation.py)


class MetricsLogger:
    def __init__(self, output_dir: str, logging_dir: Optional[str] = None, report_to: str = "visualdl",
                 run_name: str = "", disable_tqdm: bool = False, total_steps: Optional[int] = None,
                 initial_step: int = 0, enabled: bool = True):
        self.enabled = enabled
        self.writer = None
        self.bar = None
        if not enabled:
            return
        os.makedirs(output_dir, exist_ok=True)
        self.metrics_path = os.path.join(output_dir, "metrics.jsonl")
        self.samples_path = os.path.join(output_dir, "rollouts.jsonl")
        self.eval_problems_path = os.path.join(output_dir, EVAL_PROBLEMS_FILE)
        if report_to != "none" and logging_dir:  # wandb/tensorboard: VisualDL stands in
            from visualdl import LogWriter

            # One record file per output_dir, rewritten at every start from metrics.jsonl and rollouts.jsonl (which
            # a resume has cut back to the checkpoint's step): VisualDL then shows one history, as metrics.jsonl.
            vdl_dir = os.path.join(logging_dir, run_name) if run_name else logging_dir
            record = record_path(vdl_dir, output_dir)
            if os.path.exists(record):  # LogWriter would append to it
                os.remove(record)
            self.writer = LogWriter(logdir=os.path.dirname(record), file_name=os.path.basename(record))
            self._replay()
            logger.info("VisualDL logs in %s; to view them: %s", logging_dir, visualdl_command(logging_dir))
        if not disable_tqdm and not sys.stderr.isatty():
            self.bar = PlainProgress(total_steps, initial_step)
        elif not disable_tqdm:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total_steps, initial=initial_step, desc="train", unit="step", dynamic_ncols=True)

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Append one line to metrics.jsonl and send every scalar to VisualDL under its slash name."""
        if not self.enabled:
            return
        record = {"step": int(step)}
        record.update({k: _plain(v) for k, v in sorted(metrics.items())})
        with open(self.metrics_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
        if self.writer is not None:
            self._send_scalars(step, record)

    def advance(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Move the progress bar to `step`, showing reward and step time."""
        if self.bar is None:
            return
        shown = {k.split("/")[-1]: f"{metrics[k]:.3g}" for k in ("train/reward", "perf/step_s", "eval/accuracy")
                 if k in metrics}
        if isinstance(self.bar, PlainProgress):
            self.bar.update_to(step, shown)
            return
        self.bar.set_postfix(shown, refresh=False)
        self.bar.update(step - self.bar.n)

    def log_samples(self, step: int, rows: list, tag: str = "rollout") -> None:
        """Sample completions (dicts with prompt, completion, reward, scores, length): one JSON line each in
        rollouts.jsonl, and one VisualDL text card each, `samples/<tag>/<i>` (VisualDL shows one card per tag, with
        that tag's text at every logged step)."""
        if not self.enabled or not rows:
            return
        with open(self.samples_path, "a", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps({"step": int(step), "kind": tag, **{k: _plain(v) for k, v in row.items()}},
                                   ensure_ascii=False) + "\n")
        if self.writer is not None:
            for i, row in enumerate(rows):
                self.writer.add_text(tag=f"samples/{tag}/{i}", text_string=format_sample(row), step=int(step))

    def log_eval_problems(self, step: int, rows: list) -> None:
        """An evaluation's per-problem results (dicts: index, scores, answers, correct): one JSON line each in
        eval_per_problem.jsonl, with the step."""
        if not self.enabled or not rows:
            return
        with open(self.eval_problems_path, "a", encoding="utf-8") as f:
            f.writelines(json.dumps({"step": int(step), **row}, ensure_ascii=False) + "\n" for row in rows)

    def _replay(self) -> None:
        """Send the rows already in metrics.jsonl and rollouts.jsonl (a resumed run's history) to VisualDL."""
        from .data import read_json_rows

        for row in read_json_rows(self.metrics_path):
            self._send_scalars(row["step"], row)
        index = {}
        for row in read_json_rows(self.samples_path):  # cards numbered within each (step, kind), as log_samples did
            key = (row["step"], row["kind"])
            i = index[key] = index.get(key, -1) + 1
            self.writer.add_text(tag=f"samples/{row['kind']}/{i}", text_string=format_sample(row),
                                 step=int(row["step"]))

    def _send_scalars(self, step: int, record: dict) -> None:
        for key, value in record.items():
            if key != "step" and isinstance(value, (int, float)) and math.isfinite(value):
                self.writer.add_scalar(tag=key, value=value, step=int(step))

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        if self.writer is not None:
            self.writer.close()


class PlainProgress:
    """Progress as whole lines on stderr, for output that is not a terminal: a line every `every` steps (default:
    about 30 lines per run), at least one a minute, and at the last step.

        train: step 30/300 (10%), 0:00:45 elapsed, about 0:06:45 left: reward 0.512, step_s 1.73, accuracy 0.502
    """

    def __init__(self, total: Optional[int], initial: int = 0, every: Optional[int] = None,
                 min_interval_s: float = 60.0, clock: Callable[[], float] = time.monotonic):
        self.total, self.n, self.first = total, initial, initial
        self.every = every or max(1, (total or 0) // 30)
        self.min_interval_s, self.clock = min_interval_s, clock
        self.t0 = self.last = clock()

    def update_to(self, step: int, shown: Mapping[str, str]) -> None:
        self.n = step
        now = self.clock()
        if step % self.every and step != self.total and now - self.last < self.min_interval_s:
            return
        self.last = now
        elapsed = now - self.t0
        line = f"train: step {step}"
        if self.total:
            line += f"/{self.total} ({100 * step // self.total}%)"
        line += f", {_clock(elapsed)} elapsed"
        if self.total and step > self.first and step < self.total:
            line += f", about {_clock(elapsed / (step - self.first) * (self.total - step))} left"
        if shown:
            line += ": " + ", ".join(f"{k} {v}" for k, v in shown.items())
        print(line, file=sys.stderr, flush=True)

    def close(self) -> None:
        pass


def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def record_path(vdl_dir: str, output_dir: str) -> str:
    """Where the run in `output_dir` writes its VisualDL record under `vdl_dir`: `vdl_dir/<record_file_name>`,
    unless `vdl_dir` already holds another run's record. VisualDL shows one record per directory (the last by name,
    `LogReader.logs`), so two runs' records side by side would hide one of them: the run then writes into its own
    subfolder `vdl_dir/<output_dir's name>-<hash>/` (VisualDL shows each folder as a run) and says so. A run that
    wrote there before (a resume) finds its record again, in either place."""
    name = record_file_name(output_dir)
    own_folder = os.path.join(vdl_dir, name[len("vdlrecords."):-len(".log")])
    if os.path.exists(os.path.join(vdl_dir, name)):
        return os.path.join(vdl_dir, name)
    if os.path.exists(os.path.join(own_folder, name)):
        return os.path.join(own_folder, name)
    others = sorted(f for f in os.listdir(vdl_dir) if "vdlrecords" in f) if os.path.isdir(vdl_dir) else []
    if not others:
        return os.path.join(vdl_dir, name)
    logger.warning("logging_dir %s already holds another run's VisualDL record (%s), and VisualDL shows one record "
                   "per folder: this run's record goes to %s, which VisualDL shows as a run of its own (`%s` shows "
                   "both)", vdl_dir, others[0], own_folder, visualdl_command(vdl_dir))
    return os.path.join(own_folder, name)


def record_file_name(output_dir: str) -> str:
    """The VisualDL record file of the run in `output_dir` (VisualDL reads files named `vdlrecords.*`), named after
    output_dir, so that a run finds its own record again (record_path)."""
    path = os.path.abspath(output_dir)
    digest = hashlib.sha1(path.encode("utf-8")).hexdigest()[:8]
    return f"vdlrecords.{os.path.basename(path) or 'run'}-{digest}.log"


def visualdl_command(logdir: str) -> str:
    """The command that serves `logdir` in VisualDL.

    `--language en` because VisualDL (every release from 2.0.5 to 2.5.3, the newest) answers HTTP 500 to a
    request whose Accept-Language matches neither English nor Chinese (curl, a French browser): it sets its
    language cookie to None, which every Werkzeug refuses. No version pin avoids that; the flag does.
    """
    return f"visualdl --logdir {shlex.quote(str(logdir))} --language en"


def format_sample(row: dict) -> str:
    """One sample as plain text: reward with each function's score, prompt, completion; a multi-turn sample (with
    `turns`) shows each turn instead of the completion (assistant turns with their tool calls, tool results with
    their errors) and then the final answer the rewards scored.

    VisualDL's text page shows plain text (no markdown) and folds line breaks into spaces, so every part carries
    a label rather than relying on layout; `=` because reward names may contain colons (`module:function`).
    """
    scores = row.get("scores") or {}
    breakdown = f" ({', '.join(f'{name} = {_number(v)}' for name, v in scores.items())})" if scores else ""
    head = f"reward: {_number(row.get('reward'))}{breakdown}\nprompt: {row.get('prompt', '')}\n"
    if row.get("turns") is None:
        return head + f"completion: {row.get('completion', '')}"
    return head + "".join(f"{format_turn(m, k)}\n" for k, m in enumerate(row["turns"], 1)) + \
        f"answer: {row.get('completion', '')}"


def format_turn(message: dict, k: int) -> str:
    """Turn `k` of a multi-turn sample as one labelled line: `turn k assistant: text | call name(arguments)` or
    `turn k tool name: result` (with ` | error: kind` when the call failed)."""
    role = message.get("role", "?")
    if role == "tool":
        error = f" | error: {message['error']}" if message.get("error") else ""
        return f"turn {k} tool {message.get('name', '?')}: {message.get('content', '')}{error}"
    calls = "".join(f" | call {c.get('name', '?')}({json.dumps(c.get('arguments'), ensure_ascii=False)})"
                    for c in message.get("tool_calls") or [])
    return f"turn {k} {role}: {message.get('content', '')}{calls}"


def _number(v):
    return "None" if v is None else f"{float(v):.4g}"


def _plain(v):
    """JSON-able python value (numpy scalars, paddle 0-d tensors, non-finite floats as strings)."""
    if hasattr(v, "item") and not isinstance(v, (list, dict, str)):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return v
