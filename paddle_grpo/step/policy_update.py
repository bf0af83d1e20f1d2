"""The update phase: the policy's mini-batches of micro-batches, gradients summed over the data-parallel ranks,
clipped with the global norm, one optimizer step each (docs/algorithms.md sections 4-5)."""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Sequence, Tuple

import numpy as np
import paddle

from ..algorithms import (adaptive_entropy_coeff, aggregate_loss, compute_policy_loss, global_denominators,
                          kl_penalty, masked_mean, resolve_policy_loss, rollout_correction)
from ..parallel import ParallelContext
from ..policy import Policy, position_ids_from_mask
from ..policy.causal import logprobs_from_completion_logits
from ..policy.lm_head import head_logprobs
from .batch import Batch, MicroBatch, model_precision, plan_micro_batches
from .metrics import CORRECTION_TOKEN_MEANS, LossSums, UpdateMetrics

logger = logging.getLogger("paddle_grpo.step")


class TrainingError(RuntimeError):
    """The run cannot go on (for example too many non-finite updates in a row)."""


# ---------------------------------------------------------------------------------------------- the update

@dataclass
class UpdateState:
    """The update's counters and the adaptive entropy coefficient's state (entropy_target: `entropy_coeff` c and
    the `entropy_applied` alpha the next step's bonus uses, algorithms.adaptive_entropy_coeff; None until the
    first step: the configured entropy_coeff), kept in checkpoints."""
    optimizer_steps: int = 0
    nonfinite_total: int = 0
    nonfinite_in_a_row: int = 0
    entropy_coeff: Optional[float] = None
    entropy_applied: Optional[float] = None

    def entropy_bonus(self, cfg: Any) -> float:
        """The entropy bonus's coefficient this step: alpha under entropy_target, else entropy_coeff."""
        if cfg.entropy_target is None or self.entropy_applied is None:
            return cfg.entropy_coeff
        return self.entropy_applied

    def follow_entropy(self, cfg: Any, entropy: float) -> None:
        """After a step whose token-mean entropy was `entropy`: the adaptive coefficient's next values (no-op
        without entropy_target)."""
        if cfg.entropy_target is None:
            return
        coeff = cfg.entropy_coeff if self.entropy_coeff is None else self.entropy_coeff
        applied = cfg.entropy_coeff if self.entropy_applied is None else self.entropy_applied
        self.entropy_coeff, self.entropy_applied = adaptive_entropy_coeff(coeff, applied, entropy,
                                                                          cfg.entropy_target, cfg.entropy_coeff_lr)


@dataclass
class Learner:
    """What the update phase trains: the policy (its full copy under pipeline parallelism, which then only
    generates and scores), this rank's pipeline stage if any, the optimizer, its schedule and the counters.
    `amp`: precision.Amp (autocast context, fp16 loss scale) of a run under AMP, None otherwise."""
    policy: Policy
    pipeline: Any
    optimizer: Any
    scheduler: Any
    state: UpdateState = field(default_factory=UpdateState)
    amp: Any = None

    def parameters(self) -> list:
        return (self.pipeline if self.pipeline is not None else self.policy.model).parameters()

    def amp_state(self) -> Optional[Dict[str, float]]:
        """The fp16 loss scale's state, kept in checkpoints (None without a loss scale)."""
        return self.amp.state_dict() if self.amp else None

    def load_amp_state(self, state: Optional[Dict[str, float]]) -> None:
        """Restore a checkpoint's loss scale (precision.Amp.load_state_dict; a no-op without AMP)."""
        if self.amp:
            self.amp.load_state_dict(state)


@dataclass
class UpdateInputs:
    """The tensors of one update: the batch, advantages [n, T], the loss mask [n, T] (completion mask times the
    row's validity), old log-probs [n, T] (None on-policy: the detached current ones are used) and reference
    log-probs [n, T] (None without KL loss); `positive` [n, T] the loss mask of the rows VAPO's positive-example LM
    loss trains on (None without it: positive_example_lm_coeff 0). `distill`: on-policy distillation's exact
    reverse KL (step.distillation.FullReverseKL, opd_kl_estimator full), called per micro-batch in place of the
    policy's log-probs: `(log-probs, entropies, per-token KL)` [mb, T] from the student's full logits and the
    teacher's beside them; None otherwise."""
    batch: Batch
    advantages: paddle.Tensor
    loss_mask: paddle.Tensor
    old_lp: Optional[paddle.Tensor]
    ref_lp: Optional[paddle.Tensor]
    positive: Optional[paddle.Tensor] = None
    distill: Any = None


