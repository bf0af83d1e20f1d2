"""Counter-based sampling noise: the random number for (row, position) depends only on (seed, row key, position).

Why: with paddle's global generator, which completion a row gets depends on how many rows were sampled before it
in the same process, so splitting a batch across data-parallel ranks or into `rollout_max_num_seqs` chunks changes
the samples. Keying each row's noise by a global id (seed, step, global row index) makes a rollout identical
whatever the split, and a resumed run needs no generator state to continue exactly.

The seed policy: `row_keys(seed, step, global_rows)`; the uniform for position t of a row is
`splitmix64(key ^ splitmix64(t))` mapped to [0, 1). Sampling from a distribution p with a uniform u is inverse-CDF:
the first token whose cumulative probability exceeds u (distributionally the same as multinomial sampling).
"""
from __future__ import annotations

import numpy as np
import numpy.typing as npt
import paddle

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


def uniforms(keys: npt.ArrayLike, position: int) -> np.ndarray:
    """The uniform in [0, 1) for each row key at decode position `position`. [n] float64."""
    bits = _splitmix64(np.asarray(keys, dtype=np.uint64) ^ _splitmix64(np.uint64(position)))
    return (bits >> np.uint64(11)).astype(np.float64) / float(1 << 53)


def sample_with_uniforms(probs: paddle.Tensor, u: npt.ArrayLike) -> paddle.Tensor:
    """Inverse-CDF sampling: for each row the first token whose cumulative probability exceeds u.

    probs: [n, V] float (rows sum to 1, up to rounding); u: [n] in [0, 1). Returns [n] int64. A u at or above a
    row's total (rounding) picks the last token with non-zero probability.
    """
    cdf = paddle.cumsum(probs.astype("float64"), axis=-1)
    u = paddle.to_tensor(np.asarray(u, dtype=np.float64)).unsqueeze(-1) * cdf[:, -1:]
    idx = paddle.sum((cdf <= u).astype("int64"), axis=-1)
    # Guard against u landing on a trailing run of zero-probability tokens (cdf flat at its maximum).
    last_nonzero = probs.shape[-1] - 1 - paddle.argmax(paddle.flip((probs > 0).astype("int64"), axis=[-1]), axis=-1)
    return paddle.minimum(idx, last_nonzero)
