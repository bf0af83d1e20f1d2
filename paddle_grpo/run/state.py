"""The trainer's state in a checkpoint: what it holds beyond the weights, writing it, and restoring it on resume.

run/checkpoint.py writes and reads the files; this module knows the trainer's parts (sampler, reward statistics,
schedule, counters, the optimizer's layout over ranks) and who writes what (parallel/storage.py).
"""
from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any, Dict, Optional

import paddle

from . import checkpoint as ckpt
from .. import step

if TYPE_CHECKING:
    from ..trainer import Trainer

logger = logging.getLogger("paddle_grpo.trainer")


def trainer_state(t: Trainer) -> Dict[str, Any]:
    """trainer_state.json's part beyond the step: data position, running reward statistics, schedule, counters,
    the adaptive entropy coefficient."""
    counters = t.learner.state
    return {"sampler": t.sampler.state_dict(),
            "normalizer": t.normalizer.state_dict() if t.normalizer is not None else None,
            "scheduler": t.learner.scheduler.state_dict(), "nonfinite_total": counters.nonfinite_total,
            "nonfinite_in_a_row": counters.nonfinite_in_a_row, "optimizer_steps": counters.optimizer_steps,
            "entropy_coeff": counters.entropy_coeff, "entropy_applied": counters.entropy_applied,
            "loss_scale": t.learner.amp_state(),
            **({"rollout": t.batches.state_dict()} if t.batches.state_dict() is not None else {}),
            **({"critic": t.critic_learner.state_dict()} if t.critic_learner is not None else {})}


def save(t: Trainer, unlogged: Optional[Dict[str, Any]] = None, solo: bool = False) -> None:
    """Every rank calls this: rank 0 writes (with save_on_each_node on storage that is not shared, each node's
    local rank 0); under tensor parallelism the shards of data-parallel rank 0's group are merged (a collective);
    each part of the optimizer state (per pipeline stage, TP rank and sharding rank) is written by one of the ranks
    that hold it. `solo`: rank 0 alone, without any collective (after a fault, under data parallelism only, where
    rank 0 holds the whole state). `unlogged`: the step's metrics and samples a fault left unwritten (run/faults.py),
    written first by the resumed run."""
    cfg, par = t.cfg, t.par
    if solo and not par.is_main:
        return
    full = not cfg.ignore_save_lr_and_optim
    shard, saves = par.optimizer_shard()
    state = {**trainer_state(t), **({"unlogged": unlogged} if unlogged is not None else {})}
    writer = par.is_main if solo else t.storage.writer
    path = ckpt.save_checkpoint(
        cfg.output_dir, t.step, t.policy.model, t.tokenizer, trainer_state=state, optimizer=t.learner.optimizer,
        full=full, total_limit=cfg.save_total_limit,
        reference=t.reference.model if (t.reference is not None and cfg.sync_ref_model and full) else None,
        writer=writer, participant=writer or par.dp_rank == 0, tp_world=par.tp_world, pp_world=par.pp_world,
        optimizer_shard=shard, saves_optimizer=saves or writer, optimizer_model=optimizer_model(t),
        sync=(lambda: None) if solo else par.barrier,
        extra=lambda tmp: save_extra(t, tmp, writer, saves or writer, full))
    t.last_checkpoint = path
    if writer:  # one line per copy written: once per shared file system
        logger.info("saved %s", path)


def save_extra(t: Trainer, directory: str, writer: bool, saves_optimizer: bool, full: bool) -> None:
    """The checkpoint's parts beyond the policy: the critic's (save_critic) and, with async_rollout, the weight
    versions the pending steps sample from (step/async_rollout.py; written by rank 0, the only rank such a run has)."""
    if t.critic_learner is not None:
        save_critic(t, directory, writer, saves_optimizer, full)
    if writer:
        t.batches.save(directory, t.step)