def rl_loss(cfg: Any, lp: paddle.Tensor, entropy: paddle.Tensor, old: paddle.Tensor, advantages: paddle.Tensor,
            mask: paddle.Tensor, ref: Optional[paddle.Tensor], agg: Dict[str, Any],
            positive: Optional[paddle.Tensor] = None, sample: Optional[paddle.Tensor] = None,
            entropy_coeff: Optional[float] = None,
            opd_kl: Optional[paddle.Tensor] = None) -> Tuple[paddle.Tensor, np.ndarray]:
    """A micro-batch's share of the mini-batch loss: policy loss + KL loss - entropy bonus (+ VAPO's
    positive-example LM loss) with the global denominators `agg` (docs/algorithms.md sections 4-5), and its LossSums
    values. All inputs [mb, T]; `ref` None without KL loss; `positive` None without the positive-example loss, else
    the mask of its tokens, whose NLL is token-averaged over the mini-batch's `agg["positive_tokens"]` (all ranks).
    `sample`: the sampler's log-probs of the tokens (Batch.sample_logprobs); with them the policy-gradient term is
    weighted per token by `cfg.correction_mode` (tis / mis against `old`, at `cfg.correction_level`; none: not
    weighted; clip: not weighted, the PPO ratio taken against `sample` instead of `old`) and the ratio's statistics
    are logged (docs/algorithms.md, "Rollout correction"). The KL, entropy and positive-example terms are never
    weighted. The policy loss: `cfg.policy_loss`, unset the one of `cfg.importance_sampling_level`, with its options
    (`PolicyLossSpec.options`). `entropy_coeff`: the entropy bonus's coefficient (UpdateState.entropy_bonus; None:
    `cfg.entropy_coeff`). `opd_kl` [mb, T]: on-policy distillation's exact per-token reverse KL to the teacher
    (differentiable in the student's logits), added as `opd_kl_coeff * agg(KL)`; with `opd_only` the
    policy-gradient term then leaves the loss (its value is still logged as train/policy_loss)."""
    entropy_coeff = cfg.entropy_coeff if entropy_coeff is None else entropy_coeff
    spec = resolve_policy_loss(cfg.policy_loss, cfg.importance_sampling_level)
    positive_tokens = agg.get("positive_tokens", 0.0)
    agg = {k: v for k, v in agg.items() if k != "positive_tokens"}
    weights, correction = None, None
    if sample is not None:
        # The level: rollout_correction_level, unset the geometric mean for GSPO's sequence ratio (its own ratio's
        # level), else per token (Config.correction_level).
        weights, correction = rollout_correction(old, sample, mask, cfg.correction_mode, cfg.rollout_correction_cap,
                                                 cfg.rollout_correction_min, level=cfg.correction_level)
        if cfg.correction_mode == "clip":  # the trust region around the sampling policy, not the trainer's
            old = sample
    out = compute_policy_loss(lp, old, advantages, mask, clip_ratio_low=cfg.eps_low, clip_ratio_high=cfg.eps_high,
                              clip_ratio_c=cfg.clip_ratio_c, policy_loss=spec.name, loss_options=spec.options(cfg),
                              loss_agg_mode=cfg.loss_agg_mode, token_weights=weights, **agg)
    distill_only = opd_kl is not None and cfg.opd_only  # GKD: the teacher's KL alone trains
    loss = paddle.zeros([]) if distill_only else cfg.pg_loss_coeff * out["pg_loss"]
    if opd_kl is not None:
        loss = loss + cfg.opd_kl_coeff * aggregate_loss(opd_kl, mask, cfg.loss_agg_mode, **agg)
    kl_loss = paddle.zeros([])
    if cfg.kl_loss_coeff > 0:
        kl_loss = aggregate_loss(kl_penalty(lp, ref, cfg.kl_loss_estimator), mask, cfg.loss_agg_mode, **agg)
        loss = loss + cfg.kl_loss_coeff * kl_loss
    if entropy_coeff > 0:
        loss = loss - entropy_coeff * aggregate_loss(entropy, mask, cfg.loss_agg_mode, **agg)
    positive_loss = paddle.zeros([])
    if positive is not None:
        # -sum log p over the positive rows' tokens / their count in the whole mini-batch (every rank): the shares
        # of the micro-batches add up to the mini-batch's token-mean NLL, whatever the split.
        positive_loss = -(lp * positive.astype(lp.dtype)).sum() / max(positive_tokens, 1.0)
        loss = loss + cfg.positive_lm_coeff * positive_loss
    tokens = float(mask.astype("float32").sum())
    token_means = (masked_mean(entropy.detach(), mask), out["clip_frac_low"], out["clip_frac_high"],
                   out["clip_frac_dual"], out["approx_kl_old"])
    maxima = [0.0]
    if correction is not None:
        token_means += tuple(correction[k] for k in CORRECTION_TOKEN_MEANS)
        maxima = [float(correction["ratio_max"])]
    else:
        token_means += (0.0,) * len(CORRECTION_TOKEN_MEANS)
    # LossSums' layout: shares, token-weighted sums, maxima, tokens
    sums = np.array([float(out["pg_loss"]), float(kl_loss), float(positive_loss)]
                    + [float(v) * tokens for v in token_means] + maxima + [tokens])
    return loss, sums


