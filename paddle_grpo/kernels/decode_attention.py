"""A decode step's attention in either cache layout (numpy, float32), split over the CPU threads where it is large.

The decode engine (policy/decode_engine.py) calls `decode_attention` once a layer. `row_attention` is the per-row
layout, every row's cache holding its whole context [N, KV, S, d] (one sample per prompt: evaluation, or
PADDLE_GRPO_SHARED_PREFIX=0); kernels/prefix_attention.py is the shared-prefix layout. The per-row scores take the
orientation prefix_attention.py measured for its products: q K^T while g * S <= SMALL_PRODUCT, else (K q^T)^T, which
numpy's OpenBLAS runs through its small-matrix kernel either way; q K^T past 1,200 outputs goes its general path,
1.3-2.9x as long at 100 rows x 436 slots on a Zen 4 core (the GSM8K evaluation's last steps). Each score is the same
sum of d products either way; on that Zen 4 the two orientations gave the same bits, which other BLAS kernels need not
(tests/policy/test_decode_attention.py bounds the difference).

Threads: a step's attention mostly reads the cache (GSM8K's 100 rows x 3 key-value heads x ~300 slots: 1.4 GB a step
over 30 layers), which one core does at ~8 GB/s here. With several threads (numpy_kernels.threads()) and at least
SPLIT_FROM slots read per layer, the rows (per-row layout) or whole prompts (shared prefix, each part's groups at the
whole's width) are split over numpy_kernels.parallel_ranges, whose threads run numpy's loops without the GIL. Each part
runs the same products on the same operands per row or prompt as the whole would (numpy's batched matmul is one BLAS
call per matrix) and the same softmax per row: the same bits at any thread count. Below SPLIT_FROM (a 32-row rollout of
128 tokens after 47-token prompts reads 7,000 slots a layer on average, 13,400 at most) a layer's attention is a dozen
numpy calls of 10-100 us, and two Python threads handing the GIL to each other between them made it slower (3.2 s a
rollout against 2.1). The engine runs the steps whose attention splits under onednn.workers_sleep_between_products(),
without which paddle's spinning OpenMP threads took the second core from the split; the others as before (with the
workers put to sleep after every product, a 32 x 128 rollout at two threads took ~1 s longer: docs/PERFORMANCE.md,
"Generation").
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from .numpy_kernels import parallel_ranges, threads
from .prefix_attention import SMALL_PRODUCT, PromptGroups, shared_prefix_attention, softmax_

__all__ = ["SPLIT_FROM", "decode_attention", "row_attention", "slots_read", "splits"]

# Cache slots x key-value heads one layer's attention reads, from which it is split over the threads (measured on
# two Zen 4 cores, docs/PERFORMANCE.md "Generation": slower split at 7,000-13,400, faster at GSM8K's 55,800 and up).
SPLIT_FROM = 20_000


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


def slots_read(cache: tuple[np.ndarray, np.ndarray], prefix: Optional[tuple[np.ndarray, np.ndarray]] = None) -> int:
    """Cache slots x key-value heads one layer's attention reads: N x KV x S of the rows' caches [N, KV, S, d], plus
    P x KV x L of the shared prefix [P, KV, L, d]."""
    n = int(np.prod(cache[0].shape[:3]))
    return n if prefix is None else n + int(np.prod(prefix[0].shape[:3]))


def splits(cache: tuple[np.ndarray, np.ndarray], prefix: Optional[tuple[np.ndarray, np.ndarray]] = None) -> bool:
    """Whether `decode_attention` with these caches (its arguments) splits its work over the threads: several
    threads and rows (per-row layout) or prompts (shared prefix), and at least SPLIT_FROM slots read."""
    parts = cache[0].shape[0] if prefix is None else prefix[0].shape[0]
    return min(threads(), parts) > 1 and slots_read(cache, prefix) >= SPLIT_FROM


def decode_attention(q: np.ndarray, cache: tuple[np.ndarray, np.ndarray], mask: np.ndarray,
                     prefix: Optional[tuple[np.ndarray, np.ndarray]] = None, groups: Optional[PromptGroups] = None,
                     suffix_unmasked: bool = False) -> np.ndarray:
    """One decode step's attention of one layer. q [N, KV, g, d] (scaled); mask [N, S] over every slot attended.
    Per-row layout (`prefix` None): cache (k, v) [N, KV, S, d]. Shared prefix: prefix (k, v) [P, KV, L, d] of the
    prompts `groups`, cache (k, v) [N, KV, S - L, d] the rows' own slots (shared_prefix_attention's arguments,
    `suffix_unmasked` as there). Split over the threads where `splits` says (module docstring). Returns
    [N, KV, g, d] float32."""
    k, v = cache
    if not splits(cache, prefix):
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

    parallel_ranges(q.shape[0] if prefix is None else groups.prompts, rows if prefix is None else prompts)
    return out
