"""Reward shaping applied to scalar rewards before the advantage estimator (docs/algorithms.md section 1):
clipping and DAPO's overlong penalty. Running normalisation is in `normalization.py`; combining several reward
functions into one reward is `paddle_grpo.rewards.RewardSet` (it runs before any tensor exists).

Functions accept a paddle tensor (and then return a float32 paddle tensor) or anything numpy can read (and then
return a float32 numpy array).
"""
from typing import Optional, Union

import numpy as np
import paddle

from ._common import TensorLike, as_float


def clip_reward(rewards: TensorLike, c: Optional[float]) -> Union[paddle.Tensor, np.ndarray]:
    """`clip(R, -c, c)` (`clip_range_score`); `c=None` leaves the rewards unchanged. `[n] -> [n]` float32."""
    if c is not None and not c > 0:
        raise ValueError(f"clip_range_score must be > 0 (or None for no clipping), got {c!r}")
    if isinstance(rewards, paddle.Tensor):
        rewards = as_float(rewards, "float32")
        return rewards if c is None else paddle.clip(rewards, -float(c), float(c))
    rewards = np.asarray(rewards, dtype=np.float32)
    return rewards if c is None else np.clip(rewards, -c, c).astype(np.float32)


def overlong_penalty(response_lengths: TensorLike, max_dec_len: int, buffer_len: int,
                     penalty_factor: float) -> Union[paddle.Tensor, np.ndarray]:
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