def save_critic(t: Trainer, directory: str, writer: bool, saves_optimizer: bool, full: bool) -> None:
    """The critic's part of checkpoint `directory` (checkpoint.CRITIC_DIR): its weights as a critic checkpoint
    (Critic.save; the tensor-parallel shards merged, a collective of data-parallel rank 0's TP group, as for the
    policy) and this rank's part of its optimizer state (as the policy's)."""
    learner, par = t.critic_learner, t.par
    out = os.path.join(directory, ckpt.CRITIC_DIR)
    if writer or saves_optimizer:
        os.makedirs(out, exist_ok=True)
    if (writer or par.dp_rank == 0) and (writer or par.tp_world > 1):
        merge = {"merge_tensor_parallel": True} if par.tp_world > 1 else {}
        learner.critic.save(out, is_main_process=writer, **merge)
    if full and saves_optimizer:
        ckpt.save_optimizer(out, learner.optimizer, learner.critic.model, par.optimizer_shard()[0])


def restore_critic(t: Trainer, path: str, state: Dict[str, Any]) -> None:
    """Load the critic's weights, optimizer state, schedule and counters of checkpoint `path` (save_critic)."""
    learner = t.critic_learner
    directory = os.path.join(path, ckpt.CRITIC_DIR)
    if "critic" not in state or not os.path.isdir(directory):
        raise FileNotFoundError(f"{path} holds no critic ({ckpt.CRITIC_DIR}/ and trainer_state.json's 'critic'): it "
                                f"was saved by a run without one; rl_algorithm {t.cfg.rl_algorithm!r} cannot resume "
                                "from it (start a new run from its weights instead)")
    learner.critic.load_weights(directory, **t.par.model_load_kwargs())  # in place: the optimizer's parameters
    ckpt.load_optimizer(directory, t.par.inner_optimizer(learner.optimizer), learner.critic.model,
                        t.par.optimizer_shard()[0])
    learner.set_state_dict(state["critic"])


def optimizer_model(t: Trainer) -> paddle.nn.Layer:
    """The layers the optimizer trains: under pipeline parallelism this stage's pipeline layers (its optimizer
    state is keyed by their names; the model itself is saved from the synchronised full copy)."""
    pipeline = t.learner.pipeline
    return pipeline.layers if pipeline is not None else t.policy.model


def restore(t: Trainer, path: str) -> None:
    """Load checkpoint `path` into the trainer: weights (and the reference's, when saved), optimizer, generators,
    schedule, data position, reward statistics, counters, step, and the metrics a fault left unwritten."""
    state = ckpt.load_trainer_state(path)
    shard = t.par.model_load_kwargs()
    ckpt.load_weights(t.policy.model, path, **shard)
    if t.reference is not None and os.path.isdir(os.path.join(path, ckpt.REFERENCE_DIR)):
        ckpt.load_weights(t.reference.model, os.path.join(path, ckpt.REFERENCE_DIR), **shard)
    if t.learner.pipeline is not None:
        t.learner.pipeline.load_from(t.policy.model)
    if t.critic_learner is not None:  # before the generators are restored: building a model draws from them
        restore_critic(t, path, state)
    ckpt.load_optimizer_and_rng(path, t.par.inner_optimizer(t.learner.optimizer), optimizer_model(t),
                                shard=t.par.optimizer_shard()[0])
    t.learner.scheduler.set_state_dict(state["scheduler"])
    t.sampler.set_state_dict(state["sampler"])
    if t.normalizer is not None and state.get("normalizer"):
        t.normalizer.set_state_dict(state["normalizer"])
    # the adaptive entropy coefficient (entropy_target): absent from older checkpoints, which had none
    t.learner.state = step.UpdateState(state["optimizer_steps"], state["nonfinite_total"],
                                       state["nonfinite_in_a_row"], state.get("entropy_coeff"),
                                       state.get("entropy_applied"))
    t.learner.load_amp_state(state.get("loss_scale"))
    t.step = state["step"]
    t.batches.restore(path, state, t.step)  # async_rollout: the lagged weights the next steps sample from
    t.unlogged = state.get("unlogged")  # a fault stopped the run before this step was logged: log it first
    logger.info("resumed from %s at step %d", path, t.step)
