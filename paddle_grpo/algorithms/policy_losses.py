"""Policy losses beyond PPO's clip: CISPO, GMPO and SAPO, registered by name (config key `policy_loss`).

Same contract as losses.py's: `fn(log_prob, old_log_prob, advantages, response_mask, clip_ratio_low,
clip_ratio_high, clip_ratio_c, **options) -> (pg_losses [bs, T], clip statistics {name: bool [bs, T]})`, called by
`compute_policy_loss`, which masks, weights and aggregates the per-token losses. `advantages` arrive masked (0 on
padding) and detached, `old_log_prob` detached. Where a paper leaves a choice open, the docstring says whose
published code (verl's `verl/trainer/ppo/core_algos.py`, TRL's `GRPOTrainer`) is followed.
"""
from typing import Dict, Optional, Tuple

import paddle

from ._common import masked
from .losses import register_policy_loss, token_log_ratio

LossOut = Tuple[paddle.Tensor, Dict[str, paddle.Tensor]]


@register_policy_loss("cispo", advantage_weighted=True, clip_keys=("clip_range_ratio_high",))
def cispo_policy_loss(log_prob: paddle.Tensor, old_log_prob: paddle.Tensor, advantages: paddle.Tensor,
                      response_mask: paddle.Tensor, clip_ratio_low: float, clip_ratio_high: float,
                      clip_ratio_c: Optional[float]) -> LossOut:
    """CISPO (MiniMax-M1, arXiv 2506.13585; weight capped at 1 + clip_range_ratio_high, gradient kept): REINFORCE
    with a truncated, stop-gradient importance weight.

    `L_t = -sg(min(rho_t, 1 + eps_high)) A_t l_t`, `rho_t = exp(clamp(l_t - l^old_t, -20, 20))`: the gradient is
    `-min(rho_t, 1 + eps_high) A_t grad(l_t)`, so a token whose ratio passed the bound keeps its gradient with the
    weight capped (PPO-clip zeroes it). Only the upper bound: the paper "did not impose a lower bound" (eps_low
    large) and TRL's `loss_type="cispo"` clamps with `max=` only; verl's `compute_policy_loss_cispo` also clamps
    below at 1 - eps_low, which is not followed. The bound is `1 + clip_ratio_high` (the paper's `1 + eps_high^IS`,
    verl's); TRL's `epsilon_high` for CISPO is the cap itself (ScaleRL's eps_max, recommended 5.0), i.e.
    `clip_range_ratio_high` 4.0 here. The loss value contains `l_t` itself (the paper's objective; verl's and TRL's
    value): it is not comparable to the PPO losses' values. `clip_high`: tokens whose weight was capped (their
    gradient is kept)."""
    ratio = paddle.exp(token_log_ratio(log_prob, old_log_prob, response_mask))
    weight = paddle.clip(ratio, max=1.0 + clip_ratio_high).detach()
    # log_prob is garbage on padding: 0 there (masked), so that 0 * inf cannot give NaN before the final mask
    loss = -weight * advantages * masked(log_prob, response_mask)
    return loss, {"clip_high": ratio > 1.0 + clip_ratio_high}


@register_policy_loss("gmpo", advantage_weighted=True, ratio_level="sequence", loss_agg_mode="seq-mean-token-mean")
@register_policy_loss("geo_mean", advantage_weighted=True, ratio_level="sequence",
                      loss_agg_mode="seq-mean-token-mean")
