"""Where checkpoints go when the ranks run on several nodes, decided once the process groups exist.

- output_dir on one file system that every rank sees (checked: rank 0 writes a marker file, every rank looks for
  it): checkpoints are written once, by global rank 0 (and the ranks that hold parts of the state), whatever
  `save_on_each_node` says;
- output_dir on each node's own disk: with `save_on_each_node: true` (PaddleNLP's key) each node's local rank 0
  writes every checkpoint to its disk, which takes a layout where every rank holds the whole state (data
  parallelism only); without it the run is refused at start-up, since checkpoints written on node 0 alone could
  not be resumed by the other nodes.
- on resume every rank must load the same step: `agree_on_resume` picks the latest checkpoint every rank has (a
  node may lack the newest, e.g. when a fault let rank 0 save alone) and refuses when there is none.
"""
from __future__ import annotations

import logging
import os
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..config import ConfigError
from . import collectives
from .startup import local_rank

if TYPE_CHECKING:
    from .context import ParallelContext

logger = logging.getLogger("paddle_grpo.parallel")

# NFS may cache a directory's listing for several seconds (attribute caching): a rank that does not see the marker
# at once looks again for this long before concluding that output_dir is not shared.
MARKER_WAIT_S = 10.0


@dataclass(frozen=True)
class Storage:
    """`shared`: every rank sees rank 0's files in output_dir; `each_node`: each node's local rank 0 writes the
    checkpoints (save_on_each_node on storage that is not shared); `writer`: this rank writes checkpoint files."""
    shared: bool = True
    each_node: bool = False
    writer: bool = True


def plan_storage(par: ParallelContext, output_dir: str, save_on_each_node: bool) -> Storage:
    """Every rank calls this (collectives over the world). Raises ConfigError when checkpoints could not be
    resumed: output_dir not shared without save_on_each_node, or save_on_each_node with a layout that splits the
    state over ranks."""
    if par.world_size == 1:
        return Storage()
    shared = output_dir_is_shared(par, output_dir)
    if shared:
        if save_on_each_node and par.is_main:
            logger.warning("save_on_each_node: true has no effect: %s is one file system shared by every rank, so "
                           "checkpoints are written there once", output_dir)
        return Storage(shared=True, each_node=False, writer=par.is_main)
    if not save_on_each_node:
        raise ConfigError(f"output_dir {output_dir} is not on a file system shared by every node (rank 0's files "
                          "are not visible on every rank): checkpoints written by rank 0 could not be resumed on "
                          "the other nodes. Put output_dir on a shared file system, or set save_on_each_node: true "
                          "(data parallelism only) to write every checkpoint on each node")
    if par.tp_world > 1 or par.pp_world > 1 or par.sharding_world > 1:
        raise ConfigError("save_on_each_node: true needs every rank to hold the whole model and optimizer state "
                          "(data parallelism only); with tensor_parallel_degree, pipeline_parallel_degree or "
                          "sharding put output_dir on a file system shared by every node instead")
    return Storage(shared=False, each_node=True, writer=local_rank() == 0)


def output_dir_is_shared(par: ParallelContext, output_dir: str, wait_s: float = MARKER_WAIT_S) -> bool:
    """True when every rank sees a file rank 0 just wrote into `output_dir` (collective)."""
    token = par.broadcast_object(uuid.uuid4().hex if par.is_main else None)
    marker = os.path.join(output_dir, f".shared-check-{token}")
    if par.is_main:
        os.makedirs(output_dir, exist_ok=True)
        with open(marker, "w", encoding="utf-8"):
            pass
    par.barrier()
    deadline = time.monotonic() + wait_s
    seen = os.path.exists(marker)
    while not seen and time.monotonic() < deadline:
        time.sleep(0.5)
        seen = os.path.exists(marker)
    shared = par.all_true(seen)
    if par.is_main:
        os.remove(marker)
    return shared


def agree_on_resume(par: ParallelContext, planned: int | None, available: list[int], explicit: bool) -> int | None:
    """The checkpoint step every rank resumes from (None: every rank starts at step 0), from each rank's `planned`
    step (its own file system's decision) and the complete checkpoint steps it has (`choose_resume_step`)."""
    if par.world_size == 1:
        return planned
    step, warning = choose_resume_step(collectives.gather_objects((planned, sorted(available))), explicit)
    if warning and par.is_main:
        logger.warning("%s", warning)
    return step


def choose_resume_step(views: list[tuple[int | None, list[int]]], explicit: bool) -> tuple[int | None, str]:
    """(step, warning) from every rank's (planned step, complete checkpoint steps), in rank order. The ranks agree:
    their plan. They differ and resume_from_checkpoint was not given: the latest step every rank has (a rank may
    lack the newest, e.g. when a fault let rank 0 save alone), with a warning. Raises ConfigError when the ranks
    cannot start from one state (an explicit checkpoint some rank lacks, or no checkpoint common to all)."""
    plans = {plan for plan, _ in views}
    if len(plans) == 1:
        return views[0][0], ""
    described = "; ".join(f"rank {r}: " + (f"checkpoint-{p}" if p is not None else "no checkpoint")
                          for r, (p, _) in enumerate(views))
    common = set.intersection(*(set(steps) for _, steps in views))
    if explicit or not common:
        raise ConfigError(f"the ranks do not see the same checkpoint to resume from ({described}): every node "
                          "needs the same checkpoint in output_dir (a shared file system, or save_on_each_node); "
                          "copy it to the node that lacks it, or set overwrite_output_dir: true to start over")
    step = max(common)
    return step, (f"the ranks' latest checkpoints differ ({described}): resuming from checkpoint-{step}, the "
                  "latest that every rank has")
