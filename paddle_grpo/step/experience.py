"""The experience phase: old and reference log-probs, the critic's values, rewards shaped and advantages (and the
critic's returns) estimated over the global batch (docs/algorithms.md sections 1-3)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Tuple

import numpy as np
import paddle

from ..algorithms import (RunningRewardNormalizer, advantage_estimator_spec, clip_reward, explained_variance,
                          kl_penalty, kl_token_rewards, normalize_advantage, overlong_penalty, positive_example_mask,
                          scalar_to_token_level)
from ..config import ConfigError
from ..parallel import ParallelContext
from ..policy import Critic, Policy
from .batch import Batch, GlobalRows, MicroBatch, _in_row_order, model_precision, plan_micro_batches
from .critic_update import CriticInputs
from .metrics import AdvantageMetrics, RewardMetrics, ValueMetrics
from .policy_update import UpdateInputs


def _eval_passes(model: paddle.nn.Layer, batch: Batch, rows_per_pass: int, cfg: Any,
                 forward: Callable[[MicroBatch], Any], amp: Any) -> Tuple[List[MicroBatch], list]:
    """`forward(mb)` of each micro-batch of `rows_per_pass` rows (`plan_micro_batches`: sorted by length and trimmed
    with use_remove_padding or max_tokens_per_micro_batch), with `model` in eval mode (no dropout, as the rollout
    that sampled the rows) and at the update's precision (`model_precision(amp)`); the plan and the results."""
    plan = plan_micro_batches(batch.prompt_mask.numpy(), batch.attention_mask().numpy(),
                              np.arange(batch.completion_ids.shape[0]), rows_per_pass, cfg)
    was_training = model.training
    model.eval()
    out = []
    try:
        for mb in plan:
            with model_precision(amp):
                out.append(forward(mb))
    finally:
        if was_training:
            model.train()
    return plan, out


@paddle.no_grad()
def logprobs(policy: Policy, batch: Batch, cfg: Any, vocab_parallel: Any = None, with_entropy: bool = False,
             amp: Any = None) -> Tuple[paddle.Tensor, Optional[paddle.Tensor]]:
    """Per-token log-probs [n, T] (and entropy) of the batch's completions under `policy`, in micro-batches of
    per_device_logprob_batch_size rows (sorted by length and trimmed with use_remove_padding or
    max_tokens_per_micro_batch: `plan_micro_batches`), in eval mode (no dropout), as the rollout that sampled them,
    and at the update's precision (`model_precision(amp)`). Padding positions hold meaningless values (0 beyond a
    trimmed micro-batch's width)."""
    n, T = batch.completion_ids.shape
    plan, parts = _eval_passes(policy.model, batch, cfg.per_device_logprob_batch_size, cfg,
                               lambda mb: policy.logprobs(*mb.inputs(batch), temperature=cfg.temperature,
                                                          with_entropy=with_entropy, vocab_parallel=vocab_parallel),
                               amp)  # float32 log-probs out either way
    out, ent = [lp for lp, _ in parts], [e for _, e in parts]
    return _in_row_order(out, plan, T), (_in_row_order(ent, plan, T) if with_entropy else None)


def old_logprobs(policy: Policy, batch: Batch, cfg: Any, geometry: Any, vocab_parallel: Any = None,
                 amp: Any = None) -> Optional[paddle.Tensor]:
    """The old log-probs [n, T] the update's loss reads, recomputed once before it (`logprobs`), or None where
    nothing reads them (docs/algorithms.md section 4, "What old is"): on-policy (one optimizer step per step: the
    loss takes `l.detach()` of its own forward, the same parameters), and with `rollout_correction` clip, whose loss
    takes the sampler's log-probs as old (verl's bypass mode: the pass would be computed and discarded). The reward's
    KL never reads them (`reward_kl_logprobs`)."""
    if geometry.optimizer_steps_per_step == 1 or cfg.correction_mode == "clip":
        return None
    return logprobs(policy, batch, cfg, vocab_parallel, False, amp)[0]


