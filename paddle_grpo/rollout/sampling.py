"""Counter-based sampling noise: the random number for (row, position) depends only on (seed, row key, position).

Why: with paddle's global generator, which completion a row gets depends on how many rows were sampled before it
in the same process, so splitting a batch across data-parallel ranks or into `rollout_max_num_seqs` chunks changes
the samples. Keying each row's noise by a global id (seed, step, global row index) makes a rollout identical
whatever the split, and a resumed run needs no generator state to continue exactly.

The seed policy: `row_keys(seed, step, global_rows)`; the uniform for position t of a row is
`splitmix64(key ^ splitmix64(t))` mapped to [0, 1). Sampling from a distribution p with a uniform u is inverse-CDF:
the first token whose cumulative probability exceeds u (distributionally the same as multinomial sampling), found
in two levels (blocks, then tokens) so that a decode step at a 152k vocabulary does no float64 pass over [n, V].
`candidates` restricts top-k / top-p sampling to a `paddle.topk` of a few candidates instead of sorting the vocabulary.
"""
from __future__ import annotations

from typing import Optional, Tuple

import numpy as np
import numpy.typing as npt
import paddle

from ..algorithms import gather_last

_MASK = (1 << 64) - 1


def _splitmix64(x):
    """Vectorised SplitMix64 finaliser on uint64 numpy arrays (a bijective, well-mixing 64-bit hash)."""
    x = np.asarray(x, dtype=np.uint64)
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def row_keys(seed: int, step: int, rows: npt.ArrayLike) -> np.ndarray:
    """One 64-bit key per row: rows are global row indices (data-parallel rank offsets included). [n] uint64."""
    base = _splitmix64(np.uint64((int(seed) * 1_000_003 + int(step)) & _MASK))
    return _splitmix64(base ^ _splitmix64(np.asarray(rows, dtype=np.uint64)))


def uniforms(keys: npt.ArrayLike, position: npt.ArrayLike) -> np.ndarray:
    """The uniform in [0, 1) for each row key at decode position `position`: one int for all rows, or [n] per row
    (the multi-turn loop: each row's own completion position, so its draws do not depend on the other rows or on
    tool timing). [n] float64."""
    bits = _splitmix64(np.asarray(keys, dtype=np.uint64) ^ _splitmix64(np.asarray(position, dtype=np.uint64)))
    return (bits >> np.uint64(11)).astype(np.float64) / float(1 << 53)


