"""The critic of PPO / VAPO (estimators whose spec says `needs_values`): built beside the policy, and its update
over the policy's mini-batches and micro-batches (docs/algorithms.md section 7 lists its metrics).

The value loss is PaddleNLP's `RLHFValueLoss` (algorithms.value_loss) with the mini-batch's global token count, so,
as for the policy, the loss and gradient do not depend on how the mini-batch is split into micro-batches and ranks.
The gradient goes through the policy's `apply_gradients`: summed over the data-parallel ranks, clipped at
max_grad_norm by the norm over every axis that splits the critic, one step of the critic's own AdamW.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Optional

import numpy as np
import paddle

from ..algorithms import global_denominators, lr_lambda, value_loss
from ..parallel import ParallelContext
from ..policy import Critic, load_critic, parameters_by_decay
from .batch import Batch, model_precision, plan_micro_batches
from .metrics import CriticMetrics
from .policy_update import UpdateState, apply_gradients


@dataclass
class CriticLearner:
    """What the critic's update trains: the critic, its optimizer and schedule, the counters (kept in checkpoints),
    `par` the parallel context whose gradient collectives follow the critic's optimizer (ParallelContext.
    for_optimizer: under sharding its own partition), `amp` its precision.Amp (own fp16 loss scale) or None."""
    critic: Critic
    optimizer: Any
    scheduler: Any
    par: ParallelContext
    state: UpdateState = field(default_factory=UpdateState)
    amp: Any = None

    def state_dict(self) -> Dict[str, Any]:
        """trainer_state.json's "critic" part: schedule, counters and loss scale (the weights and the optimizer
        state are files of the checkpoint: run/state.py)."""
        return {"scheduler": self.scheduler.state_dict(), "optimizer_steps": self.state.optimizer_steps,
                "nonfinite_total": self.state.nonfinite_total, "nonfinite_in_a_row": self.state.nonfinite_in_a_row,
                "loss_scale": self.amp.state_dict() if self.amp else None}

    def set_state_dict(self, state: Dict[str, Any]) -> None:
        self.scheduler.set_state_dict(state["scheduler"])
        self.state = UpdateState(state["optimizer_steps"], state["nonfinite_total"], state["nonfinite_in_a_row"])
        if self.amp:
            self.amp.load_state_dict(state.get("loss_scale"))


def build_critic_learner(cfg: Any, par: ParallelContext, precision: Any, load_kwargs: Dict[str, Any],
                         total_optimizer_steps: int, policy_is_encoder_decoder: bool = False
                         ) -> Optional[CriticLearner]:
    """The critic of a run whose estimator takes values (`cfg.needs_critic`), else None: `load_critic` of
    critic_model_name_or_path with the policy's tensor-parallel shard, precision plan and recompute keys
    (`load_kwargs`: ParallelContext.model_load_kwargs + PrecisionPlan.load_kwargs), and its own AdamW (the
    policy's betas and epsilon, critic_weight_decay off biases and norms as for the policy) on a LambdaDecay of
    critic_learning_rate (critic_lr_scheduler_type, critic_warmup_ratio of `total_optimizer_steps`, decaying to
    critic_min_learning_rate), wrapped as the policy's (sharding stage1, O2 master weights). Each of these keys
    left unset takes the policy's value (Config.critic_setting, critic_warmup_steps), as in PaddleNLP."""
    if not cfg.needs_critic:
        return None
    # The config refuses both (critic_refusals, encoder_decoder_refusal); a trainer built another way must too.
    if par.pp_world > 1:
        raise NotImplementedError(f"rl_algorithm {cfg.rl_algorithm!r} trains a critic, which has no pipeline "
                                  "stages: pipeline_parallel_degree must be 1")
    if policy_is_encoder_decoder:
        raise NotImplementedError(f"rl_algorithm {cfg.rl_algorithm!r} trains a critic, a decoder backbone valuing "
                                  "prompt + completion as one sequence: actor_model_name_or_path must be "
                                  "decoder-only")
    kwargs = {k: v for k, v in load_kwargs.items() if k != "head_chunk_size"}  # no LM head: no chunked head
    critic = load_critic(cfg.critic_model_name_or_path, recompute=cfg.recompute,
                         recompute_granularity=cfg.recompute_granularity,
                         recompute_use_reentrant=cfg.recompute_use_reentrant, **kwargs)
    warmup = cfg.critic_warmup_steps(total_optimizer_steps)
    scheduler = paddle.optimizer.lr.LambdaDecay(cfg.critic_setting("critic_learning_rate"), lr_lambda(
        cfg.critic_setting("critic_lr_scheduler_type"), warmup, total_optimizer_steps, cfg.critic_min_lr_ratio))
    decay = parameters_by_decay(critic.model)
    optimizer = par.wrap_optimizer(precision.decorate(critic.model, paddle.optimizer.AdamW(
        learning_rate=scheduler, parameters=critic.trainable_parameters(),
        weight_decay=cfg.critic_setting("critic_weight_decay"),
        beta1=cfg.adam_beta1, beta2=cfg.adam_beta2, epsilon=cfg.adam_epsilon,
        apply_decay_param_fun=lambda name: name in decay)), main=False)
    return CriticLearner(critic, optimizer, scheduler, par.for_optimizer(optimizer), amp=precision.runtime())


@dataclass
class CriticInputs:
    """The tensors of one critic update: the batch, the experience's values `old_values` [n, T] (V_old of the
    clipped value loss), the `returns` [n, T] (the estimator's targets) and the loss mask [n, T] (completion mask
    times the row's validity, as the policy's)."""
    batch: Batch
    old_values: paddle.Tensor
    returns: paddle.Tensor
    loss_mask: paddle.Tensor


def update_critic(learner: CriticLearner, inputs: CriticInputs, cfg: Any, geometry: Any, step: int) -> CriticMetrics:
    """`update_iters` passes over the batch in the policy's mini-batches (`geometry.sequences_per_mini_batch` rows,
    one critic optimizer step each) and micro-batches (per_device_train_batch_size rows, `plan_micro_batches`),
    the value loss `value_loss(V, V_old, R, mask, clip_range_value)` token-averaged over the mini-batch's tokens on
    every rank. Non-finite losses and gradients are skipped as for the policy (`apply_gradients`)."""
    par, critic, amp = learner.par, learner.critic, learner.amp
    n = inputs.batch.completion_ids.shape[0]
    per_mini = geometry.sequences_per_mini_batch
    masks = (inputs.batch.prompt_mask.numpy(), inputs.batch.attention_mask().numpy())  # widths: all tokens
    critic.model.train()
    params = critic.trainable_parameters()
    per_mini_metrics = []
    for _ in range(cfg.update_iters):
        for m0 in range(0, n, per_mini):
            local = global_denominators(inputs.loss_mask[m0:m0 + per_mini], "token-mean")
            keys = sorted(local)
            agg = dict(zip(keys, par.all_reduce_sum([local[k] for k in keys]).tolist()))
            sums, finite = np.zeros(2), True   # shares of the mini-batch's value loss and clip fraction
            for mb in plan_micro_batches(*masks, np.arange(m0, min(m0 + per_mini, n)),
                                         cfg.per_device_train_batch_size, cfg):
                with model_precision(amp):
                    v = critic.values(*mb.inputs(inputs.batch))
                out = value_loss(v, mb.completion(inputs.old_values), mb.completion(inputs.returns),
                                 mb.completion(inputs.loss_mask), cfg.clip_range_value, **agg)
                ok = bool(paddle.isfinite(out["loss"]))
                if ok:
                    (amp.scale(out["loss"]) if amp else out["loss"]).backward()
                sums += [float(out["loss"]), float(out["clip_frac"])]
                finite = finite and ok
            loss, clip_frac = par.all_reduce_sum(sums).tolist()
            grad_norm = apply_gradients(par, params, learner.optimizer, amp, learner.state, finite, cfg, step)
            per_mini_metrics.append({"train/value_loss": loss, "train/value_clip_frac": clip_frac,
                                     "train/critic_grad_norm": grad_norm})
            learner.scheduler.step()
            learner.state.optimizer_steps += 1
    return CriticMetrics(per_mini_metrics, float(learner.optimizer.get_lr()))
