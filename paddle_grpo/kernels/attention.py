"""Attention over blocks of queries: the `[rows, heads, Sq, Sk]` scores of a long completion never exist at once.

The lean decoder forward (policy/fast_decoder.py) materialises, per layer, the scores, the softmax probabilities (kept
by autograd for the backward) and one additive mask of that shape. At 8 completions of 2,048 tokens with 14 heads
each is 8 x 14 x 2,047 x 2,111 float32 = 1.9 GB, so a 2-layer model needs over 8 GB for attention alone.
`blockwise_attention` computes the same attention `block` queries at a time, forward and backward
(`_BlockwiseAttention`, a `paddle.autograd.PyLayer` that keeps only q, k, v, the output and two numbers per query,
the row max and the log of the sum, and recomputes each block's probabilities in backward, as FlashAttention does;
Dao et al. 2022, arXiv:2205.14135, Algorithm 2). Every query row still sees all its keys in one block, so each
softmax is computed exactly as unblocked; the mask is kept compact (`[B, 1, 1, Sq, Sk]`) and broadcast per block.
Extra memory: O(block x Sk) per head instead of O(Sq x Sk).

On CPU the per-block softmax and its backward's elementwise work run as numpy kernels over the scores' own memory
(numpy_kernels.py): paddle's CPU max / exp / sum / divide kernels are single-threaded and cost more than the block's
two matrix products. `_softmax_` / `_probabilities_` / `_score_gradient_` hold both implementations.
"""
from __future__ import annotations

import numpy as np
import paddle
from paddle.autograd import PyLayer

from .numpy_kernels import enabled, parallel_ranges, writable_view

__all__ = ["blockwise_attention", "query_block"]

# Scores of at most this many float32 elements (16 MB) per block; and the blocked path is taken only when the whole
# scores tensor would hold more than BLOCK_ABOVE elements (32 MB). Measured forward + backward with the numpy kernels,
# 8 rows x 14 heads, 2 threads: at 512 x 576 scores one batched product takes 477 ms, blocks of 32 / 64 / 128
# queries 392 / 353 / 383 ms; at 1024 x 1088, 1664 ms against 1126 / 1063 / 1246 ms; at 128 x 192 both ~40 ms, and
# below the threshold the tiny shapes of the quickstart keep their exact numbers.
BLOCK_ELEMENTS = 1 << 22
BLOCK_ABOVE = 1 << 23


