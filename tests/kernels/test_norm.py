"""kernels/norm.py: RMSNorm with its hand-written backward, against a float64 numpy reference and autograd's
backward of the same ops (the lean decoder's path before it).

Tolerances (tests/numerics.py), for x ~ N(0, 1) [n, D], w ~ U(0.5, 1.5), dy ~ N(0, 1): the forward's mean of x^2
sums D terms adding up to ~D (divided by D: magnitude ~1), so y is within f32_sum_tol(D, 1) relative, times
|y| <= ~5. dw sums n products |dy * xh| ~0.8 each: f32_sum_tol(n, 0.8 n) plus the rounding of xh. dx's mean sums D
terms |dy * w * xh| adding up to ~D, times |xh| * r; two chained sums (the forward's factor and this mean):
f32_sum_tol(D, 1, depth=2) * max|xh| * max r, plus a few ulps of |dx| (~5) for its elementwise roundings.
"""
import numpy as np
import paddle
import pytest
from numerics import EPS32, f32_sum_tol

from paddle_grpo.kernels.norm import rms_norm

pytestmark = pytest.mark.numerics  # compares float results: CI reruns it on other CPU kernels

EPS = 1e-6


def _numpy(x, w, dy):
    """y, dx, dw in float64 (x [..., D])."""
    x, w, dy = (a.astype(np.float64) for a in (x, w, dy))
    r = 1.0 / np.sqrt((x * x).mean(-1, keepdims=True) + EPS)
    xh = x * r
    dyw = dy * w
    dx = r * (dyw - xh * (dyw * xh).mean(-1, keepdims=True))
    return xh * w, dx, (dy * xh).reshape(-1, w.shape[0]).sum(0), xh, r


def _plain(x, w, inv_d):
    """The ops the lean decoder ran before (autograd differentiates them)."""
    return x * paddle.rsqrt(paddle.matmul(x * x, inv_d) + EPS) * w


def _inputs(shape, seed):
    rng = np.random.default_rng(seed)
    D = shape[-1]
    return (rng.standard_normal(shape).astype("float32"), rng.uniform(0.5, 1.5, D).astype("float32"),
            rng.standard_normal(shape).astype("float32"))


def _run(fn, x_np, w_np, dy_np, frozen=()):
    x, w = paddle.to_tensor(x_np), paddle.to_tensor(w_np)
    x.stop_gradient, w.stop_gradient = "x" in frozen, "w" in frozen
    inv_d = paddle.full([w_np.shape[0], 1], 1.0 / w_np.shape[0], dtype="float32")
    y = fn(x, w, inv_d)
    (y * paddle.to_tensor(dy_np)).sum().backward()
    return y.numpy(), None if x.grad is None else x.grad.numpy(), None if w.grad is None else w.grad.numpy()


@pytest.mark.parametrize("shape", [(37, 64), (3, 5, 48)])
def test_values_and_gradients_equal_float64(shape):
    x, w, dy = _inputs(shape, seed=len(shape))
    y, dx, dw = _run(lambda x, w, inv_d: rms_norm(x, w, inv_d, EPS), x, w, dy)
    y64, dx64, dw64, xh64, r64 = _numpy(x, w, dy)
    n, D = int(np.prod(shape[:-1])), shape[-1]
    np.testing.assert_allclose(y, y64, rtol=0, atol=f32_sum_tol(D, 1.0) * np.abs(y64).max() + 4 * EPS32 * 5)
    dx_tol = f32_sum_tol(D, 1.0, depth=2) * np.abs(xh64).max() * r64.max() + 8 * EPS32 * np.abs(dx64).max()
    np.testing.assert_allclose(dx, dx64, rtol=0, atol=dx_tol)
    np.testing.assert_allclose(dw, dw64, rtol=0, atol=f32_sum_tol(n, 0.8 * n) + 8 * EPS32 * np.abs(dw64).max())
    assert np.abs(dx64).max() > 0.5 and np.abs(dw64).max() > 1.0  # gradients of a size that a bug would show in


@pytest.mark.parametrize("frozen", ["x", "w"])
def test_frozen_inputs_get_no_gradient_and_the_other_its_own(frozen):
    x, w, dy = _inputs((11, 32), seed=3)
    kernel = _run(lambda x, w, inv_d: rms_norm(x, w, inv_d, EPS), x, w, dy, frozen=(frozen,))
    autograd = _run(_plain, x, w, dy, frozen=(frozen,))
    assert (kernel[1] is None, kernel[2] is None) == (frozen == "x", frozen == "w")
    assert (autograd[1] is None, autograd[2] is None) == (frozen == "x", frozen == "w")
    got, want = (kernel[2], autograd[2]) if frozen == "x" else (kernel[1], autograd[1])
    np.testing.assert_allclose(got, want, rtol=0, atol=f32_sum_tol(32, 32.0) + 8 * EPS32 * np.abs(want).max())


def test_forward_is_the_plain_ops_bit_for_bit():
    """Same ops in the same order (one process, same kernels): the values with and without gradients are equal, so
    decoding (no gradients) and the update's forward see the same hidden states."""
    x, w, _ = _inputs((9, 48), seed=4)
    inv_d = paddle.full([48, 1], 1.0 / 48, dtype="float32")
    xt, wt = paddle.to_tensor(x), paddle.to_tensor(w)
    wt.stop_gradient = False
    with_grad = rms_norm(xt, wt, inv_d, EPS).numpy()
    with paddle.no_grad():
        without = rms_norm(xt, wt, inv_d, EPS).numpy()
    np.testing.assert_array_equal(with_grad, without)
    np.testing.assert_array_equal(with_grad, _plain(xt, wt, inv_d).numpy())
