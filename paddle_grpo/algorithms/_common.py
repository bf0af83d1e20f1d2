"""Tensor helpers shared by the modules of `algorithms/`: dtype promotion, masking, masked batch statistics."""
from typing import Sequence, Tuple, Union

import numpy as np
import paddle

# What the public functions accept for a tensor argument: a paddle tensor (kept on its device, autograd path kept),
# or anything numpy can read.
TensorLike = Union[paddle.Tensor, np.ndarray, Sequence]


def gather_last(x: paddle.Tensor, index: paddle.Tensor) -> paddle.Tensor:
    """`x[..., index[..., j]]` along the last axis: x [..., m], index [..., k] int64 -> [..., k].

    `paddle.take_along_axis` with `broadcast=False`: its default (broadcast=True) copies all of `x` whatever k is
    (60 ms for a [256, 151,936] x [256, 1] gather against 0.02 ms; tools/bench/bench_ops.py, docs/platform.md)."""
    return paddle.take_along_axis(x, index, axis=-1, broadcast=False)


def subtract_at(x: paddle.Tensor, index: paddle.Tensor, values: paddle.Tensor) -> paddle.Tensor:
    """`x[i, index[i]] -= values[i]` for x [n, m], index [n] int64, values [n]; returns x, changed in place.

    Without autograd only (a backward pass). A flat `scatter_` of the n changed entries: `put_along_axis` copies
    the whole [n, m] tensor (75 ms at [256, 151,936] against 2 ms)."""
    n, m = x.shape
    flat_index = paddle.arange(n, dtype="int64") * m + index.astype("int64")
    new = gather_last(x, index.unsqueeze(-1)).squeeze(-1) - values
    flat = x.reshape([-1])
    flat.scatter_(flat_index, new, overwrite=True)
    return flat.reshape([n, m])  # the same memory as x (a contiguous reshape is a view); returned in case it is not


def compute_dtype(*xs: object) -> str:
    """float64 if any floating input is float64, else float32: low-precision inputs (bf16/fp16) are promoted to
    float32, and float64 is never demoted (finite-difference tests and float64 users keep their precision)."""
    for x in xs:
        if isinstance(x, paddle.Tensor) and x.dtype == paddle.float64:
            return "float64"
        if isinstance(x, np.ndarray) and x.dtype == np.float64:
            return "float64"
    return "float32"


def as_float(x: TensorLike, dtype: str = "float32") -> paddle.Tensor:
    """A paddle tensor of `dtype`; casting keeps the autograd path of a tensor input."""
    if not isinstance(x, paddle.Tensor):
        x = paddle.to_tensor(np.asarray(x))
    if x.dtype == paddle.bool:
        x = x.astype("int32")
    return x if x.dtype == getattr(paddle, dtype) else x.astype(dtype)


def as_mask(response_mask: TensorLike, dtype: str = "float32") -> paddle.Tensor:
    """The response mask as a 0/1 float tensor (any non-zero entry counts as valid)."""
    if not isinstance(response_mask, paddle.Tensor):
        response_mask = paddle.to_tensor(np.asarray(response_mask))
    if response_mask.dtype == paddle.bool:
        return response_mask.astype(dtype)
    return (response_mask != 0).astype(dtype)


def masked(x: paddle.Tensor, mask: paddle.Tensor) -> paddle.Tensor:
    """x where mask, else 0. Uses `where` rather than `x * mask` so that inf/NaN garbage in padding cannot leak
    into sums (0 * inf = NaN) and padding gets an exactly zero gradient."""
    return paddle.where(mask > 0, x, paddle.zeros_like(x))


def check_same_shape(**tensors: Union[paddle.Tensor, None]) -> None:
    """Raise ValueError listing every shape when the given (non-None) tensors differ in shape."""
    shapes = {k: list(v.shape) for k, v in tensors.items() if v is not None}
    if len({tuple(s) for s in shapes.values()}) > 1:
        raise ValueError("shape mismatch: " + ", ".join(f"{k}={s}" for k, s in shapes.items()))


def masked_centered_var(values: paddle.Tensor, mask: paddle.Tensor) -> Tuple[paddle.Tensor, paddle.Tensor]:
    """`(m * (x - mean), unbiased var)` over the valid entries (var taken as 0 with fewer than 2 of them).

    The mean gets one refinement pass, `mean += masked_mean(x - mean)`: a plain float32 `sum / n` of equal values
    is often one ulp off, and whitening would blow that residue up to O(1) (0/0-like); after the pass equal values
    centre to exactly 0, and in general the mean is accurate to about an ulp of the data rather than of the sum.
    """
    n = paddle.clip(mask.sum(), min=1.0)
    mean = masked(values, mask).sum() / n
    mean = mean + masked(values - mean, mask).sum() / n
    centered = masked(values - mean, mask)
    var = (centered * centered).sum() / paddle.clip(mask.sum() - 1.0, min=1.0)
    return centered, var