def reward_kl_logprobs(batch: Batch, ref_lp: Optional[paddle.Tensor], cfg: Any) -> Optional[paddle.Tensor]:
    """The policy's side [n, T] of the reward's KL term (`cfg.reward_kl_coeff`): the sampler's own log-probs
    (`Batch.sample_logprobs`), whatever the mini-batching; None without the term. The rewarded tokens were drawn by
    the sampler, so `k(l^s, l^ref)` estimates KL(pi_s || pi_ref) of the policy that wrote them; the log-probs come
    with the batch (no forward pass) and are the same with one optimizer step per step or several, synchronous or
    lagged. (The trainer's recomputed log-probs, taken with several optimizer steps before, made the penalty of a
    lagged run depend on global_mini_batch_size; synchronously the two agree up to float32 rounding.)"""
    return batch.sample_logprobs if cfg.reward_kl_coeff > 0 and ref_lp is not None else None


def reference_logprobs(policy: Policy, reference: Optional[Policy], batch: Batch, cfg: Any,
                       vocab_parallel: Any = None, amp: Any = None) -> Optional[paddle.Tensor]:
    """Log-probs under the reference model: the frozen copy, or under LoRA the policy with its adapters disabled
    (the base model, exactly); None when no KL term needs them. At the update's precision (`model_precision`).
    The batch's own when the rollout worker computed them with the samples (async_rollout)."""
    if batch.ref_logprobs is not None:
        return batch.ref_logprobs
    if reference is not None:
        return logprobs(reference, batch, cfg, vocab_parallel, amp=amp)[0]
    if cfg.lora and cfg.needs_reference_model:
        with policy.adapters_disabled():
            return logprobs(policy, batch, cfg, vocab_parallel, amp=amp)[0]
    return None


def reference_kl(par: ParallelContext, batch: Batch, ref_lp: paddle.Tensor) -> float:
    """train/kl: the k3 estimate of KL(sampling policy || reference), token-mean over the global batch."""
    k3 = kl_penalty(batch.sample_logprobs, ref_lp, "k3")
    mask = batch.completion_mask.astype("float32")
    kl_sum, tokens = par.all_reduce_sum([float((k3 * mask).sum()), float(mask.sum())])
    return float(kl_sum / max(tokens, 1.0))


# ------------------------------------------------------------------------------------ rewards, advantages

def shape_rewards(rows: GlobalRows, cfg: Any, normalizer: Optional[RunningRewardNormalizer]
                  ) -> Tuple[np.ndarray, RewardMetrics]:
    """Global rewards [N] float32 after clipping, DAPO overlong shaping and running normalisation; rows no function
    could judge get 0 (docs/algorithms.md section 1)."""
    rewards, valid = rows.rewards, rows.valid
    names = list(rows.scores_by_function[0]) if len(rows.scores_by_function[0]) > 1 else []
    by_function = {}
    for name in names:  # per function only with several: one function's mean would repeat train/reward
        vals = [v for part in rows.scores_by_function for v in part[name] if v is not None]
        if vals:
            by_function[name] = float(np.mean(vals))
    metrics = RewardMetrics(reward=float(rewards[valid].mean()) if valid.any() else 0.0,
                            reward_std=float(rewards[valid].std(ddof=1)) if valid.sum() > 1 else 0.0,
                            none_frac=float(1.0 - valid.mean()), by_function=by_function)
    if cfg.clip_range_score > 0:
        rewards = clip_reward(rewards, cfg.clip_range_score)
    if cfg.enable_overlong_reward_buffer:
        rewards = rewards + np.asarray(overlong_penalty(rows.lengths, cfg.max_dec_len, cfg.overlong_reward_buffer,
                                                        cfg.overlong_penalty_factor), dtype=np.float64)
    if normalizer is not None and valid.any():
        normalizer.update(rewards[valid])
        rewards = np.asarray(normalizer.normalize(rewards), dtype=np.float64)
    rewards = np.where(valid, rewards, 0.0)
    return rewards.astype(np.float32), metrics


@dataclass
class Estimate:
    """The advantages of the global batch: `advantages` [N, T_max] (normalised when normalize_advantage applies),
    `returns` [N, T_max] the critic's targets (None without a critic), their metrics records."""
    advantages: np.ndarray
    returns: Optional[np.ndarray]
    metrics: AdvantageMetrics
    value_metrics: Optional[ValueMetrics] = None


