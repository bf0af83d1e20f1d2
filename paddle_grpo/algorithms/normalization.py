"""Reward normalisation with running statistics, and batch whitening of advantages (docs/algorithms.md sections 1,
2)."""
from typing import Dict, Union

import numpy as np
import paddle

from ._common import TensorLike, as_float, as_mask, compute_dtype, masked_centered_var


class RunningRewardNormalizer:
    """Running mean / variance of scalar rewards, updated as PaddleNLP's GRPO / REINFORCE++ trainer does
    (`paddlenlp/rl/trainer/ppo_trainer.py: PPOTrainer.compute_reward_normalization`).

    For a batch with `n_b` rewards, mean `mean_b` and UNBIASED variance `var_b` (divided by `n_b - 1`, as
    `paddle.Tensor.var()`; taken as 0 for a batch of one reward, where PaddleNLP's would be NaN):
        delta = mean_b - mu;  mu' = mu + delta n_b / (N + n_b)
        var'  = (var N + var_b n_b + delta^2 N n_b / (N + n_b)) / (N + n_b);  N' = N + n_b
    (Chan et al.'s merge, fed with the unbiased batch variance: after the first batch `var` is that batch's
    unbiased variance, not the population variance of everything seen.) Initial state mean 0, var 1, count 0, as
    PaddleNLP's, so before the first update `normalize` is the identity. `normalize`: `(R - mu) / (sqrt(var) + eps)`,
    eps 1e-8, as PaddleNLP's.

    The update is done in float64 and the mean and variance are stored rounded to float32 (PaddleNLP keeps float32
    too, but rounds mean and std to bfloat16 when it normalises; here they are used in float32). The count is kept
    as an exact integer-valued float: a float32 count stops growing at 2^24 rewards. Pass the global batch (all
    ranks) so every rank keeps the same statistics. The checkpoint state is `{"mean", "var", "count"}`, unchanged
    from the earlier population-variance version, so its checkpoints load (and continue with this update).
    """

    def __init__(self, epsilon: float = 1e-8) -> None:
        self.epsilon = epsilon
        self.mean = np.float32(0.0)
        self.var = np.float32(1.0)
        self.count = 0.0

    @staticmethod
    def _to_numpy(rewards: TensorLike) -> np.ndarray:
        if isinstance(rewards, paddle.Tensor):
            rewards = rewards.astype("float32").numpy() if rewards.dtype != paddle.float64 else rewards.numpy()
        return np.asarray(rewards, dtype=np.float64).reshape(-1)

    def update(self, rewards: TensorLike) -> None:
        """Fold a batch of scalar rewards `[n]` (paddle tensor, numpy array or list) into the statistics."""
        batch = self._to_numpy(rewards)
        n_b = batch.size
        if n_b == 0:
            return
        mean_b = batch.mean()
        var_b = batch.var(ddof=1) if n_b > 1 else 0.0  # unbiased, as PaddleNLP's paddle.Tensor.var()
        n, mu, var = self.count, float(self.mean), float(self.var)
        total = n + n_b
        delta = mean_b - mu
        self.mean = np.float32(mu + delta * n_b / total)
        self.var = np.float32((var * n + var_b * n_b + delta * delta * n * n_b / total) / total)
        self.count = float(total)

    def normalize(self, rewards: TensorLike) -> Union[paddle.Tensor, np.ndarray]:
        """`(R - mu) / (sqrt(var) + 1e-8)` with the current statistics; a paddle tensor in gives a float32 paddle
        tensor out, anything else a float32 numpy array."""
        denominator = float(np.sqrt(np.float32(self.var)) + np.float32(self.epsilon))
        if isinstance(rewards, paddle.Tensor):
            return (as_float(rewards, "float32") - float(self.mean)) / denominator
        return ((np.asarray(rewards, dtype=np.float64) - float(self.mean)) / denominator).astype(np.float32)

    def update_and_normalize(self, rewards: TensorLike) -> Union[paddle.Tensor, np.ndarray]:
        """`update(rewards)` then `normalize(rewards)` (docs/algorithms.md section 1 normalises with the updated
        statistics)."""
        self.update(rewards)
        return self.normalize(rewards)

    __call__ = update_and_normalize

    def state_dict(self) -> Dict[str, float]:
        """Plain python floats, so the state can go into a JSON checkpoint file."""
        return {"mean": float(self.mean), "var": float(self.var), "count": float(self.count)}

    def set_state_dict(self, state: Dict[str, float]) -> None:
        self.mean = np.float32(state["mean"])
        self.var = np.float32(state["var"])
        self.count = float(state["count"])

    def __repr__(self) -> str:
        return f"RunningRewardNormalizer(mean={float(self.mean):.6g}, var={float(self.var):.6g}, count={self.count:g})"


def normalize_advantage(advantages: TensorLike, response_mask: TensorLike, epsilon: float = 1e-8) -> paddle.Tensor:
    """`(A - mean) / (std + 1e-8) * m` over all valid tokens of the batch (docs/algorithms.md section 2).

    `advantages`, `response_mask`: `[bs, T]`. `std` is unbiased (Bessel; with one valid token it is taken as 0).
    Pass the global batch. Returns `[bs, T]` float32 (float64 for float64 input), 0 on masked positions.
    """
    dtype = compute_dtype(advantages)
    values = as_float(advantages, dtype)
    mask = as_mask(response_mask, dtype)
    centered, var = masked_centered_var(values, mask)
    return centered / (paddle.sqrt(var) + epsilon)
