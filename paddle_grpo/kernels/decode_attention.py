"""A decode step's attention in either cache layout, split over the CPU threads (numpy, float32).

The decode engine (policy/decode_engine.py) runs a step's matrix products on every thread paddle's kernels use, but
its attention is numpy's small batched products and softmax on one: at two threads it was a quarter of a 32-row
SmolLM2 step, and the evaluation's 100 rows of ~400 slots read ~1.4 GB of cache a step (docs/PERFORMANCE.md,
"Generation"). `decode_attention` splits the rows (per-row layout) or whole prompts (shared prefix, with every part's
groups at the whole's width) over `numpy_kernels.parallel_ranges`, whose threads run numpy's loops without the GIL.
Each part runs the same products on the same operands per row or prompt as the whole would (numpy's batched matmul
is one BLAS call per matrix) and the same softmax per row, so the output is the same bits at any thread count.

`row_attention` is the per-row layout: every row's cache holds its whole context [N, KV, S, d]. Its scores take the
orientation prefix_attention.py measured: q K^T while g * S <= SMALL_PRODUCT, else (K q^T)^T, which numpy's OpenBLAS
runs through its small-matrix kernel either way (its general path, past 1,200 outputs, took 2-3x as long at 100 rows
x 436 slots on a Zen 4 core); each score is then the same sum of d products (tests/policy/test_decode_attention.py
checks the bits against q K^T).
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from .numpy_kernels import parallel_ranges, threads
from .prefix_attention import SMALL_PRODUCT, PromptGroups, shared_prefix_attention, softmax_

__all__ = ["decode_attention", "row_attention"]


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


def decode_attention(q: np.ndarray, cache: tuple[np.ndarray, np.ndarray], mask: np.ndarray,
                     prefix: Optional[tuple[np.ndarray, np.ndarray]] = None, groups: Optional[PromptGroups] = None,
                     suffix_unmasked: bool = False) -> np.ndarray:
    """One decode step's attention, split over the threads. q [N, KV, g, d] (scaled); mask [N, S] over every slot
    attended. Per-row layout (`prefix` None): cache (k, v) [N, KV, S, d]. Shared prefix: prefix (k, v) [P, KV, L, d]
    of the prompts `groups`, cache (k, v) [N, KV, S - L, d] the rows' own slots (shared_prefix_attention's arguments,
    `suffix_unmasked` as there). Returns [N, KV, g, d] float32."""
    k, v = cache
    N = q.shape[0]
    parts = N if prefix is None else groups.prompts
    if min(threads(), parts) <= 1:
        if prefix is None:
            return row_attention(q, k, v, mask)
        return shared_prefix_attention(q, prefix, cache, mask, groups, suffix_unmasked=suffix_unmasked)
    out = np.empty(q.shape, np.float32)

    def rows(a: int, b: int) -> None:
        out[a:b] = row_attention(q[a:b], k[a:b], v[a:b], mask[a:b])

    def prompts(a: int, b: int) -> None:
        r0, r1, sub = groups.part(a, b)
        out[r0:r1] = shared_prefix_attention(q[r0:r1], (prefix[0][a:b], prefix[1][a:b]), (k[r0:r1], v[r0:r1]),
                                             mask[r0:r1], sub, suffix_unmasked=suffix_unmasked)

    parallel_ranges(parts, rows if prefix is None else prompts)
    return out
