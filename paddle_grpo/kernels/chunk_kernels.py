"""The elementwise work of the chunked LM head on one chunk's logits `z` [c, V]: its forward statistics and its
backward gradient, in two implementations with the same maths (chunked_head.py derives the formulas).

- numpy on CPU (numpy_kernels.py: a writable view of the logits' own memory, the rows split over the CPU threads,
  8 rows at a time so that a step's exp buffer stays in cache): one [512, 151,936] chunk's forward statistics add
  ~120 ms to its 500 ms GEMM, against ~530 ms with paddle ops (`python tools/bench/bench.py --ops`, "one chunk" rows).
- paddle ops: any other device (on GPU these kernels are fused and fast), or with `PADDLE_GRPO_NUMPY_KERNELS=0`.
"""
from __future__ import annotations

import numpy as np
import paddle

from ..algorithms import gather_last, subtract_at
from .numpy_kernels import enabled, parallel_ranges, writable_view

__all__ = ["accumulate_weight_gradient", "chunk_gradient", "shifted_statistics"]

# Rows per numpy step: small enough that a step's exp buffer (8 x 151,936 float32 = 4.9 MB) stays in cache.
_ROW_GROUP = 8
# Vocabulary columns per product in accumulate_weight_gradient: a [H, 8192] float32 temporary (29 MB at H = 896).
_VOCAB_BLOCK = 8192


def shifted_statistics(z: paddle.Tensor, labels: paddle.Tensor, with_entropy: bool
                       ) -> tuple[paddle.Tensor, paddle.Tensor, paddle.Tensor, paddle.Tensor | None]:
    """Per-row statistics of one chunk's logits `z` [c, V] (float32, overwritten) for `labels` [c] int64, each
    relative to the row maximum m: `(m, z[label] - m, logsumexp(z) - m, sum_v softmax(z)_v z_v - m or None)`,
    all [c] float32."""
    if not enabled(z):
        return _paddle_statistics(z, labels, with_entropy)
    c, v = z.shape
    zv, lab = writable_view(z), labels.numpy()
    out = np.zeros((4, c), dtype=np.float32)  # m, picked, logsumexp - m, sum p z - m

    def work(start: int, end: int) -> None:
        buf = np.empty((_ROW_GROUP, v), dtype=np.float32) if with_entropy else None
        for a in range(start, end, _ROW_GROUP):
            b = min(a + _ROW_GROUP, end)
            rows = zv[a:b]
            m = rows.max(axis=1)
            rows -= m[:, None]
            out[0, a:b] = m
            out[1, a:b] = rows[np.arange(b - a), lab[a:b]]
            if with_entropy:
                e = np.exp(rows, out=buf[:b - a])
                sum_e = e.sum(axis=1)
                out[3, a:b] = np.multiply(e, rows, out=e).sum(axis=1) / sum_e
            else:
                sum_e = np.exp(rows, out=rows).sum(axis=1)
            out[2, a:b] = np.log(sum_e)

    parallel_ranges(c, work)
    m, picked, lse_s, mean_s = (paddle.to_tensor(x) for x in out)
    return m, picked, lse_s, (mean_s if with_entropy else None)


def _paddle_statistics(z, labels, with_entropy):
    """shifted_statistics with paddle ops (any device)."""
    # Max-subtracted log-sum-exp: exp never sees a large logit, and `z - m` is reused for p and the entropy.
    # (Not F.log_softmax: superlinear in V on paddle's CPU kernels, docs/platform.md.)
    m = paddle.max(z, axis=-1, keepdim=True)
    zs = z.subtract_(m)
    e = paddle.exp(zs)
    sum_e = _row_sum(e)
    lse_s = paddle.log(sum_e)
    picked = gather_last(zs, labels.unsqueeze(-1)).squeeze(-1)
    mean_s = _row_sum(e.multiply_(zs)) / sum_e if with_entropy else None  # e is not needed after this
    return m.squeeze(-1), picked, lse_s, mean_s


def _row_sum(x: paddle.Tensor) -> paddle.Tensor:
    """`x.sum(-1)` of [c, V] as a matrix-vector product: paddle's CPU row reduction is ~10x slower (104 vs 11 ms at
    [512, 151,936])."""
    return paddle.matmul(x, paddle.ones([x.shape[-1], 1], dtype=x.dtype)).squeeze(-1)


