"""Off-policy correction of the policy loss by the sampler's own log-probs: truncated (TIS) or masked (MIS)
importance sampling at the token or the sequence level, and the off-policy diagnostics (docs/algorithms.md,
"Rollout correction").

The tokens of a rollout were drawn from the sampler's distribution `pi_s` (the decoder's log-probs `l^s`, returned
with the tokens), but the policy loss treats them as drawn from `pi_old` (the trainer's log-probs `l^old` of the
same tokens). The two differ by numerics (another kernel, bf16 decoding) and, in asynchronous runs, by the sampler's
weights lagging the trainer's. The per-token importance ratio `r_t = pi_old / pi_s = exp(l^old_t - l^s_t)` turns the
expectation back into one under `pi_old`; its variance is kept in check by capping it (TIS, "Your efficient RL
framework secretly brings you off-policy RL training", Yao et al. 2025) or by dropping the tokens whose ratio leaves
a band (MIS: per token, IcePop of the Ling team's Ring-1T, "Every Step Evolves", arXiv 2510.18855; per sequence,
Seq-MIS of "When Speed Kills Stability", Liu, Li et al. 2025, as verl's rollout correction implements it). The
levels are verl's (rollout_corr_helper.py): `token` (r_t), `sequence` (the product of the row's ratios, the
sequence's true importance ratio: Seq-TIS / Seq-MIS) and `geometric` (their geometric mean, GSPO's length
normalisation; verl keeps its band within 1.0001-1.001). A third way, `clip`, has no weights here: the policy loss
takes its PPO ratio against the sampler's log-probs instead of `pi_old` (step/policy_update.py: rl_loss), so PPO's
clip bounds the trainer's drift from the policy that sampled (the "old policy = sampling policy" form of PPO,
Schulman et al. 2017, verl's bypass mode).

Pure functions of paddle tensors: no I/O, no model, no paddle.distributed.
"""
from typing import Dict, Optional, Tuple

import paddle

from ._common import TensorLike, as_float, as_mask, check_same_shape, compute_dtype, masked
from .kl import kl_penalty
from .registry import unknown_name

# The correction modes of config key `rollout_correction`.
ROLLOUT_CORRECTIONS = ("none", "tis", "mis", "clip")
# The levels a ratio is taken at (config key `rollout_correction_level`, verl's names): per token; per sequence as
# the product of its tokens' ratios; per sequence as their geometric mean (GSPO's level). Until the product was added,
# "sequence" named the geometric mean; it now means what it means in verl and Seq-MIS (docs/algorithms.md).
ROLLOUT_CORRECTION_LEVELS = ("token", "sequence", "geometric")
# As the policy loss's ratio: a log-ratio is clamped to [-20, 20] before exp, so a garbage log-prob cannot overflow.
_LOG_RATIO_CLAMP = 20.0