def _micro_batch(learner: Learner, inputs: UpdateInputs, mb: MicroBatch, agg: Dict[str, Any], cfg: Any,
                 vocab_parallel: Any) -> Tuple[np.ndarray, bool]:
    """Forward + backward of one micro-batch (skipped backward when its loss is not finite). A trimmed micro-batch
    loses only masked columns, which add nothing to the loss (global denominators: `agg`)."""
    entropy_coeff = learner.state.entropy_bonus(cfg)
    opd_kl = None
    with model_precision(learner.amp):  # float32 log-probs out either way
        # The entropy is logged every step; it takes a gradient only when the loss has an entropy bonus ("detached":
        # no graph for it, and the chunked head's backward skips its term).
        with_entropy = True if entropy_coeff > 0 else "detached"
        if inputs.distill is None:
            lp, entropy = learner.policy.logprobs(*mb.inputs(inputs.batch), temperature=cfg.temperature,
                                                  with_entropy=with_entropy, vocab_parallel=vocab_parallel)
        else:  # the exact reverse KL needs the student's full logits: log-probs and entropies come from them too
            lp, entropy, opd_kl = inputs.distill(learner.policy, mb, inputs, cfg.temperature, with_entropy)
    old = lp.detach() if inputs.old_lp is None else mb.completion(inputs.old_lp)
    loss, sums = rl_loss(cfg, lp, entropy, old, mb.completion(inputs.advantages), mb.completion(inputs.loss_mask),
                         mb.completion(inputs.ref_lp), agg, mb.completion(inputs.positive),
                         mb.completion(inputs.batch.sample_logprobs), entropy_coeff, opd_kl)
    finite = bool(paddle.isfinite(loss))
    if finite:
        (learner.amp.scale(loss) if learner.amp else loss).backward()
    return sums, finite


def pipeline_logprobs(out: paddle.Tensor, completion_ids: paddle.Tensor, cfg: Any, head: Any = None,
                      chunk_size: Optional[int] = None,
                      entropy_coeff: Optional[float] = None) -> Tuple[paddle.Tensor, paddle.Tensor]:
    """Log-probs and entropies [mb, T] of the completions from the pipeline's last-stage output `out`: the logits
    [mb, S, V], or with `chunk_size` the final hidden states [mb, S, H] that `head` (the stage's LM head layer)
    turns into log-probs chunk by chunk. S = L + T: the token at position L + t is predicted at L + t - 1.
    `entropy_coeff`: the entropy bonus's coefficient (None: cfg.entropy_coeff)."""
    T = completion_ids.shape[1]
    # As _micro_batch: the entropy takes a gradient only for an entropy bonus, else it is only logged ("detached").
    with_entropy = True if (cfg.entropy_coeff if entropy_coeff is None else entropy_coeff) > 0 else "detached"
    if chunk_size is None:
        return logprobs_from_completion_logits(out[:, -T - 1:-1], completion_ids, cfg.temperature, with_entropy)
    return head_logprobs(out[:, -T - 1:-1], head, completion_ids, temperature=cfg.temperature,
                         with_entropy=with_entropy, chunk_size=chunk_size)