def gmpo_policy_loss(log_prob: paddle.Tensor, old_log_prob: paddle.Tensor, advantages: paddle.Tensor,
                     response_mask: paddle.Tensor, clip_ratio_low: float, clip_ratio_high: float,
                     clip_ratio_c: Optional[float]) -> LossOut:
    """GMPO (Geometric-Mean Policy Optimization, arXiv 2507.20673; the clip range in log space): the geometric
    mean of the token ratios of each sequence, each clipped in log space.

    Per token `c_t = sgn(A_t) min(sgn(A_t) d_t, sgn(A_t) clamp(d_t, -eps_low, eps_high))`, `d_t = l_t - l^old_t`
    (the pessimistic side only: the upper bound acts where A > 0, the lower where A < 0); per sequence
    `s_i = exp(clamp(mean_t c_t, -20, 20))` and `A_i = mean_t A_t`; `L_i = -A_i s_i`, given to every token of the
    row so that `seq-mean-token-mean` (the paper's 1/G sum_i, verl's `torch.mean` over sequences; the loss is
    registered with it) averages `L_i` over the sequences. The clip bounds are `clip_range_ratio_low/high` taken
    in log space, as verl's `compute_policy_loss_geo_mean` reads `clip_ratio_low/high` (the paper uses 0.4, i.e.
    ratios within (e^-0.4, e^0.4)). `clip_high` / `clip_low`: tokens with A > 0 / A < 0 whose log-ratio is outside
    the bounds (verl's pg_clipfrac / pg_clipfrac_lower), whose gradient is 0."""
    mask = response_mask
    log_ratio = masked(log_prob - old_log_prob, mask)
    sign = paddle.sign(advantages)
    bounded = paddle.clip(log_ratio, -clip_ratio_low, clip_ratio_high)
    pessimistic = sign * paddle.minimum(sign * log_ratio, sign * bounded)
    tokens = paddle.clip(mask.sum(-1), min=1.0)
    seq_log_ratio = paddle.clip(masked(pessimistic, mask).sum(-1) / tokens, -20.0, 20.0)
    seq_advantage = advantages.sum(-1) / tokens  # advantages are 0 on padding already
    loss = (-seq_advantage * paddle.exp(seq_log_ratio)).unsqueeze(-1).expand_as(log_prob)
    return loss, {"clip_high": (advantages > 0) & (log_ratio > clip_ratio_high),
                  "clip_low": (advantages < 0) & (log_ratio < -clip_ratio_low)}


@register_policy_loss("sapo", advantage_weighted=True, loss_agg_mode="seq-mean-token-mean", clip_keys=(),
                      config_options=(("sapo_temperature_pos", "temperature_pos"),
                                      ("sapo_temperature_neg", "temperature_neg")))
def sapo_policy_loss(log_prob: paddle.Tensor, old_log_prob: paddle.Tensor, advantages: paddle.Tensor,
                     response_mask: paddle.Tensor, clip_ratio_low: float, clip_ratio_high: float,
                     clip_ratio_c: Optional[float], temperature_pos: float = 1.0,
                     temperature_neg: float = 1.05) -> LossOut:
    """SAPO (Soft Adaptive Policy Optimization, Qwen, arXiv 2511.20347): a smooth temperature-controlled gate in
    place of the hard clip.

    `L_t = -f(rho_t; tau_t) A_t`, `f(r; tau) = sigmoid(tau (r - 1)) 4 / tau`, `tau_t = temperature_pos` where
    A_t > 0 else `temperature_neg`, `rho_t = exp(clamp(l_t - l^old_t, -20, 20))`. Its gradient
    `-4 sigma (1 - sigma) rho_t A_t grad(l_t)` equals REINFORCE's at rho = 1 and fades smoothly as rho moves away
    (faster with a larger tau); no token is cut off. Token-level, aggregated `seq-mean-token-mean` (the paper's
    1/G sum_i 1/|y_i| sum_t; verl's `compute_policy_loss_sapo` forces it), defaults tau_pos 1.0, tau_neg 1.05 (the
    paper's, verl's `tau_pos`/`tau_neg`); the per-token loss is TRL's `loss_type="sapo"` too, whose key names
    `sapo_temperature_pos/neg` are used here. The clip range does not enter; no clip statistics."""
    ratio = paddle.exp(token_log_ratio(log_prob, old_log_prob, response_mask))
    tau = paddle.where(advantages > 0, paddle.full_like(ratio, temperature_pos),
                       paddle.full_like(ratio, temperature_neg))
    gate = paddle.nn.functional.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)
    return -gate * advantages, {}