def sample_with_uniforms(probs: paddle.Tensor, u: npt.ArrayLike, block: int = 512) -> paddle.Tensor:
    """Inverse-CDF sampling: for each row the first token whose cumulative probability exceeds `u * total`.

    probs: [n, V] float32, non-negative (rows need not sum to 1: u is scaled by each row's total); u: [n] in [0, 1).
    Returns [n] int64; a u at or above a row's total (rounding) picks the last token with non-zero probability.

    Two levels, so no float64 pass over [n, V] (docs/platform.md): float32 sums of blocks of `block` tokens, a
    float64 cumsum over those [n, V / block] sums picks each row's block, then a float64 cumsum inside that one
    block picks the token: O(n * (V / block + block)) float64 work. It picks the token of an exact float64
    inverse CDF of the same probabilities unless `u * total` lies within float32 rounding (~1e-6 relative) of a
    cumulative-probability boundary (tests/rollout/test_sampling_real_vocab.py). Up to 4 blocks (small vocabularies) the
    exact float64 inverse CDF is as cheap and is used instead.
    """
    if probs.dtype != paddle.float32:
        probs = probs.astype("float32")
    n, V = probs.shape
    if V <= 4 * block:
        return _exact_inverse_cdf(probs, u)
    nb = -(-V // block)
    if nb * block > V:  # pad with zero-probability tokens so the row splits into whole blocks
        probs = paddle.concat([probs, paddle.zeros([n, nb * block - V], dtype="float32")], axis=-1)
    sums = probs.reshape([n, nb, block]).sum(axis=-1).astype("float64")               # [n, nb]
    csum = paddle.cumsum(sums, axis=-1)
    target = paddle.to_tensor(np.asarray(u, dtype=np.float64)).unsqueeze(-1) * csum[:, -1:]  # [n, 1]
    b = paddle.minimum(paddle.sum((csum <= target).astype("int64"), axis=-1, keepdim=True), _last_positive(sums))
    start = gather_last(csum - sums, b)                                                 # mass before block b
    cols = b * block + paddle.arange(block, dtype="int64").unsqueeze(0)                 # [n, block]
    vals = gather_last(probs, cols)
    inner = start + paddle.cumsum(vals.astype("float64"), axis=-1)
    j = paddle.minimum(paddle.sum((inner <= target).astype("int64"), axis=-1, keepdim=True), _last_positive(vals))
    return (b * block + j).squeeze(-1)


def sample_with_uniforms_numpy(weights: np.ndarray, u: npt.ArrayLike, block: int = 512) -> np.ndarray:
    """`sample_with_uniforms` in numpy, for the CPU decode step (rollout.single_turn.choose): the same two levels and
    float64 cumulative sums, so it picks the same token unless `u * total` lies within float32 rounding of a
    boundary (the float32 block sums are added in another order). weights [n, V] float32 >= 0; u [n]. [n] int64."""
    n, V = weights.shape
    target = np.asarray(u, dtype=np.float64)
    if V <= 4 * block:
        cdf = np.cumsum(weights, axis=-1, dtype=np.float64)
        idx = (cdf <= (target * cdf[:, -1])[:, None]).sum(axis=-1)
        return np.minimum(idx, _last_positive_numpy(weights))
    nb = -(-V // block)
    if nb * block > V:
        weights = np.concatenate([weights, np.zeros((n, nb * block - V), dtype=np.float32)], axis=-1)
    sums = weights.reshape(n, nb, block).sum(axis=-1).astype(np.float64)             # [n, nb]
    csum = np.cumsum(sums, axis=-1)
    target = target * csum[:, -1]
    b = np.minimum((csum <= target[:, None]).sum(axis=-1), _last_positive_numpy(sums))
    rows = np.arange(n)
    start = csum[rows, b] - sums[rows, b]
    vals = weights.reshape(n, nb, block)[rows, b]                                        # [n, block]
    inner = start[:, None] + np.cumsum(vals, axis=-1, dtype=np.float64)
    j = np.minimum((inner <= target[:, None]).sum(axis=-1), _last_positive_numpy(vals))
    return (b * block + j).astype(np.int64)


def _last_positive_numpy(x: np.ndarray) -> np.ndarray:
    """Index of the last positive entry of each row of x [n, m] (m - 1 if none, as `_last_positive`). [n] int64."""
    return x.shape[-1] - 1 - np.argmax(x[:, ::-1] > 0, axis=-1)


def _exact_inverse_cdf(probs: paddle.Tensor, u: npt.ArrayLike) -> paddle.Tensor:
    """One float64 cumsum over [n, V]: `sample_with_uniforms` for small V. [n] int64."""
    cdf = paddle.cumsum(probs.astype("float64"), axis=-1)
    target = paddle.to_tensor(np.asarray(u, dtype=np.float64)).unsqueeze(-1) * cdf[:, -1:]
    idx = paddle.sum((cdf <= target).astype("int64"), axis=-1, keepdim=True)
    return paddle.minimum(idx, _last_positive(probs)).squeeze(-1)


def _last_positive(x: paddle.Tensor) -> paddle.Tensor:
    """Index of the last positive entry of each row of x [n, m] (m - 1 if none). [n, 1] int64."""
    m = x.shape[-1]
    return m - 1 - paddle.argmax(paddle.flip((x > 0).astype("int32"), axis=[-1]), axis=-1, keepdim=True)


def candidates(probs: paddle.Tensor, top_k: int = 0, top_p: float = 1.0, first: int = 1024,
               sort_above: float = 0.25) -> Tuple[Optional[paddle.Tensor], paddle.Tensor]:
    """The tokens that top-k and top-p keep, without sorting the vocabulary when a few candidates decide it.

    probs: [n, V] float32, normalised (top-p compares cumulative mass with `top_p`). Returns (ids [n, c] int64 in
    increasing vocabulary order, weights [n, c] float32: the kept probabilities, 0 for dropped candidates), or
    (None, weights [n, V]) when the whole vocabulary had to be sorted.

    Semantics of PaddleNLP's generation (TopKProcess, then TopPProcess on the top-k-filtered, not renormalised,
    probabilities): a token is kept iff its probability is >= the k-th largest (ties kept) and >= the probability
    of the last token of the smallest most-likely prefix whose mass reaches top_p (ties kept, float32 cumulative
    sums as in `rollout.top_p_filter`). The kept set is exactly the full-vocabulary filter's.

    Only `paddle.topk` of c candidates is taken: c = top_k + 1 (one more to see ties at the k-th), or `first`
    for top-p alone, grown while some row's kept set is not decided by its candidates (top-p mass not reached, or
    the cut-off ties with the smallest candidate). Past `sort_above * V` candidates the vocabulary is sorted
    instead (a flat distribution, e.g. a random model). Candidates come back in vocabulary order so that keyed
    sampling over them picks the token the full-vocabulary inverse CDF would (up to rounding).
    """
    n, V = probs.shape
    top_k = top_k if 0 < top_k < V else 0
    c = min(V, top_k + 1 if top_k else first)
    while True:
        if c == V:
            vals, ids = paddle.sort(probs, axis=-1, descending=True), None
        else:
            vals, ids = paddle.topk(probs, c, axis=-1)                                  # [n, c] descending
        smallest = vals[:, c - 1:]
        thr = vals[:, top_k - 1:top_k] if top_k else paddle.zeros([n, 1], dtype=vals.dtype)
        decided = paddle.ones([n, 1], dtype="bool")
        if top_p < 1.0:
            cum = paddle.cumsum(vals, axis=-1)
            keep = paddle.sum((cum - vals < top_p).astype("int64"), axis=-1, keepdim=True)   # >= 1
            thr = paddle.maximum(thr, gather_last(vals, keep - 1))
            if not top_k:  # with top_k, an undecided top-p cut-off lies below the k-th value: top_k decides
                decided = keep < c
        if ids is None:
            return None, paddle.where(probs >= thr, probs, paddle.zeros_like(probs))
        # Tokens outside the candidates are <= smallest: the kept set is complete if the cut-off is above it.
        if bool((decided & (thr > smallest)).all()):
            break
        grow = 2 * c
        if top_p < 1.0 and not top_k:  # each further token adds at most `smallest` mass: a lower bound on c
            short = float(paddle.max((top_p - cum[:, -1:]) / paddle.clip(smallest, min=1e-30)))
            grow = max(grow, c + int(min(short, V)) + 1)
        c = V if grow > sort_above * V else grow
    weights = paddle.where(vals >= thr, vals, paddle.zeros_like(vals))
    order = paddle.argsort(ids, axis=-1)
    return gather_last(ids, order), gather_last(weights, order)
