"""Clip-Cov and KL-Cov (Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning Language
Models", arXiv 2505.22617): policy losses that restrain the few tokens whose centred log-prob and advantage have the
largest covariance, the tokens that drive the policy's entropy down.

Both follow verl's `compute_policy_loss_clip_cov` / `compute_policy_loss_kl_cov` (adapted by verl from the
paper's code, PRIME-RL/Entropy-Mechanism-of-RL): the covariance of token t is
`C_t = (A_t - mean A) (l_t - mean l)`, the means over the call's valid tokens (in the trainer: the micro-batch's,
as verl's are its micro-batch's on one rank), and the number of tokens treated is `max(1, int(ratio * n))` of the
n valid tokens. The selection is taken without gradient.
"""
from typing import Optional

import paddle

from ._common import masked
from .losses import clipped_surrogate, masked_mean, register_policy_loss, token_log_ratio
from .policy_losses import LossOut


def token_covariance(log_prob: paddle.Tensor, advantages: paddle.Tensor,
                     response_mask: paddle.Tensor) -> paddle.Tensor:
    """`C_t = (A_t - mean A) (l_t - mean l)` `[bs, T]`, means over the valid tokens; detached, 0 on padding."""
    with paddle.no_grad():
        lp = masked(log_prob.detach(), response_mask)
        cov = (advantages - masked_mean(advantages, response_mask)) * (lp - masked_mean(lp, response_mask))
        return masked(cov, response_mask)


def _selected_count(ratio: float, valid: paddle.Tensor) -> int:
    n = int(valid.astype("int64").sum())
    return max(1, int(ratio * n)) if n else 0


def _first_k(order_key: paddle.Tensor, candidates: paddle.Tensor, k: int) -> paddle.Tensor:
    """bool `[bs, T]`: the (at most) k candidates with the smallest `order_key`, ties broken by position (row-major
    order): a stable sort of the flattened key, the non-candidates put last."""
    flat_key = paddle.where(candidates, order_key, paddle.full_like(order_key, float("inf"))).reshape([-1])
    order = paddle.argsort(flat_key, stable=True)
    k = min(k, int(candidates.astype("int64").sum()))
    chosen = paddle.zeros(flat_key.shape, dtype="bool")
    if k > 0:
        chosen = paddle.scatter(chosen.astype("int32"), order[:k], paddle.ones([k], dtype="int32")).astype("bool")
    return chosen.reshape(candidates.shape)


@register_policy_loss("clip_cov", advantage_weighted=True,
                      config_options=("clip_cov_ratio", "clip_cov_lb", "clip_cov_ub"))
def clip_cov_policy_loss(log_prob: paddle.Tensor, old_log_prob: paddle.Tensor, advantages: paddle.Tensor,
                         response_mask: paddle.Tensor, clip_ratio_low: float, clip_ratio_high: float,
                         clip_ratio_c: Optional[float], clip_cov_ratio: float = 2e-4, clip_cov_lb: float = 1.0,
                         clip_cov_ub: float = 5.0) -> LossOut:
    """Clip-Cov: PPO clip (with clip-higher), and `max(1, int(clip_cov_ratio * n))` tokens drawn uniformly at
    random among those with `clip_cov_lb < C_t < clip_cov_ub` that PPO's clip did not already cut get loss 0 (no
    gradient; verl multiplies their loss by 0).

    The draw: one `paddle.rand([bs, T])` from paddle's global generator (seeded by the run, restored on resume), the
    candidates with the smallest draws (a uniform random subset, as verl's `randperm`). Defaults 2e-4, 1, 5 (the
    paper's and verl's). `clip_low` / `clip_high`: PPO's clip fractions; the dropped tokens are not counted."""
    ratio = paddle.exp(token_log_ratio(log_prob, old_log_prob, response_mask))
    loss, info = clipped_surrogate(ratio, advantages, clip_ratio_low, clip_ratio_high, None)
    with paddle.no_grad():
        valid = response_mask > 0
        unclipped = -advantages * ratio
        clipped = -advantages * paddle.clip(ratio, 1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
        cov = token_covariance(log_prob, advantages, response_mask)
        # verl's clip_by_origin: tokens where PPO's clipped term is the larger one (already without gradient)
        candidates = valid & ~(clipped > unclipped) & (cov > clip_cov_lb) & (cov < clip_cov_ub)
        dropped = _first_k(paddle.rand(list(log_prob.shape), dtype="float32").astype(cov.dtype), candidates,
                           _selected_count(clip_cov_ratio, valid))
    return masked(loss, (~dropped).astype(loss.dtype)), info


@register_policy_loss("kl_cov", clip_keys=(), config_options=("kl_cov_ratio", "ppo_kl_coef"))
def kl_cov_policy_loss(log_prob: paddle.Tensor, old_log_prob: paddle.Tensor, advantages: paddle.Tensor,
                       response_mask: paddle.Tensor, clip_ratio_low: float, clip_ratio_high: float,
                       clip_ratio_c: Optional[float], kl_cov_ratio: float = 2e-4,
                       ppo_kl_coef: float = 1.0) -> LossOut:
    """KL-Cov: the unclipped surrogate `-A_t rho_t` (no PPO clip, as the paper and verl), plus
    `ppo_kl_coef |l_t - l^old_t|` on the `max(1, int(kl_cov_ratio * n))` tokens of largest `C_t` (ties: the first
    in row-major order; verl's `torch.topk` leaves them unspecified). Defaults 2e-4 and 1 (verl's; the paper uses
    k = 2e-3 on Qwen2.5-7B). `rho_t`, and the log-ratio in the penalty, are clamped to +-20 in log space.

    Not advantage-weighted: with every advantage 0 the penalty still has a gradient wherever `l != l^old` (a second
    update_iters pass, a lagged sampler), so such a mini-batch is never skipped. No clip statistics."""
    log_ratio = token_log_ratio(log_prob, old_log_prob, response_mask)
    loss = -advantages * paddle.exp(log_ratio)
    with paddle.no_grad():
        valid = response_mask > 0
        cov = token_covariance(log_prob, advantages, response_mask)
        penalised = _first_k(-cov, valid, _selected_count(kl_cov_ratio, valid))
    return loss + masked(ppo_kl_coef * paddle.abs(log_ratio), penalised.astype(loss.dtype)), {}
