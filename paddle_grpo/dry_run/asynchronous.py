"""What an async_rollout run overlaps, with which weights and correction, and the threads of trainer and
worker."""
from __future__ import annotations

import os
from typing import Any, List, Tuple

from ..config import Config


def async_plan(cfg: Config, processes: int) -> Tuple[List[str], List[str]]:
    """(lines, problems) of `async_rollout` (docs/async.md): what overlaps and with which weights; more than one
    process is a problem (the rollout worker is not part of the ranks' process group)."""
    if not cfg.async_rollout:
        return [], []
    if processes > 1:
        return [], [f"key 'async_rollout' = True: this layout takes {processes} processes, and a rollout worker runs "
                    "beside one trainer process only (the collect phase's cross-rank steps need the ranks' process "
                    "group): set async_rollout false, or use one process"]
    lag = cfg.rollout_lag
    when = ("it waits for each update: the synchronous results, nothing overlaps" if lag == 0 else
            f"it runs up to {lag} step(s) ahead, so step t's rollout and rewards overlap the trainer's update on "
            f"step t-1's samples (staleness {lag} from step {lag + 1} on)")
    limit = (f"stops the run after {cfg.rollout_worker_timeout_s:g} s without samples"
             if cfg.rollout_worker_timeout_s else "waits for samples without a limit")
    reference_line = []
    if cfg.needs_reference_model:
        where = ("the worker, with the samples (rollout_worker_reference; the trainer loads no reference copy)"
                 if cfg.reference_in_rollout_worker else
                 "the trainer (" + ("sync_ref_model mixes its reference" if cfg.sync_ref_model else
                                    "rollout_worker_reference false") + ")")
        reference_line = [f"async rollout: the reference log-probs (the KL terms) are computed by {where}"]
    return [f"async rollout: {correction_line(cfg)}",
            f"async rollout: a rollout worker process samples step t with the weights after step t-{lag + 1} "
            f"(rollout_lag {lag}; before step 1: the initial weights) and scores the samples; {when}",
            f"async rollout: the trainer writes its {'LoRA adapters' if cfg.lora else 'trainable weights'} once per "
            f"step to a private directory (/dev/shm when present) that the worker reads, and {limit}; the worker "
            f"logs to {os.path.join(cfg.output_dir, 'rollout_worker.log')}", threads_line(cfg)] + reference_line, []


def correction_line(cfg: Any) -> str:
    """The rollout correction the run applies and why (Config.correction_mode: unset, clip with a lagged sampler)."""
    line = f"rollout_correction {cfg.correction_mode} ({cfg.correction_reason})"
    if cfg.correction_mode == "none" and cfg.rollout_lag > 0:
        line += (f": the samples are {cfg.rollout_lag} update(s) stale and uncorrected, which collapsed the "
                 "quickstart (docs/async.md)")
    return line


def threads_line(cfg: Any) -> str:
    """How many kernel threads the trainer and the rollout worker run, and whether they compete for the cores."""
    from ..kernels.numpy_kernels import threads
    from ..rollout.async_worker import oversubscribed

    trainer, cores = threads(), len(os.sched_getaffinity(0))
    worker = cfg.rollout_worker_threads or trainer
    how = ("rollout_worker_threads" if cfg.rollout_worker_threads else "the trainer's, rollout_worker_threads 0")
    verdict = ("they compete (a warning at start-up; docs/async.md)" if oversubscribed(trainer, worker, cores)
               else "they fit")
    return (f"async rollout: the trainer's kernels run {trainer} thread(s) (OMP_NUM_THREADS), the worker's {worker} "
            f"({how}), on {cores} usable core(s): {verdict}")
