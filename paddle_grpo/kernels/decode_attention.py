"""A decode step's attention in the per-row cache layout (numpy, float32): every row's cache holds its whole context.

The decode engine (policy/decode_engine.py) takes it where a prompt has one sample (evaluation; G = 1) or the shared
prefix is switched off (PADDLE_GRPO_SHARED_PREFIX=0); kernels/prefix_attention.py is the other layout. The scores take
the orientation prefix_attention.py measured for its products: q K^T while g * S <= SMALL_PRODUCT, else (K q^T)^T,
which numpy's OpenBLAS runs through its small-matrix kernel either way; q K^T past 1,200 outputs goes its general
path, 1.3-2.9x as long at 100 rows x 436 slots on a Zen 4 core (the GSM8K evaluation's last steps). Each score is the
same sum of d products either way; on that Zen 4 the two orientations gave the same bits, which other BLAS kernels
need not (tests/policy/test_decode_attention.py bounds the difference).

Tried and not kept: splitting a step's attention over threads by rows (docs/PERFORMANCE.md, "Generation"): numpy's
small products and softmax hold the GIL between calls of tens of microseconds, and the split step was slower.
"""
from __future__ import annotations

import numpy as np

from .prefix_attention import SMALL_PRODUCT, softmax_

__all__ = ["row_attention"]


def row_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """softmax(q k^T + mask) v per row and key-value head: q [N, KV, g, d] (already scaled by 1/sqrt(d)), k and v
    [N, KV, S, d], mask [N, S] additive (0 or a large negative value). Returns [N, KV, g, d] float32."""
    N, KV, g, _ = q.shape
    S = k.shape[2]
    if g * S <= SMALL_PRODUCT:
        scores = np.matmul(q, k.transpose(0, 1, 3, 2))                               # [N, KV, g, S]
    else:  # written through a transposed view, so that the softmax reads contiguous rows
        scores = np.empty((N, KV, g, S), np.float32)
        scores.transpose(0, 1, 3, 2)[...] = np.matmul(k, q.transpose(0, 1, 3, 2))
    scores += mask[:, None, None, :]
    return np.matmul(softmax_(scores), v)