def chunk_gradient(z: paddle.Tensor, labels: paddle.Tensor, lse: paddle.Tensor, ent: paddle.Tensor,
                   grad_logp: paddle.Tensor, grad_ent: paddle.Tensor | None, label_weight: paddle.Tensor | None,
                   temperature: float) -> paddle.Tensor:
    """dL/dlogits [c, V] of one chunk, computed in `z`'s memory (z: the chunk's logits / temperature, float32).

    With p = softmax(z), log p = z - lse, upstream gradients a (log-prob) and b (entropy) per row:
    `dL/dz = a * onehot(label) * label_weight - p * (a + b * (log p + H))`, and `dL/dlogits = dL/dz / temperature`.
    lse, ent, grad_logp, grad_ent, label_weight: [c] float32 (grad_ent None: no entropy gradient; label_weight None:
    1). labels: [c] int64."""
    if not enabled(z):
        return _paddle_gradient(z, labels, lse, ent, grad_logp, grad_ent, label_weight, temperature)
    c, v = z.shape
    zv, lab = writable_view(z), labels.numpy()
    lse_, ent_, a_ = lse.numpy(), ent.numpy(), grad_logp.numpy()
    b_ = None if grad_ent is None else grad_ent.numpy()
    onehot = a_ if label_weight is None else a_ * label_weight.numpy()
    scale = np.float32(-1.0 / temperature)

    def work(start: int, end: int) -> None:
        buf = np.empty((_ROW_GROUP, v), dtype=np.float32) if b_ is not None else None
        for s in range(start, end, _ROW_GROUP):
            e = min(s + _ROW_GROUP, end)
            rows = zv[s:e]
            rows -= lse_[s:e, None]                                     # log p
            a = a_[s:e, None]
            if b_ is not None:
                p = np.exp(rows, out=buf[:e - s])
                rows += ent_[s:e, None]
                rows *= b_[s:e, None]
                rows += a                                               # a + b (log p + H)
                rows *= p
            else:
                np.exp(rows, out=rows)
                rows *= a
            rows[np.arange(e - s), lab[s:e]] -= onehot[s:e]             # -dL/dz
            rows *= scale                                               # dL/dlogits

    parallel_ranges(c, work)
    return z


def _paddle_gradient(z, labels, lse, ent, grad_logp, grad_ent, label_weight, temperature):
    """chunk_gradient with paddle ops (any device)."""
    logp_all = z.subtract_(lse.unsqueeze(-1))
    p = paddle.exp(logp_all)
    a = grad_logp.unsqueeze(-1)
    if grad_ent is not None:
        # coeff = a + b (log p + H), built in logp_all's memory; dz = p * coeff - a * onehot = -dL/dz
        dz = p.multiply_(logp_all.add_(ent.unsqueeze(-1)).multiply_(grad_ent.unsqueeze(-1)).add_(a))
    else:
        dz = p.multiply_(a)
    del logp_all, p
    onehot = a if label_weight is None else a * label_weight.unsqueeze(-1)
    dz = subtract_at(dz, labels, onehot.squeeze(-1))
    return dz.scale_(-1.0 / temperature)


def accumulate_weight_gradient(dw: paddle.Tensor, h: paddle.Tensor, dz: paddle.Tensor, transpose_y: bool) -> None:
    """`dw += h^T dz` ([H, V] weight) or `dw += dz^T h` ([V, H], `transpose_y`), in place, for one chunk's hidden
    states h [c, H] and dL/dlogits dz [c, V] (all float32).

    With paddle ops the product is a fresh weight-sized tensor before the add (545 MB at V = 151,936, H = 896, at
    the moment of the backward when every activation is still held). On CPU numpy multiplies `_VOCAB_BLOCK`
    vocabulary columns at a time into a small buffer and adds each block in place."""
    if not (enabled(dw) and enabled(h) and enabled(dz)):
        dw.add_(paddle.matmul(dz, h, transpose_x=True) if transpose_y else paddle.matmul(h, dz, transpose_x=True))
        return
    w, hv, g = writable_view(dw), writable_view(h), writable_view(dz)
    vocab = g.shape[1]
    h_t = np.ascontiguousarray(hv.T)                                    # [H, c]: small
    buf = np.empty((h_t.shape[0], min(_VOCAB_BLOCK, vocab)), dtype=np.float32)
    for v0 in range(0, vocab, _VOCAB_BLOCK):
        v1 = min(v0 + _VOCAB_BLOCK, vocab)
        block = np.matmul(h_t, g[:, v0:v1], out=buf[:, :v1 - v0])       # [H, b] = h^T dz[:, v0:v1]
        if transpose_y:
            w[v0:v1] += block.T
        else:
            w[:, v0:v1] += block