def rollout_correction(old_log_prob: TensorLike, sampler_log_prob: TensorLike, response_mask: TensorLike,
                       mode: str = "tis", cap: float = 2.0, min_ratio: float = 0.5, level: str = "token"
                       ) -> Tuple[Optional[paddle.Tensor], Dict[str, paddle.Tensor]]:
    """Per-token importance weights of the sampled tokens, and statistics of the ratio.

    Args:
        old_log_prob: `[bs, T]` the trainer's log-probs of the sampled tokens under the policy the loss calls old
            (recomputed before the update off-policy; the current log-probs, detached, on-policy or with `clip`).
        sampler_log_prob: `[bs, T]` the sampler's log-probs of the same tokens, as it sampled them.
        response_mask: `[bs, T]` non-zero on the tokens the loss trains on (padding and tool output are 0).
        mode: "none" or "clip" (no weights: only the statistics), "tis" (`w = min(r, cap)`) or "mis"
            (`w = r` where `min_ratio <= r <= cap`, else 0: the token, or at a sequence level the row, is dropped).
        cap, min_ratio: TIS's cap C (also MIS's upper bound) and MIS's lower bound; need `cap > 0` and, for
            "mis", `0 <= min_ratio < cap` (the config asks more: `min_ratio < 1 < cap`, so that the ratio 1 of an
            exact on-policy token is never capped or dropped).
        level: with `d_t = l^old_t - l^s_t` on the row's valid tokens: "token": `r_t = exp(clamp(d_t, -20, 20))`;
            "sequence": every token of row i carries `r_i = exp(clamp(sum_t d_t, -20, 20))`, the product of its
            tokens' ratios (Seq-TIS / Seq-MIS, verl's "sequence"); "geometric": `r_i = exp(clamp(mean_t d_t, -20,
            20))`, their geometric mean (GSPO's length normalisation, arXiv 2507.18071; verl's "geometric").
    Returns:
        weights: `[bs, T]` detached, 0 on masked positions; None with mode "none" or "clip".
        stats (detached 0-D tensors, over the valid tokens, 0 when there are none, `ppl_ratio` then 1):
            `ratio_mean`, `ratio_max`: of the per-token ratio `r_t` (whatever the level: the size of the gap);
            `capped_frac`: the share of tokens whose weight was capped (TIS: `r > cap`; at a sequence level every
            token of a capped row); `masked_frac`: the share dropped (MIS); both 0 in the other modes;
            `kl`: the k3 estimate of KL(pi_s || pi_old), mean of `r_t - log r_t - 1` (docs/algorithms.md section
            3's k3 and its clamps; unbiased since the tokens were drawn from pi_s, and >= 0 per token);
            `weight_mean`, `weight_sq_mean`: token means of `w` and `w^2`, `w` the weights (tis, mis) or `r_t` (none,
            clip: the weight a correction would apply); `ess = weight_mean^2 / weight_sq_mean`, the normalised
            effective sample size `(sum w)^2 / (n sum w^2)` in (0, 1] (0 when every weight is 0);
            `log_ppl_diff`: token mean of `l^s_t - l^old_t`; `ppl_ratio = exp(clamp(log_ppl_diff, -20, 20))`, the
            trainer's perplexity over the sampler's on these tokens (> 1: the trainer finds them less likely).
    """
    if mode not in ROLLOUT_CORRECTIONS:
        raise unknown_name("rollout_correction", mode, ROLLOUT_CORRECTIONS)
    if level not in ROLLOUT_CORRECTION_LEVELS:
        raise unknown_name("rollout_correction_level", level, ROLLOUT_CORRECTION_LEVELS)
    if mode in ("tis", "mis") and not cap > 0:
        raise ValueError(f"rollout_correction_cap must be > 0, got {cap!r}")
    if mode == "mis" and not 0 <= min_ratio < cap:
        raise ValueError(f"rollout_correction_min must be in [0, rollout_correction_cap = {cap!r}), got {min_ratio!r}")
    dtype = compute_dtype(old_log_prob, sampler_log_prob)
    old = as_float(old_log_prob, dtype).detach()
    sampler = as_float(sampler_log_prob, dtype).detach()
    mask = as_mask(response_mask, dtype)
    check_same_shape(old_log_prob=old, sampler_log_prob=sampler, response_mask=mask)
    valid = mask > 0

    with paddle.no_grad():
        # Padding gets log-ratio 0 (ratio 1), so whatever it holds (0, or garbage) cannot reach a sum or a max.
        log_ratio = masked(old - sampler, mask)
        token_ratio = paddle.exp(paddle.clip(log_ratio, -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP))
        zero = paddle.zeros([], dtype=dtype)
        tokens = paddle.clip(mask.sum(), min=1.0)
        mean = lambda x: masked(x, mask).sum() / tokens  # noqa: E731 - a token mean over the valid tokens
        stats = {"ratio_mean": mean(token_ratio),
                 # ratios are > 0, so the masked zeros never win the max (and no valid token gives 0)
                 "ratio_max": masked(token_ratio, mask).max() if token_ratio.size else zero,
                 "capped_frac": zero, "masked_frac": zero,
                 # k3 with l^s as the policy and l^old as the "reference": d = l^old - l^s = log r_t
                 "kl": mean(kl_penalty(masked(sampler, mask), masked(old, mask), "k3")),
                 "log_ppl_diff": -mean(log_ratio)}
        stats["ppl_ratio"] = paddle.exp(paddle.clip(stats["log_ppl_diff"], -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP))
        weights = None
        if mode in ("tis", "mis"):  # clip changes the loss's "old" (policy_update.rl_loss), not its weights
            if level == "token":
                ratio = token_ratio
            else:
                seq_log_ratio = log_ratio.sum(-1)  # padding holds 0: the sum over the valid tokens
                if level == "geometric":
                    seq_log_ratio = seq_log_ratio / paddle.clip(mask.sum(-1), min=1.0)
                seq_ratio = paddle.exp(paddle.clip(seq_log_ratio, -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP))
                ratio = seq_ratio.unsqueeze(-1).expand_as(token_ratio)
            frac = lambda hit: (hit & valid).astype(dtype).sum() / tokens  # noqa: E731
            if mode == "tis":
                weights = paddle.minimum(ratio, paddle.full_like(ratio, cap))
                stats["capped_frac"] = frac(ratio > cap)
            else:
                keep = (ratio >= min_ratio) & (ratio <= cap)
                weights = paddle.where(keep, ratio, paddle.zeros_like(ratio))
                stats["masked_frac"] = frac(~keep)
            weights = masked(weights, mask)
        w = token_ratio if weights is None else weights
        stats["weight_mean"], stats["weight_sq_mean"] = mean(w), mean(w * w)
        stats["ess"] = effective_sample_size(stats["weight_mean"], stats["weight_sq_mean"])
        return weights, stats


def effective_sample_size(weight_mean: paddle.Tensor, weight_sq_mean: paddle.Tensor) -> paddle.Tensor:
    """The normalised effective sample size `mean(w)^2 / mean(w^2) = (sum w)^2 / (n sum w^2)` (Kong 1992) from
    the token means of the weights and of their squares (0-D each; means over any split of the tokens add up
    token-weighted, which is how the update combines micro-batches and ranks): in (0, 1], 1 when every weight is
    equal, 0 when every weight is 0 (nothing left to estimate from)."""
    positive = weight_sq_mean > 0
    return paddle.where(positive, weight_mean * weight_mean / paddle.where(positive, weight_sq_mean,
                                                                           paddle.ones_like(weight_sq_mean)),
                        paddle.zeros_like(weight_sq_mean))
