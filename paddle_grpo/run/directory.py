"""What a run does with an `output_dir` that already holds a run: resume it, start over, or refuse.

PaddleNLP's (and Hugging Face's) rule: when `output_dir` has a checkpoint and `resume_from_checkpoint` is not set,
the run resumes from the latest one; `overwrite_output_dir: true` trains from scratch instead. A directory with a
previous run's files but no checkpoint to resume from is refused, naming `overwrite_output_dir`, so that
metrics.jsonl never holds two histories and no checkpoint is replaced without the user asking for it.

A run stopped before its first checkpoint (killed, or failed in its first step) left files but nothing to resume:
when its config.yaml equals this run's configuration and it did not finish (no summary.json), the same command
starts it again from step 0, deleting those files, instead of refusing.

On resume from step S, the rows of metrics.jsonl, rollouts.jsonl and eval_per_problem.jsonl after S (steps the resumed run computes again)
are dropped, so every step is in them once, with the values of the run that computed it last (the same values:
the run is deterministic). A checkpoint that a fault saved before its step was logged (`unlogged` in its
trainer_state.json, run/faults.py) also drops step S's rows: the resumed run writes them first. A last line cut short
(a process killed, or a disk full, in the middle of writing it) is dropped; a broken line elsewhere is an error
naming the file and line. The VisualDL record is rebuilt from metrics.jsonl (`logging.MetricsLogger`).
"""
from __future__ import annotations

import glob
import json
import logging
import os
import shutil
from dataclasses import dataclass, field
from typing import Any, List, Optional, Union

import yaml

from . import checkpoint as ckpt
from ..config import ConfigError

logger = logging.getLogger("paddle_grpo.run.directory")

# Files a run writes at the top of output_dir (besides checkpoint-<step>/ directories).
RUN_FILES = ("metrics.jsonl", "rollouts.jsonl", "eval_per_problem.jsonl", "config.yaml", "summary.json")
STEP_FILES = ("metrics.jsonl", "rollouts.jsonl", "eval_per_problem.jsonl")  # JSON objects, each with a "step"


@dataclass
class RunDirPlan:
    """`resume`: checkpoint to resume from (None: start at step 0); `remove`: the previous run's files and
    directories to delete first (only with `overwrite_output_dir`); `reason`: one line for the log."""
    resume: Optional[str] = None
    remove: List[str] = field(default_factory=list)
    reason: str = ""


def previous_run(output_dir: str) -> List[str]:
    """Paths in `output_dir` that a previous run of this trainer wrote (files, checkpoints, partial checkpoints)."""
    found = [os.path.join(output_dir, name) for name in RUN_FILES if os.path.exists(os.path.join(output_dir, name))]
    found += ckpt.list_checkpoints(output_dir)
    found += sorted(glob.glob(os.path.join(output_dir, ".tmp-checkpoint-*")))
    return found


def plan(output_dir: str, resume_from_checkpoint: Optional[Union[bool, str]], overwrite_output_dir: bool,
         config_text: Optional[str] = None) -> RunDirPlan:
    """Decide from the file system alone (every rank decides the same; `agree` then checks that they did). Raises
    ConfigError when `output_dir` holds a run that can neither be resumed nor, without `overwrite_output_dir`,
    replaced. `config_text`: this run's configuration (Config.format()), to recognise the same run stopped before
    its first checkpoint."""
    explicit = resume_from_checkpoint not in (None, False, "")
    if explicit:
        path = ckpt.resolve_resume_path(resume_from_checkpoint, output_dir)
        return RunDirPlan(resume=path, reason=f"resuming from {path} (resume_from_checkpoint)")
    existing = previous_run(output_dir)
    if overwrite_output_dir:
        return RunDirPlan(remove=existing, reason=(
            f"overwrite_output_dir: deleting the previous run in {output_dir} ({_names(existing)})" if existing
            else ""))
    latest = ckpt.latest_checkpoint(output_dir)
    if latest is not None and resume_from_checkpoint is None:
        try:
            ckpt.load_trainer_state(latest)  # refuses a model-only checkpoint
        except ValueError:
            raise ConfigError(
                f"output_dir {output_dir} holds a run whose latest checkpoint {latest} was saved with "
                "ignore_save_lr_and_optim: true, so it cannot be resumed; set overwrite_output_dir: true to delete "
                "the run and start over, or choose another output_dir") from None
        return RunDirPlan(resume=latest, reason=(
            f"{output_dir} holds a run: resuming from {latest} (set overwrite_output_dir: true to start over, or "
            "choose another output_dir)"))
    if existing and resume_from_checkpoint is None and _same_run_unfinished(output_dir, config_text):
        return RunDirPlan(remove=existing, reason=(
            f"{output_dir} holds this run (the same config.yaml), stopped before its first checkpoint: starting it "
            f"again from step 0 ({_names(existing)} replaced)"))
    if existing:
        why = ("resume_from_checkpoint is false" if resume_from_checkpoint is False
               else "it has no checkpoint to resume from")
        raise ConfigError(
            f"output_dir {output_dir} already holds a run ({_names(existing)}) and {why}; set "
            "overwrite_output_dir: true (or --overwrite_output_dir true) to delete it and start over, or choose "
            "another output_dir")
    return RunDirPlan()


