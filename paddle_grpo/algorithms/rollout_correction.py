"""Off-policy correction of the policy loss by the sampler's own log-probs: truncated (TIS) or masked (MIS)
importance sampling (docs/algorithms.md, "Rollout correction").

The tokens of a rollout were drawn from the sampler's distribution `pi_s` (the decoder's log-probs `l^s`, returned
with the tokens), but the policy loss treats them as drawn from `pi_old` (the trainer's log-probs `l^old` of the
same tokens). The two differ by numerics (another kernel, bf16 decoding) and, in asynchronous runs, by the sampler's
weights lagging the trainer's. The per-token importance ratio `r_t = pi_old / pi_s = exp(l^old_t - l^s_t)` turns the
expectation back into one under `pi_old`; its variance is kept in check by capping it (TIS, "Your efficient RL
framework secretly brings you off-policy RL training", Yao et al. 2025) or by dropping the tokens whose ratio leaves
a band (MIS, the IcePop masking of "When speed kills stability", Liu, Li et al. 2025). A third way, `clip`, has
no weights here: the policy loss takes its PPO ratio against the sampler's log-probs instead of `pi_old`
(step/policy_update.py: rl_loss), so PPO's clip bounds the trainer's drift from the policy that sampled (the "old
policy = sampling policy" form of PPO, Schulman et al. 2017, as asynchronous PPO trainers use it).

Pure functions of paddle tensors: no I/O, no model, no paddle.distributed.
"""
from typing import Dict, Optional, Tuple

import paddle

from ._common import TensorLike, as_float, as_mask, check_same_shape, compute_dtype, masked
from .registry import unknown_name

# The correction modes of config key `rollout_correction`.
ROLLOUT_CORRECTIONS = ("none", "tis", "mis", "clip")
# The levels a ratio is taken at: per token, or per sequence as GSPO's ratio (the geometric mean of the tokens').
ROLLOUT_CORRECTION_LEVELS = ("token", "sequence")
# As the policy loss's ratio: a log-ratio is clamped to [-20, 20] before exp, so a garbage log-prob cannot overflow.
_LOG_RATIO_CLAMP = 20.0


def rollout_correction(old_log_prob: TensorLike, sampler_log_prob: TensorLike, response_mask: TensorLike,
                       mode: str = "tis", cap: float = 2.0, min_ratio: float = 0.5, level: str = "token"
                       ) -> Tuple[Optional[paddle.Tensor], Dict[str, paddle.Tensor]]:
    """Per-token importance weights of the sampled tokens, and statistics of the ratio.

    Args:
        old_log_prob: `[bs, T]` the trainer's log-probs of the sampled tokens under the policy the loss calls old
            (recomputed before the update off-policy; the current log-probs, detached, on-policy).
        sampler_log_prob: `[bs, T]` the sampler's log-probs of the same tokens, as it sampled them.
        response_mask: `[bs, T]` non-zero on the tokens the loss trains on (padding and tool output are 0).
        mode: "none" or "clip" (no weights: only the statistics), "tis" (`w = min(r, cap)`) or "mis"
            (`w = r` where `min_ratio <= r <= cap`, else 0: the token is dropped).
        cap, min_ratio: TIS's cap C (also MIS's upper bound) and MIS's lower bound; need `cap > 0` and, for
            "mis", `0 <= min_ratio < cap` (the config asks more: `min_ratio < 1 < cap`, so that the ratio 1 of an
            exact on-policy token is never capped or dropped).
        level: "token": `r_t = exp(clamp(l^old_t - l^s_t, -20, 20))` per token; "sequence": every token of row i
            carries `r_i = exp(clamp(mean_t m_t (l^old_t - l^s_t), -20, 20))`, the geometric mean of its tokens'
            ratios, capped or masked as a whole (GSPO's level, arXiv 2507.18071).
    Returns:
        weights: `[bs, T]` detached, 0 on masked positions; None with mode "none".
        stats (detached 0-D tensors, over the valid tokens, 0 when there are none): `ratio_mean` and `ratio_max`
        of the per-token ratio `r_t` (whatever the level: the size of the gap), `capped_frac` the share of tokens
        whose weight was capped (TIS: `r > cap`; at sequence level every token of a capped row), `masked_frac` the
        share dropped (MIS: `r` outside `[min_ratio, cap]`); both 0 in the other modes.
    """
    if mode not in ROLLOUT_CORRECTIONS:
        raise unknown_name("rollout_correction", mode, ROLLOUT_CORRECTIONS)
    if level not in ROLLOUT_CORRECTION_LEVELS:
        raise unknown_name("rollout correction level", level, ROLLOUT_CORRECTION_LEVELS)
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
        tokens = mask.sum()
        stats = {"ratio_mean": masked(token_ratio, mask).sum() / paddle.clip(tokens, min=1.0),
                 # ratios are > 0, so the masked zeros never win the max (and no valid token gives 0)
                 "ratio_max": masked(token_ratio, mask).max() if token_ratio.size else zero,
                 "capped_frac": zero, "masked_frac": zero}
        if mode in ("none", "clip"):  # clip changes the loss's "old" (policy_update.rl_loss), not its weights
            return None, stats
        if level == "token":
            ratio = token_ratio
        else:
            seq_log_ratio = log_ratio.sum(-1) / paddle.clip(mask.sum(-1), min=1.0)
            seq_ratio = paddle.exp(paddle.clip(seq_log_ratio, -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP))
            ratio = seq_ratio.unsqueeze(-1).expand_as(token_ratio)
        frac = lambda hit: (hit & valid).astype(dtype).sum() / paddle.clip(tokens, min=1.0)  # noqa: E731
        if mode == "tis":
            weights = paddle.minimum(ratio, paddle.full_like(ratio, cap))
            stats["capped_frac"] = frac(ratio > cap)
        else:
            keep = (ratio >= min_ratio) & (ratio <= cap)
            weights = paddle.where(keep, ratio, paddle.zeros_like(ratio))
            stats["masked_frac"] = frac(~keep)
        return masked(weights, mask), stats