def estimate_advantages(rows: GlobalRows, rewards: np.ndarray, cfg: Any) -> Estimate:
    """Advantages [N, T_max] of the global batch from the shaped rewards [N] (docs/algorithms.md sections 2-3).
    The reward's KL term (coefficient `cfg.reward_kl_coeff`: `kl_coeff` for the REINFORCE++ family and the critic
    estimators, for the group estimators only with `use_kl_in_reward`), when `rows` carries log-probs, goes where
    the estimator's spec says: per token inside the estimator ("token"), per token in the rewards it is given
    ("token_rewards": `kl_token_rewards`, PaddleNLP's PPO reward), or per sequence (`R - kl_coeff * sum_t KL_t`)
    before it. An estimator that takes values (`needs_values`) gets the critic's `rows.values` and gives the
    returns the critic learns."""
    G = cfg.rollout_n
    spec = advantage_estimator_spec(cfg.rl_algorithm)
    mask = rows.mask * rows.valid[:, None]   # rows no function could judge take no part in any statistic
    index = np.repeat(np.arange(len(rewards) // G), G)
    options = spec.options(cfg)
    seq_rewards = rewards.copy()
    kl_coeff = cfg.reward_kl_coeff
    mask_t = paddle.to_tensor(mask.astype(np.float32))
    with_kl = rows.old is not None and kl_coeff != 0
    if spec.kl_in_reward == "token_rewards":
        old, ref = (paddle.to_tensor(rows.old), paddle.to_tensor(rows.ref)) if with_kl else (None, None)
        token_rewards = kl_token_rewards(paddle.to_tensor(seq_rewards.astype(np.float32)), mask_t, old, ref,
                                         kl_coeff if with_kl else 0.0, cfg.kl_estimator)
    else:
        if with_kl and spec.kl_in_reward == "token":
            options.update(kl_coeff=kl_coeff, old_log_probs=paddle.to_tensor(rows.old),
                           ref_log_probs=paddle.to_tensor(rows.ref), kl_estimator=cfg.kl_estimator)
        elif with_kl:
            kl = kl_penalty(paddle.to_tensor(rows.old), paddle.to_tensor(rows.ref), cfg.kl_estimator).numpy()
            seq_rewards = rewards - kl_coeff * (kl * mask).sum(-1)
        token_rewards = scalar_to_token_level(paddle.to_tensor(seq_rewards.astype(np.float32)), mask_t)
    if spec.needs_values:
        if rows.values is None:
            raise ValueError(f"rl_algorithm {cfg.rl_algorithm!r} needs the critic's values: pass them to gather")
        options["values"] = paddle.to_tensor((rows.values * mask).astype(np.float32))
    adv, returns = spec.fn(token_rewards, mask_t, index, **options)
    if cfg.advantage_normalization:  # normalize_advantage, off for grpo as in PaddleNLP
        adv = normalize_advantage(adv, mask_t)
    adv = adv.numpy()
    m = mask.astype(bool)
    metrics = AdvantageMetrics(mean=float(adv[m].mean()) if m.any() else 0.0,
                               std=float(adv[m].std()) if m.any() else 0.0,
                               frac_reward_zero_std=frac_reward_zero_std(rewards, G))
    if not spec.needs_values:
        return Estimate(adv, None, metrics)
    returns = returns.numpy()
    value_metrics = ValueMetrics(values_mean=float(rows.values[m].mean()) if m.any() else 0.0,
                                 returns_mean=float(returns[m].mean()) if m.any() else 0.0,
                                 explained_variance=explained_variance(rows.values, returns, m))
    return Estimate(adv, returns, metrics, value_metrics)


def frac_reward_zero_std(rewards: np.ndarray, group_size: int) -> float:
    """train/frac_reward_zero_std: the share of the groups (`group_size` consecutive rewards of [N]) whose rewards
    all agree (population std < 1e-6), i.e. whose group-relative advantages are 0. A group of one sample
    (rollout_n 1) never counts: its estimator does not centre it on its group (grpo gives it R / (1 + 1e-6)), so
    with rollout_n 1 the share is 0."""
    if group_size < 2:
        return 0.0
    return float((rewards.reshape(-1, group_size).std(axis=1) < 1e-6).mean())


def compute_advantages(rows: GlobalRows, rewards: np.ndarray, cfg: Any) -> Tuple[np.ndarray, AdvantageMetrics]:
    """`estimate_advantages`' advantages [N, T_max] and their metrics."""
    out = estimate_advantages(rows, rewards, cfg)
    return out.advantages, out.metrics


def positive_threshold(cfg: Any, rewarder: Any) -> Optional[float]:
    """The reward from which a completion is a positive example of VAPO's LM loss (Config.positive_min_reward), or
    None when the loss is off (positive_lm_coeff 0). The rewarder's declared maximum is asked for only when no key
    sets it (it may be a request to a reward server). Raises ConfigError naming the keys when no reward counts as
    correct."""
    if cfg.positive_lm_coeff <= 0:
        return None
    keyed = cfg.positive_example_min_reward is not None or cfg.eval_max_reward is not None
    threshold = cfg.positive_min_reward(None if keyed else rewarder.max_score)
    if threshold is None:
        raise ConfigError(f"positive_example_lm_coeff is {cfg.positive_lm_coeff} (rl_algorithm "
                          f"{cfg.rl_algorithm!r}), and its loss trains on the correct answers, but what counts as "
                          "correct is unknown: the reward functions declare no maximum score. Set "
                          "positive_example_min_reward (or eval_max_reward) to the reward of a correct answer, or "
                          "positive_example_lm_coeff: 0")
    return threshold


def positive_rows(rows: GlobalRows, cfg: Any, min_reward: Optional[float]) -> Optional[np.ndarray]:
    """[N] bool: the rows VAPO's positive-example LM loss trains on (`positive_example_mask`: the correct answers
    of the global batch, judged rows whose combined reward before shaping is at least `min_reward`,
    Config.positive_min_reward), or None when the loss is off (`positive_lm_coeff` 0)."""
    if cfg.positive_lm_coeff <= 0:
        return None
    if min_reward is None:
        raise ValueError("the positive-example LM loss is on (positive_example_lm_coeff) but no reward counts as "
                         "correct: set positive_example_min_reward or eval_max_reward")
    return positive_example_mask(rows.rewards, rows.valid, min_reward)


@paddle.no_grad()
def values(critic: Critic, batch: Batch, cfg: Any, amp: Any = None) -> paddle.Tensor:
    """The critic's values [n, T] float32 of the batch's completion tokens (Critic.values), without gradient, in
    micro-batches of per_device_value_batch_size rows (sorted and trimmed as the log-prob passes:
    `plan_micro_batches`), in eval mode and at the update's precision (`model_precision(amp)`). Padding positions
    hold meaningless values (0 beyond a trimmed micro-batch's width)."""
    n, T = batch.completion_ids.shape
    plan, out = _eval_passes(critic.model, batch, cfg.per_device_value_batch_size, cfg,
                             lambda mb: critic.values(*mb.inputs(batch)).astype("float32"), amp)
    return _in_row_order(out, plan, T)


def local_rows(rows: GlobalRows, values: np.ndarray, batch: Batch) -> np.ndarray:
    """This rank's rows of a global [N, ...] array, cut to its own completion width."""
    out = values[rows.offset:rows.offset + len(batch)] if rows.rows is None else values[rows.rows]
    return out[:, :batch.completion_ids.shape[1]] if out.ndim == 2 else out


def update_inputs(rows: GlobalRows, estimate: Estimate, batch: Batch, old_lp: Optional[paddle.Tensor],
                  ref_lp: Optional[paddle.Tensor], values: Optional[paddle.Tensor], cfg: Any,
                  positive_min_reward: Optional[float] = None) -> Tuple[UpdateInputs, Optional[CriticInputs]]:
    """This rank's rows of the experience: the policy update's inputs, and the critic's (None without a critic).
    Rows no reward function could judge are left out of every loss (masked; their advantage is 0). With
    mask_truncated_completions (TRL's), the rows that reached max_dec_len without an end token (`batch.truncated`)
    are left out of the policy's loss too; their rewards still entered the advantages, and the critic still learns
    their values. `positive_min_reward`: the reward from which a row is a positive example (`positive_rows`),
    needed when the positive-example LM loss is on."""
    valid = local_rows(rows, rows.valid, batch).astype(bool)
    critic_mask = batch.completion_mask * paddle.to_tensor(valid.astype("int64"))[:, None]
    if cfg.mask_truncated_completions:
        valid = valid & ~np.asarray(batch.truncated, dtype=bool)
    loss_mask = batch.completion_mask * paddle.to_tensor(valid.astype("int64"))[:, None]
    positive = positive_rows(rows, cfg, positive_min_reward)
    if positive is not None:
        positive = loss_mask * paddle.to_tensor(local_rows(rows, positive, batch).astype("int64"))[:, None]
    inputs = UpdateInputs(batch, paddle.to_tensor(local_rows(rows, estimate.advantages, batch)), loss_mask, old_lp,
                          ref_lp, positive)
    if estimate.returns is None:
        return inputs, None
    return inputs, CriticInputs(batch, values, paddle.to_tensor(local_rows(rows, estimate.returns, batch)),
                                critic_mask)
