"""Reward shaping applied to scalar rewards before the advantage estimator (ALGORITHMS.md section 1):
combining several reward functions, clipping, DAPO's overlong penalty. Running normalisation is in
`normalization.py`.

Functions accept a paddle tensor (and then return a float32 paddle tensor) or anything numpy can read (and then
return a float32 numpy array).
"""
import math
from typing import Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import paddle

from ._common import as_float


def clip_reward(rewards, c: Optional[float]):
    """`clip(R, -c, c)` (`clip_range_score`); `c=None` leaves the rewards unchanged. `[n] -> [n]` float32."""
    if c is not None and not c > 0:
        raise ValueError(f"clip_range_score must be > 0 (or None for no clipping), got {c!r}")
    if isinstance(rewards, paddle.Tensor):
        rewards = as_float(rewards, "float32")
        return rewards if c is None else paddle.clip(rewards, -float(c), float(c))
    rewards = np.asarray(rewards, dtype=np.float32)
    return rewards if c is None else np.clip(rewards, -c, c).astype(np.float32)


def overlong_penalty(response_lengths, max_dec_len: int, buffer_len: int, penalty_factor: float):
    """DAPO overlong reward shaping (arXiv 2503.14476), the term ADDED to the reward:
    `min(0, -(L - (L_max - L_b)) / L_b * f)`.

    0 up to `L_max - L_b` tokens, then falling linearly to `-f` at `L = L_max` (the formula taken literally, so a
    length beyond `L_max` would go below `-f`; generation stops at `L_max`). `response_lengths`: `[n]` generated
    tokens per completion (EOS included). Returns `[n]` float32.
    """
    if not buffer_len > 0:
        raise ValueError(f"overlong_reward_buffer must be > 0, got {buffer_len!r}")
    if buffer_len > max_dec_len:
        raise ValueError(f"overlong_reward_buffer ({buffer_len}) must not exceed max_dec_len ({max_dec_len})")
    start = float(max_dec_len - buffer_len)
    if isinstance(response_lengths, paddle.Tensor):
        lengths = as_float(response_lengths, "float32")
        return paddle.clip(-(lengths - start) / float(buffer_len) * float(penalty_factor), max=0.0)
    lengths = np.asarray(response_lengths, dtype=np.float64)
    return np.minimum(0.0, -(lengths - start) / buffer_len * penalty_factor).astype(np.float32)


Scores = Union[Mapping[str, Sequence[Optional[float]]], Sequence[Sequence[Optional[float]]]]


def combine_rewards(per_function_scores: Scores, weights: Union[None, Mapping[str, float], Sequence[float]] = None
                    ) -> Tuple[np.ndarray, np.ndarray, Dict[str, Optional[float]]]:
    """Weighted sum of several reward functions' scores, `R_i = sum_k w_k r_{k,i}` over the non-None terms.

    Args:
        per_function_scores: `{name: [score or None] * n}`, or a list of such lists (named "reward_0", ...).
            None means the function cannot judge that sample: the term is left out of that sample's sum.
        weights: `{name: w}` (every function named, nothing else), a list aligned with the functions, or None
            (all 1.0).
    Returns:
        total: `[n]` float32, 0 for a sample with no non-None term.
        has_any: `[n]` bool, False for a sample with no non-None term. Such a sample must get advantage 0 and must
            not enter its group's statistics: the trainer multiplies that sample's `response_mask` row by
            `has_any` before calling the advantage estimator (rows with no valid token are left out of every
            statistic and get advantage 0; see `advantages.py`) and before the loss (so it contributes nothing).
        means: `{name: mean of the function's raw (unweighted) non-None scores}`, None if it judged no sample.
    A non-finite score is an error (it names the function and the sample) rather than a silently skewed batch.
    """
    if isinstance(per_function_scores, Mapping):
        named = dict(per_function_scores)
    else:
        named = {f"reward_{k}": scores for k, scores in enumerate(per_function_scores)}
    if not named:
        raise ValueError("combine_rewards needs at least one reward function's scores")
    names: List[str] = list(named)

    if weights is None:
        w = {name: 1.0 for name in names}
    elif isinstance(weights, Mapping):
        if set(weights) != set(names):
            raise ValueError(f"reward_weights names {sorted(weights)} do not match the reward functions {names}")
        w = {name: float(weights[name]) for name in names}
    else:
        weights = list(weights)
        if len(weights) != len(names):
            raise ValueError(f"{len(weights)} reward_weights for {len(names)} reward functions {names}")
        w = {name: float(x) for name, x in zip(names, weights)}

    lengths = {name: len(scores) for name, scores in named.items()}
    if len(set(lengths.values())) != 1:
        raise ValueError(f"reward functions returned different numbers of scores: {lengths}")
    n = next(iter(lengths.values()))

    total = np.zeros(n, dtype=np.float64)
    has_any = np.zeros(n, dtype=bool)
    means: Dict[str, Optional[float]] = {}
    for name in names:
        judged = []
        for i, score in enumerate(named[name]):
            if score is None:
                continue
            value = float(score)
            if not math.isfinite(value):
                raise ValueError(f"reward function {name!r} returned {value} for sample {i}")
            judged.append(value)
            total[i] += w[name] * value
            has_any[i] = True
        means[name] = float(np.mean(judged)) if judged else None
    return total.astype(np.float32), has_any, means