def query_block(rows: int, heads: int, queries: int, keys: int, *, block_elements: int = BLOCK_ELEMENTS,
                above: int = BLOCK_ABOVE) -> int | None:
    """Queries per block for attention scores `[rows, heads, queries, keys]`, or None when they are small enough
    (at most `above` elements) to be computed at once."""
    if rows * heads * queries * keys <= above:
        return None
    return max(1, min(queries, block_elements // max(1, rows * heads * keys)))


def _block_scores(q: paddle.Tensor, k: paddle.Tensor) -> paddle.Tensor:
    """Scores of a block of queries: q [B, KV, g, b, d] (pre-scaled), k [B, KV, Sk, d] -> q k^T [B, KV, g, b, Sk],
    a fresh tensor the caller changes in place (on CPU a new tensor of this size costs more than the elementwise
    op itself)."""
    B, KV, g, b, d = q.shape
    return paddle.matmul(q.reshape([B, KV, g * b, d]), k, transpose_y=True).reshape([B, KV, g, b, k.shape[2]])


def _over_heads(scores: paddle.Tensor, work) -> None:
    """Run `work(rows, i, j)` on every `[b, Sk]` slice of scores [B, KV, g, b, Sk] (numpy views; i the batch row,
    j the flattened KV * g head), the slices split over the CPU threads."""
    B, KV, g, b, Sk = scores.shape
    heads = KV * g
    view = writable_view(scores).reshape(B, heads, b, Sk)

    def run(start: int, end: int) -> None:
        for f in range(start, end):
            work(view[f // heads, f % heads], f // heads, f % heads)

    parallel_ranges(B * heads, run)


def _softmax_(scores: paddle.Tensor, bias: paddle.Tensor, s: int, e: int) -> paddle.Tensor:
    """softmax(scores + bias[..., s:e, :]) over the last axis, in scores' memory, and the row max and log of the
    row sum [B, KV, g, b, 2] (kept apart, not m + log(total): for a query that sees no key, m is the mask value
    (-3.4e38) and adding log(total) to it would round it away). bias: the whole [B, 1, 1, Sq, Sk] mask."""
    if not (enabled(scores) and enabled(bias)):
        scores.add_(bias[:, :, :, s:e].expand(scores.shape))
        m = paddle.max(scores, axis=-1, keepdim=True)
        p = scores.subtract_(m).exp_()
        total = paddle.sum(p, axis=-1, keepdim=True)
        p.divide_(total)
        return paddle.concat([m, paddle.log(total)], axis=-1)
    B, KV, g, b, Sk = scores.shape
    mask = writable_view(bias).reshape(B, -1, Sk)[:, s:e]
    stats = np.empty((B, KV * g, b, 2), dtype=np.float32)

    def work(rows, i, j):
        rows += mask[i]
        m = rows.max(axis=1)
        rows -= m[:, None]
        np.exp(rows, out=rows)
        total = rows.sum(axis=1)
        rows /= total[:, None]
        stats[i, j, :, 0], stats[i, j, :, 1] = m, np.log(total)

    _over_heads(scores, work)
    return paddle.to_tensor(stats.reshape(B, KV, g, b, 2))


def _probabilities_(scores: paddle.Tensor, bias: paddle.Tensor, s: int, e: int, lse: paddle.Tensor
                    ) -> paddle.Tensor:
    """The block's probabilities again, in scores' memory, from the saved row max and log-sum lse
    [B, KV, g, b, 2]: exp(scores + bias - m - log total)."""
    if not (enabled(scores) and enabled(bias)):
        scores.add_(bias[:, :, :, s:e].expand(scores.shape))
        return scores.subtract_(lse[..., 0:1]).subtract_(lse[..., 1:2]).exp_()
    B, KV, g, b, Sk = scores.shape
    mask = writable_view(bias).reshape(B, -1, Sk)[:, s:e]
    shift = lse.numpy().reshape(B, KV * g, b, 2)

    def work(rows, i, j):
        rows += mask[i]
        rows -= shift[i, j, :, 0:1]
        rows -= shift[i, j, :, 1:2]
        np.exp(rows, out=rows)

    _over_heads(scores, work)
    return scores


def _score_gradient_(p: paddle.Tensor, dp: paddle.Tensor, D: paddle.Tensor) -> paddle.Tensor:
    """dS = P * (dP - D) [B, KV, g, b, Sk], in p's memory (dp is changed too). D: [B, KV, g, b]."""
    if not (enabled(p) and enabled(dp)):
        return p.multiply_(dp.subtract_(D.unsqueeze(-1)))
    B, KV, g, b, Sk = p.shape
    dpv = writable_view(dp).reshape(B, KV * g, b, Sk)
    dv = D.numpy().reshape(B, KV * g, b)

    def work(rows, i, j):
        grad = dpv[i, j]
        grad -= dv[i, j, :, None]
        rows *= grad

    _over_heads(p, work)
    return p


class _BlockwiseAttention(PyLayer):
    """softmax(q k^T + bias) v over blocks of queries; backward recomputes each block's probabilities from the saved
    row max and log-sum. With P = softmax(S), O = P v and dO the output's gradient:
        dv = P^T dO,  dP = dO v^T,  dS = P * (dP - D) with D = rowsum(dO * O) (= rowsum(P * dP)),
        dq = dS k,  dk = dS^T q
    (q arrives pre-scaled by 1/sqrt(d), so these are the gradients of the scaled q; autograd applies the scale)."""

    @staticmethod
    def forward(ctx, q: paddle.Tensor, k: paddle.Tensor, v: paddle.Tensor, bias: paddle.Tensor, block: int
                ) -> paddle.Tensor:
        B, KV, g, Sq, d = q.shape
        outs, lses = [], []
        for s in range(0, Sq, block):
            e = min(s + block, Sq)
            p = _block_scores(q[:, :, :, s:e], k)
            lses.append(_softmax_(p, bias, s, e))
            outs.append(paddle.matmul(p.reshape([B, KV, g * (e - s), -1]), v).reshape([B, KV, g, e - s, d]))
        out = paddle.concat(outs, axis=3)
        ctx.block = block
        ctx.save_for_backward(q, k, v, bias, out, paddle.concat(lses, axis=3))  # [B, KV, g, Sq, 2]
        return out

    @staticmethod
    def backward(ctx, dout: paddle.Tensor) -> tuple:
        q, k, v, bias, out, lse = ctx.saved_tensor()
        B, KV, g, Sq, d = q.shape
        Sk = k.shape[2]
        D = paddle.sum(dout * out, axis=-1)                                     # [B, KV, g, Sq]
        dq, dk, dv = [], paddle.zeros_like(k), paddle.zeros_like(v)
        for s in range(0, Sq, ctx.block):
            e = min(s + ctx.block, Sq)
            n = g * (e - s)
            p = _probabilities_(_block_scores(q[:, :, :, s:e], k), bias, s, e, lse[:, :, :, s:e])
            do = dout[:, :, :, s:e].reshape([B, KV, n, d])
            dv.add_(paddle.matmul(p.reshape([B, KV, n, Sk]), do, transpose_x=True))
            dp = paddle.matmul(do, v, transpose_y=True).reshape([B, KV, g, e - s, Sk])
            ds = _score_gradient_(p, dp, D[:, :, :, s:e]).reshape([B, KV, n, Sk])
            dq.append(paddle.matmul(ds, k).reshape([B, KV, g, e - s, d]))
            dk.add_(paddle.matmul(ds, q[:, :, :, s:e].reshape([B, KV, n, d]), transpose_x=True))
        return paddle.concat(dq, axis=3), dk, dv, None


def blockwise_attention(q: paddle.Tensor, k: paddle.Tensor, v: paddle.Tensor, bias: paddle.Tensor, block: int
                        ) -> paddle.Tensor:
    """Grouped-query attention `softmax(q k^T + bias) v`, `block` queries at a time (forward and backward).

    q: [B, KV, g, Sq, d], already multiplied by 1/sqrt(d); k, v: [B, KV, Sk, d]; bias: [B, 1, 1, Sq, Sk] float32
    additive mask (0 kept, a large negative value masked; no gradient). Returns [B, KV, g, Sq, d]."""
    if block < 1:
        raise ValueError(f"block must be >= 1, got {block}")
    bias = bias.detach()
    return _BlockwiseAttention.apply(q, k, v, bias, int(block))