def _pipeline_mini_batch(learner: Learner, inputs: UpdateInputs, sl: slice, agg: Dict[str, Any], cfg: Any,
                         micro_batches: int) -> Tuple[np.ndarray, bool]:
    """Forward + backward of the mini-batch rows `sl` through the pipeline (fleet splits them into the
    micro-batches), the loss of `rl_loss` on the last stage; the summed LossSums values and whether every
    micro-batch's loss was finite, on every stage. With the chunked LM head (`policy.head_chunk_size`) the last
    stage hands the loss its final hidden states and the loss applies the stage's LM head chunk by chunk."""
    b = inputs.batch
    ids = paddle.concat([b.prompt_ids[sl], b.completion_ids[sl]], axis=1)
    attention_mask = paddle.concat([b.prompt_mask[sl], b.attention_mask()[sl]], axis=1).astype("int64")  # + tools
    rows = lambda t: None if t is None else t[sl]  # noqa: E731
    labels = (b.completion_ids[sl], inputs.loss_mask[sl], inputs.advantages[sl], rows(inputs.old_lp),
              rows(inputs.ref_lp), rows(inputs.positive), b.sample_logprobs[sl])
    micro = []
    chunk_size = getattr(learner.policy, "head_chunk_size", None)
    entropy_coeff = learner.state.entropy_bonus(cfg)

    def loss_fn(out, labels):
        completion_ids, mask, adv, old, ref, positive, sample = labels
        # The stage's own head layer (chunked head): its weight's gradient reaches the pipeline optimizer.
        lp, entropy = pipeline_logprobs(out, completion_ids, cfg,
                                        learner.pipeline.lm_head if chunk_size is not None else None, chunk_size,
                                        entropy_coeff)
        loss, sums = rl_loss(cfg, lp, entropy, lp.detach() if old is None else old, adv, mask, ref, agg, positive,
                             sample, entropy_coeff)
        micro.append((sums, bool(paddle.isfinite(loss))))
        return loss

    learner.pipeline.forward_backward((ids, attention_mask, None, position_ids_from_mask(attention_mask)), labels,
                                      loss_fn, final_hidden=chunk_size is not None)
    total = LossSums()  # the other stages ran no loss: zeros, replaced by the last stage's
    for sums, _ in micro:
        total.add(sums)
    out = learner.pipeline.from_last_stage(np.append(total.values, float(sum(finite for _, finite in micro))))
    return out[:-1], bool(out[-1] == micro_batches)


def nothing_to_learn(par: ParallelContext, learner: Learner, inputs: UpdateInputs, rows: slice,
                     agg: Dict[str, Any], cfg: Any) -> bool:
    """Whether the policy loss of the mini-batch `rows` has a gradient of exactly 0 whatever the parameters, on
    every rank: every advantage of its valid tokens is 0 (each group's rewards agreed) and no term of `rl_loss`
    is independent of the advantages: no KL loss (kl_loss_coeff), no entropy bonus (this step's coefficient,
    UpdateState.entropy_bonus), no exact distillation KL (`inputs.distill`), no positive example of VAPO's LM loss
    in the mini-batch (`agg["positive_tokens"]`, all ranks), and a policy loss registered as `advantage_weighted`
    (PPO clip, dual-clip, GSPO, CISPO, GMPO, SAPO, Clip-Cov; not KL-Cov; the rollout correction's weights multiply
    it). LoRA adds no term. Never under pipeline
    parallelism, whose stages run the loss through fleet's schedule."""
    if learner.pipeline is not None or cfg.kl_loss_coeff != 0 or learner.state.entropy_bonus(cfg) > 0:
        return False
    if inputs.distill is not None:  # the teacher's KL trains whatever the rewards
        return False
    if inputs.positive is not None and agg.get("positive_tokens", 0) > 0:
        return False
    if not resolve_policy_loss(cfg.policy_loss, cfg.importance_sampling_level).advantage_weighted:
        return False
    # NaN advantages are not 0: such a mini-batch runs and is counted as non-finite, as before
    zero = bool(paddle.all((inputs.advantages[rows] == 0) | (inputs.loss_mask[rows] == 0)))
    return par.all_true(zero)


