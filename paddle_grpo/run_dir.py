"""What a run does with an `output_dir` that already holds a run: resume it, start over, or refuse.

PaddleNLP's (and Hugging Face's) rule: when `output_dir` has a checkpoint and `resume_from_checkpoint` is not set,
the run resumes from the latest one; `overwrite_output_dir: true` trains from scratch instead. A directory with a
previous run's files but no checkpoint to resume from is refused, naming `overwrite_output_dir`, so that
metrics.jsonl never holds two histories and no checkpoint is replaced without the user asking for it.

On resume from step S, the rows of metrics.jsonl and rollouts.jsonl after S (steps the resumed run computes again)
are dropped; the VisualDL record is rebuilt from metrics.jsonl (`logging.MetricsLogger`).
"""
from __future__ import annotations

import glob
import json
import logging
import os
import shutil
from dataclasses import dataclass, field
from typing import List, Optional, Union

from . import checkpoint as ckpt
from .config import ConfigError

logger = logging.getLogger("paddle_grpo.run_dir")

# Files a run writes at the top of output_dir (besides checkpoint-<step>/ directories).
RUN_FILES = ("metrics.jsonl", "rollouts.jsonl", "config.yaml", "summary.json")
STEP_FILES = ("metrics.jsonl", "rollouts.jsonl")  # one JSON object per line with a "step"


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


def plan(output_dir: str, resume_from_checkpoint: Optional[Union[bool, str]], overwrite_output_dir: bool
         ) -> RunDirPlan:
    """Decide from the file system alone (every rank decides the same). Raises ConfigError when `output_dir`
    holds a run that can neither be resumed nor, without `overwrite_output_dir`, replaced."""
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
    if existing:
        why = ("resume_from_checkpoint is false" if resume_from_checkpoint is False
               else "it has no checkpoint to resume from")
        raise ConfigError(
            f"output_dir {output_dir} already holds a run ({_names(existing)}) and {why}; set "
            "overwrite_output_dir: true (or --overwrite_output_dir true) to delete it and start over, or choose "
            "another output_dir")
    return RunDirPlan()


def apply(p: RunDirPlan, output_dir: str) -> None:
    """Rank 0 only: delete what `p.remove` lists; on resume, drop the metric and sample rows after the
    checkpoint's step."""
    for path in p.remove:
        if os.path.isdir(path):
            shutil.rmtree(path)
        elif os.path.exists(path):
            os.remove(path)
    if p.resume is not None:
        step = ckpt.load_trainer_state(p.resume)["step"]
        for name in STEP_FILES:
            dropped = truncate_after(os.path.join(output_dir, name), step)
            if dropped:
                logger.info("%s: dropped %d rows after step %d (the resumed run writes them again)", name,
                            dropped, step)


def truncate_after(path: str, step: int) -> int:
    """Keep the lines of a JSONL file whose "step" is at most `step` (rewritten atomically); returns how many
    were dropped. A missing file is left missing."""
    if not os.path.exists(path):
        return 0
    with open(path, encoding="utf-8") as f:
        lines = [line for line in f if line.strip()]
    kept = [line for line in lines if json.loads(line).get("step", 0) <= step]
    if len(kept) == len(lines):
        return 0
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.writelines(line if line.endswith("\n") else line + "\n" for line in kept)
    os.replace(tmp, path)
    return len(lines) - len(kept)


def _names(paths: List[str]) -> str:
    names = [os.path.basename(p) for p in paths]
    return ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
