"""The critic's loss and statistics, and VAPO's positive-example rows (docs/algorithms.md section 8)."""
from typing import Dict, Union

import numpy as np
import paddle

from ._common import TensorLike, as_float, as_mask, check_same_shape, compute_dtype, masked
from .losses import aggregate_loss


def value_loss(values: TensorLike, old_values: TensorLike, returns: TensorLike, mask: TensorLike,
               clip_range_value: float, **agg: Union[int, float, paddle.Tensor, None]) -> Dict[str, paddle.Tensor]:
    """PaddleNLP's `RLHFValueLoss`: `0.5 * token-mean(max((V - R)^2, (V_old + clip(V - V_old, -c, c) - R)^2))`.

    Args:
        values: `[mb, T]` the critic's current values (carries the gradient).
        old_values: `[mb, T]` the values of the experience pass (constant); `returns`: `[mb, T]` the targets
            (constant; GAE's `A + V_old`).
        mask: `[mb, T]`, non-zero on valid tokens.
        clip_range_value: `c`, PaddleNLP's `clip_range_value` (the new value may move at most `c` from the old one
            before the clipped term takes over).
        **agg: `num_global_tokens` (and any other key of `global_denominators(mask, "token-mean")`), summed over
            the micro-batches and ranks of the mini-batch by the caller. With it the loss is this micro-batch's
            SHARE `sum / global tokens`, and the shares of all micro-batches and ranks add up to the whole-batch
            loss (the same loss and gradient whatever the split; `aggregate_loss`). Without it: the local mean.
    Returns:
        loss: scalar tensor as above.
        clip_frac: scalar tensor (detached), valid tokens where the clipped term is strictly the larger one (its
            gradient is then 0) divided by the same denominator as the loss: a share too, so summed over
            micro-batches and ranks it is the fraction over the whole mini-batch.
    The max picks one branch per token (`where`), so the gradient is exactly that branch's.
    """
    dtype = compute_dtype(values, old_values, returns)
    m = as_mask(mask, dtype)
    v, v_old, r = (as_float(x, dtype) for x in (values, old_values, returns))
    check_same_shape(values=v, old_values=v_old, returns=r, mask=m)
    # Padding zeroed BEFORE the arithmetic: garbage there (inf / NaN from the critic's padded positions) would
    # otherwise give NaN gradients through the unselected branch (0 * inf).
    v, v_old, r = masked(v, m), masked(v_old, m).detach(), masked(r, m).detach()
    # min(max(V, V_old - c), V_old + c): V itself, bit for bit, inside the range. `V_old + clip(V - V_old)` rounds
    # there (V - V_old is inexact when V and V_old are not within a factor 2), and the clipped term then wins by an
    # ulp on about 2 % of the tokens: clip_frac counted rounding, which differs between 1 process and 2 ranks.
    v_clipped = paddle.minimum(paddle.maximum(v, v_old - clip_range_value), v_old + clip_range_value)
    unclipped = paddle.square(v - r)
    clipped = paddle.square(v_clipped - r)
    clip_active = clipped > unclipped
    per_token = masked(0.5 * paddle.where(clip_active, clipped, unclipped), m)
    loss = aggregate_loss(per_token, m, "token-mean", **agg)
    with paddle.no_grad():
        clip_frac = aggregate_loss(clip_active.astype(dtype), m, "token-mean", **agg)
    return {"loss": loss, "clip_frac": clip_frac}


def _valid_numpy(x: TensorLike) -> np.ndarray:
    if isinstance(x, paddle.Tensor):
        x = x.numpy()
    return np.asarray(x, dtype=np.float64)


def explained_variance(values: TensorLike, returns: TensorLike, mask: TensorLike) -> float:
    """`1 - Var(R - V) / Var(R)` over the valid tokens (float64; numpy or paddle in, python float out).

    1: the critic predicts the returns exactly; 0: no better than their mean; negative: worse. NaN when there are
    no valid tokens or the returns do not vary (undefined; the metrics log skips non-finite values).
    """
    v, r = _valid_numpy(values), _valid_numpy(returns)
    m = _valid_numpy(mask) != 0
    if v.shape != r.shape or v.shape != m.shape:
        raise ValueError(f"shape mismatch: values={list(v.shape)}, returns={list(r.shape)}, mask={list(m.shape)}")
    if not m.any():
        return float("nan")
    var_r = r[m].var()
    return float(1.0 - (r[m] - v[m]).var() / var_r) if var_r > 0 else float("nan")


def positive_example_mask(scores: np.ndarray, valid: np.ndarray, min_reward: float) -> np.ndarray:
    """VAPO's positive examples (arXiv 2504.05118, section 3.3): the set T of the correct answers of the batch,
    whatever the other answers to the same prompt scored (an all-correct group counts in full, and a group of one
    too). With rewards that are not simply right / wrong, "correct" is a score of at least `min_reward`
    (Config.positive_min_reward: positive_example_min_reward, else the maximal reward minus 1e-6, as
    eval/accuracy). `scores` `[N]`, `valid` `[N]` bool (rows no reward function judged are never positive).
    Returns bool `[N]`."""
    scores = np.asarray(scores, dtype=np.float64).reshape(-1)
    valid = np.asarray(valid, dtype=bool).reshape(-1)
    if scores.shape != valid.shape:
        raise ValueError(f"scores and valid must have the same length, got {scores.shape[0]} and {valid.shape[0]}")
    if min_reward is None or not np.isfinite(min_reward):
        raise ValueError(f"positive_example_mask: min_reward must be a finite number, got {min_reward!r}")
    # A NaN score (unjudged) compares False, and `valid` excludes it anyway.
    return valid & (scores >= min_reward)
