"""Vocab-parallel log-probs and entropy: the tensor-parallel ranks each hold a slice of the vocabulary's logits."""
from __future__ import annotations

from typing import Any

import paddle
import paddle.distributed as dist

from .differentiable import AllReduce


class VocabParallel:
    """Log-probs and entropy from vocab-parallel logits `[bs, T, V / tp]` without gathering the vocabulary.

    Per position: the maximum logit (all-reduce MAX), the sum of exponentials and, for entropy, the sum of
    `exp(z - max) * z` (all-reduce SUM), and the label's logit from the rank whose shard holds it (all-reduce SUM
    of a masked gather). The SUM reductions pass gradients straight through, so each rank backpropagates into its
    own shard (Megatron's vocab-parallel cross-entropy)."""

    def __init__(self, group: Any, rank: int, world: int) -> None:
        self.group, self.rank, self.world = group, rank, world

    def _sum(self, x: paddle.Tensor) -> paddle.Tensor:
        return AllReduce.apply(x, self.group)

    def _max(self, x: paddle.Tensor) -> paddle.Tensor:
        x = x.detach().clone()
        dist.all_reduce(x, op=dist.ReduceOp.MAX, group=self.group)
        return x

    def logprobs(self, logits: paddle.Tensor, labels: paddle.Tensor, temperature: float = 1.0) -> paddle.Tensor:
        """Log-probability [bs, T] of `labels` [bs, T] under this rank's shard of `logits` [bs, T, V / tp]."""
        z = logits.astype("float32") / temperature
        shard = z.shape[-1]
        m = self._max(z.max(axis=-1, keepdim=True))
        sumexp = self._sum(paddle.exp(z - m).sum(axis=-1))
        local = labels.astype("int64") - self.rank * shard
        inside = ((local >= 0) & (local < shard)).astype("float32")
        picked = paddle.take_along_axis(z, paddle.clip(local, 0, shard - 1).unsqueeze(-1), axis=-1).squeeze(-1)
        target = self._sum(picked * inside)
        return target - m.squeeze(-1) - paddle.log(sumexp)

    def entropy(self, logits: paddle.Tensor, temperature: float = 1.0) -> paddle.Tensor:
        """Entropy [bs, T] of the full distribution whose shard `logits` [bs, T, V / tp] this rank holds."""
        z = logits.astype("float32") / temperature
        m = self._max(z.max(axis=-1, keepdim=True))
        e = paddle.exp(z - m)
        sumexp = self._sum(e.sum(axis=-1))
        weighted = self._sum((e * (z - m)).sum(axis=-1))
        return paddle.log(sumexp) - weighted / sumexp