def _same_run_unfinished(output_dir: str, config_text: Optional[str]) -> bool:
    """True when output_dir's config.yaml holds `config_text`'s values and the run there wrote no summary.json
    (which a run writes when it ends)."""
    path = os.path.join(output_dir, "config.yaml")
    if config_text is None or not os.path.isfile(path) or os.path.exists(os.path.join(output_dir, "summary.json")):
        return False
    try:
        with open(path, encoding="utf-8") as f:
            return yaml.safe_load(f) == yaml.safe_load(config_text)
    except (OSError, yaml.YAMLError):  # cut short by a kill: not recognisably the same run
        return False


def agree(par: Any, p: RunDirPlan, output_dir: str, resume_from_checkpoint: Optional[Union[bool, str]]
          ) -> RunDirPlan:
    """Every rank calls this once the process groups exist: all resume the same step, the latest checkpoint every
    rank sees (parallel.agree_on_resume); `p` itself when they agree already."""
    from ..parallel import agree_on_resume

    mine = ckpt.step_of(p.resume) if p.resume else None
    steps = [ckpt.step_of(path) for path in ckpt.list_checkpoints(output_dir)]
    step = agree_on_resume(par, mine, steps, resume_from_checkpoint not in (None, False, ""))
    if step is None or step == mine:
        return p
    return RunDirPlan(resume=os.path.join(output_dir, f"checkpoint-{step}"), remove=p.remove,
                      reason=f"resuming from checkpoint-{step}, the latest checkpoint every rank sees")


def apply(p: RunDirPlan, output_dir: str) -> None:
    """Rank 0 only: delete what `p.remove` lists; on resume, drop the metric and sample rows after the
    checkpoint's step (from its step on when the checkpoint carries the step's unlogged metrics)."""
    for path in p.remove:
        if os.path.isdir(path):
            shutil.rmtree(path)
        elif os.path.exists(path):
            os.remove(path)
    if p.resume is not None:
        state = ckpt.load_trainer_state(p.resume)
        step = state["step"] - (1 if state.get("unlogged") else 0)
        for name in STEP_FILES:
            dropped = truncate_after(os.path.join(output_dir, name), step)
            if dropped:
                logger.info("%s: dropped %d rows after step %d (the resumed run writes them again)", name,
                            dropped, step)


def truncate_after(path: str, step: int) -> int:
    """Keep the lines of a JSONL file whose "step" is at most `step` (rewritten atomically); returns how many
    were dropped, a last line cut short included. A missing file is left missing; a broken line before the last
    raises ValueError naming the file and line."""
    if not os.path.exists(path):
        return 0
    with open(path, encoding="utf-8") as f:
        lines = [line for line in f if line.strip()]
    kept = []
    for number, line in enumerate(lines, 1):
        try:
            row = json.loads(line)
        except ValueError:
            if number < len(lines):
                raise ValueError(f"{path}:{number}: not a JSON object ({line[:80]!r}); the file is damaged") from None
            logger.warning("%s: dropping its last line, cut short (%d characters, no end)", path, len(line))
            continue
        if row.get("step", 0) <= step:
            kept.append(line)
    if len(kept) == len(lines) and (not lines or lines[-1].endswith("\n")):
        return 0
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.writelines(line if line.endswith("\n") else line + "\n" for line in kept)
    os.replace(tmp, path)
    return len(lines) - len(kept)


def _names(paths: List[str]) -> str:
    names = [os.path.basename(p) for p in paths]
    return ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