# What a mini-batch with nothing to learn logs: its loss terms are exactly 0; the statistics of the forward pass
# (entropy, clip fractions, approx_kl_old, the rollout correction's) are not computed and not logged for it.
SKIPPED_MEANS = {"train/policy_loss": 0.0, "train/kl_loss": 0.0, "train/positive_lm_loss": 0.0}


def zero_gradients(params: Sequence[Any]) -> None:
    """Give each trained parameter (not stop_gradient) the gradient of a loss that does not depend on it: exact
    zeros, through a backward pass so that what a backward does to gradients (AMP's master-gradient hooks) happens
    as in a real one. The optimizer step that follows is then the one a forward and backward with zero advantages
    would give: AdamW decays its moments, advances its step count and applies weight decay, exactly."""
    trained = [p for p in params if not p.stop_gradient]
    if trained:
        # d(0 * sum p)/dp = 0 elementwise, even where p holds inf or NaN; O(parameters), no forward of the model
        paddle.add_n([p.sum() * 0.0 for p in trained]).backward()


def clip_gradients(parameters: Sequence[Any], grad_norm: float, max_grad_norm: float) -> None:
    """Scale gradients by max_grad_norm / norm when the norm exceeds it (as ClipGradByGlobalNorm, but with the
    norm of the whole model under tensor parallelism, not of this rank's shard)."""
    if max_grad_norm <= 0 or grad_norm <= max_grad_norm:
        return
    scale = max_grad_norm / grad_norm
    with paddle.no_grad():
        for p in parameters:
            if p.grad is not None:
                p.grad.scale_(scale)


def update(par: ParallelContext, learner: Learner, inputs: UpdateInputs, cfg: Any, geometry: Any, step: int,
           vocab_parallel: Any = None) -> UpdateMetrics:
    """`update_iters` passes over the batch in mini-batches of `geometry.sequences_per_mini_batch` rows, one
    optimizer step each, gradients accumulated over micro-batches of per_device_train_batch_size rows
    (`plan_micro_batches`: by length and trimmed with use_remove_padding, by tokens with max_tokens_per_micro_batch)
    and summed over the data-parallel ranks. A mini-batch whose loss or gradient is not finite on any rank is
    skipped on all; `max_consecutive_nonfinite` skipped in a row raise TrainingError. A mini-batch with nothing to
    learn (`nothing_to_learn`: every advantage 0 and no other term) skips the model's forward and backward and
    takes the optimizer step with zero gradients (`zero_gradients`): the parameters, optimizer state, schedule and
    counters are those of the full pass, bit for bit (train/update_skipped: the share of such optimizer steps).
    With entropy_target, the entropy coefficient then follows the step's entropy (UpdateState.follow_entropy)."""
    n = inputs.batch.completion_ids.shape[0]
    per_mini, mb = geometry.sequences_per_mini_batch, cfg.per_device_train_batch_size
    per_mini_metrics = []
    masks = (inputs.batch.prompt_mask.numpy(), inputs.batch.attention_mask().numpy())  # widths: all tokens
    state = learner.state
    learner.policy.model.train()
    params = learner.parameters()
    for _ in range(cfg.update_iters):
        for m0 in range(0, n, per_mini):
            local = global_denominators(inputs.loss_mask[m0:m0 + per_mini], cfg.loss_agg_mode)
            if inputs.positive is not None:
                local["positive_tokens"] = int(inputs.positive[m0:m0 + per_mini].astype("float32").sum())
            keys = sorted(local)
            agg = dict(zip(keys, par.all_reduce_sum([local[k] for k in keys]).tolist()))
            agg["max_dec_len"] = cfg.max_dec_len  # read by seq-mean-token-sum-norm only
            sums, finite = LossSums(), True
            skipped = nothing_to_learn(par, learner, inputs, slice(m0, m0 + per_mini), agg, cfg)
            if skipped:  # all groups agreed: the gradient is 0, so no forward or backward of the model
                zero_gradients(params)
            elif learner.pipeline is not None:
                values, finite = _pipeline_mini_batch(learner, inputs, slice(m0, m0 + per_mini), agg, cfg,
                                                      geometry.grad_accum_steps)
                sums.add(values)
            else:
                for micro in plan_micro_batches(*masks, np.arange(m0, min(m0 + per_mini, n)), mb, cfg):
                    micro_sums, micro_finite = _micro_batch(learner, inputs, micro, agg, cfg, vocab_parallel)
                    sums.add(micro_sums)
                    finite = finite and micro_finite
            per_mini_metrics.append(dict(SKIPPED_MEANS) if skipped else sums.reduced(par).means())
            per_mini_metrics[-1]["train/update_skipped"] = float(skipped)
            if cfg.entropy_target is not None:  # the adaptive coefficient this step's bonus used
                per_mini_metrics[-1]["train/entropy_coeff"] = state.entropy_bonus(cfg)
            per_mini_metrics[-1]["train/grad_norm"] = apply_gradients(par, params, learner.optimizer, learner.amp,
                                                                      state, finite, cfg, step)
            learner.scheduler.step()
            state.optimizer_steps += 1
    # The adaptive entropy coefficient follows this step's entropy (train/entropy: the same on every rank)
    measured = [m["train/entropy"] for m in per_mini_metrics if math.isfinite(m.get("train/entropy", math.nan))]
    state.follow_entropy(cfg, float(np.mean(measured)) if measured else math.nan)
    if learner.pipeline is not None:  # the next rollout, log-probs and checkpoint use the full copy
        learner.pipeline.copy_to(learner.policy.model)
    return UpdateMetrics(per_mini_metrics, state.nonfinite_total, state.optimizer_steps, cfg.kl_loss_coeff != 0,
                         inputs.positive is not None, cfg.correction_mode,
                         inputs.distill.metrics() if inputs.distill is not None else None)


