"""Vocab-parallel log-probs and entropy: the tensor-parallel ranks each hold a slice of the vocabulary's logits."""
from __future__ import annotations

from typing import Any

import paddle
import paddle.distributed as dist

from ..algorithms import gather_last
# The chunked LM head's maths, the floor below policy/ and parallel/ (docs/architecture.md).
from ..kernels.chunked_head import ChunkedLMHead, as_f32, chunk_logits, chunks, flat_inputs, shifted_statistics
from .differentiable import AllReduce, Identity


class VocabParallel:
    """Log-probs and entropy from vocab-parallel logits `[bs, T, V / tp]` without gathering the vocabulary, or
    (`chunked_logprobs_and_entropy`) from the hidden states and this rank's shard of the LM head, a chunk of
    positions at a time.

    `logprobs` / `entropy`, per position: the maximum logit (all-reduce MAX), the sum of exponentials and, for
    entropy, the sum of `exp(z - max) * z` (all-reduce SUM), and the label's logit from the rank whose shard holds
    it (all-reduce SUM of a masked gather). The SUM reductions pass gradients straight through, so each rank
    backpropagates into its own shard (Megatron's vocab-parallel cross-entropy)."""

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
        picked = gather_last(z, paddle.clip(local, 0, shard - 1).unsqueeze(-1)).squeeze(-1)
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

    def chunked_logprobs_and_entropy(self, hidden: paddle.Tensor, weight: paddle.Tensor, labels: paddle.Tensor, *,
                                     temperature: float = 1.0, chunk_size: int = 1024,
                                     with_entropy: bool | str = True, transpose_y: bool = False
                                     ) -> tuple[paddle.Tensor, paddle.Tensor | None]:
        """kernels/chunked_head.py's `chunked_logprobs_and_entropy` with the LM head split over the vocabulary:
        log-probs and entropy of the full distribution from this rank's shard, O(chunk_size x V / tp) extra memory.

        Args:
            hidden: `[n, T, H]` final hidden states, the same on every tensor-parallel rank.
            weight: this rank's shard of the LM head (rank r holds vocabulary ids `[r * V/tp, (r + 1) * V/tp)`, equal
                shards): `[H, V/tp]`, or `[V/tp, H]` with `transpose_y` (tied embeddings).
            labels: `[n, T]` GLOBAL token ids; negative ids (an ignore index) are read as id 0.
            temperature, chunk_size, with_entropy (True, False or "detached": no entropy gradient), transpose_y:
                as kernels/chunked_head.py's.
        Returns:
            `(logprobs [n, T] float32, entropy [n, T] float32 or None)`, the same on every rank.

        One collective in forward (an all-gather of 5 float32 statistics per position, after all chunks) and one
        in backward (the hidden states' gradient summed over the ranks: the head is column-parallel, so `hidden`
        enters through `differentiable.Identity`, as PaddleNLP's `parallel_matmul` does). The weight's gradient
        is this shard's own."""
        flat_h, flat_labels = flat_inputs(hidden, weight, labels, temperature, chunk_size, transpose_y)
        shard = weight.shape[0] if transpose_y else weight.shape[1]
        local = flat_labels - self.rank * shard
        inside = ((local >= 0) & (local < shard)).astype("float32")
        logp, ent = _VocabParallelHead.apply(Identity.apply(flat_h, self.group), weight,
                                             paddle.clip(local, 0, shard - 1), inside, self._gather,
                                             float(temperature), int(chunk_size), with_entropy, bool(transpose_y))
        n, t = labels.shape
        if not with_entropy:
            return logp.reshape([n, t]), None
        ent = ent.reshape([n, t])
        return logp.reshape([n, t]), (ent.detach() if with_entropy == "detached" else ent)

    def _gather(self, x: paddle.Tensor) -> paddle.Tensor:
        """`[tp, ...]`: every rank's `x`, in rank order (no gradient)."""
        parts: list[paddle.Tensor] = []
        dist.all_gather(parts, x, group=self.group)
        return paddle.stack(parts)


class _VocabParallelHead(ChunkedLMHead):
    """kernels/chunked_head.py's `ChunkedLMHead` on a vocabulary shard. Forward: each rank's per-position statistics of
    its shard, chunk by chunk (`shifted_statistics`), then ONE all-gather of them and their combination into the
    full distribution's log-prob, log-sum-exp and entropy. Backward: the parent's, unchanged (it needs only the
    saved global log-sum-exp and entropy to recompute a chunk's softmax, see its derivation), with the one-hot
    term of the label kept only on the rank that holds the label (`ctx.label_weight`)."""

    @staticmethod
    def forward(ctx, hidden: paddle.Tensor, weight: paddle.Tensor, labels: paddle.Tensor, inside: paddle.Tensor,
                gather: Any, temperature: float, chunk_size: int, with_entropy: bool | str, transpose_y: bool
                ) -> tuple[paddle.Tensor, paddle.Tensor]:
        w = as_f32(weight)
        stats = []
        for start, end in chunks(hidden.shape[0], chunk_size):
            m, picked, lse_s, mean_s = shifted_statistics(chunk_logits(hidden[start:end], w, transpose_y,
                                                                       temperature), labels[start:end],
                                                          with_entropy)
            stats.append(paddle.stack([m, lse_s, picked, inside[start:end],
                                       mean_s if with_entropy else paddle.zeros_like(m)], axis=-1))
        # [tp, N] each: rank r's row max, its logsumexp and label logit (both relative to its max), whether it
        # holds the label, and its sum p z relative to its max.
        m, lse_s, picked, owner, mean_s = gather(paddle.concat(stats)).unbind(axis=-1)
        # Re-shifted to the global row max M, every term stays small (exact as in one process). The full
        # distribution's logsumexp is the logsumexp of the shards' ones; its sum p z is the shards' sums p_r z
        # weighted by each shard's probability mass exp(lse_r - lse).
        top = paddle.max(m, axis=0)
        shift = m - top
        lse_r = lse_s + shift
        lse = paddle.logsumexp(lse_r, axis=0)
        logp = paddle.sum(owner * (picked + shift), axis=0) - lse
        if with_entropy:
            ent = lse - paddle.sum(paddle.exp(lse_r - lse) * (mean_s + shift), axis=0)
        else:
            ent = paddle.zeros_like(logp)
        ctx.temperature, ctx.chunk_size, ctx.with_entropy, ctx.transpose_y = (temperature, chunk_size, with_entropy,
                                                                              transpose_y)
        ctx.label_weight = inside
        ctx.save_for_backward(hidden, weight, labels, lse + top, ent, None)  # None: no bias (the parent saves one)
        return logp, ent