def apply_gradients(par: ParallelContext, params: list, optimizer: Any, amp: Any, state: UpdateState, finite: bool,
                    cfg: Any, step: int) -> float:
    """One optimizer step from the gradients the micro-batches accumulated (`finite`: every micro-batch's loss on
    this rank was): summed over the data-parallel ranks, fp16 loss scale divided out, clipped at max_grad_norm by
    the global norm, then the step; skipped on every rank when any rank's loss or the gradient is not finite
    (`max_consecutive_nonfinite` in a row raise TrainingError). Gradients cleared. Returns the gradient norm
    (nan when skipped for a non-finite loss)."""
    # Every rank takes the same branch: a rank whose loss was not finite skipped its backward, so gradients are
    # summed only when all ranks have them.
    finite = par.all_true(finite)
    if finite:
        par.sum_gradients(params)
        if amp:  # the true gradients (fp16 loss scale divided out) before their norm and clipping
            amp.unscale(params)
    grad_norm = par.global_grad_norm(params) if finite else float("nan")
    overflow = bool(amp) and amp.overflowed(finite, grad_norm)  # fp16: not a failure
    finite = finite and math.isfinite(grad_norm)
    if finite:
        clip_gradients(params, grad_norm, cfg.max_grad_norm)
        optimizer.step()
        state.nonfinite_in_a_row = 0
    elif not overflow:
        _count_nonfinite(state, step, cfg.max_consecutive_nonfinite)
    optimizer.clear_grad(set_to_zero=False)
    return grad_norm


def _count_nonfinite(state: UpdateState, step: int, limit: int) -> None:
    state.nonfinite_total += 1
    state.nonfinite_in_a_row += 1
    logger.warning("step %d: non-finite loss or gradient, optimizer step skipped (%d in a row)", step + 1,
                   state.nonfinite_in_a_row)
    if state.nonfinite_in_a_row >= limit:
        raise TrainingError(
            f"{state.nonfinite_in_a_row} consecutive updates had a non-finite loss or gradient "
            f"(max_consecutive_nonfinite = {limit}); stopping. Lower learning_rate, set max_grad_norm, or check "
            "the rewards for inf/NaN.")
