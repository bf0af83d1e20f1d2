"""RMSNorm over flat tokens with a hand-written backward whose reductions are matrix products.

`y = x * rsqrt(mean(x^2) + eps) * w` for x [..., D] (n positions), w [D] (Zhang & Sennrich 2019, arXiv:1910.07467; PaddleNLP's
`Qwen2RMSNorm` / `LlamaRMSNorm` in float32). The lean decoder (policy/fast_decoder.py) computes the mean as a GEMV
(x * x) @ (1/D) and applies the [n, 1] factor as the right operand, because paddle's CPU broadcasts and `mean` are
single-threaded and slow. Autograd's backward of those ops is slow in the same way: the gradients of the two
broadcast multiplies reduce over the broadcast axes (over D for the factor, over the n rows for w). Measured at
[2272, 256] on one AMD EPYC core (paddle 3.3.1): forward + backward 12.6 ms with autograd, 4.5 ms with `_RMSNorm`,
the same forward. Its backward, with xh = x * r and r = rsqrt(mean(x^2) + eps):

    dw = sum_rows(dy * xh)                      as ones[1, n] @ (dy * xh)
    dx = r * (dy * w - xh * mean(dy * w * xh))  the mean again as a GEMV with 1/D

The forward is the same ops in the same order as the plain path, so the values are bit-identical to it; the
gradients agree to float32 rounding (the sums run in another order). Without gradients the plain ops run.
"""
from __future__ import annotations

import paddle
from paddle.autograd import PyLayer

__all__ = ["rms_norm"]


def _factor(x: paddle.Tensor, inv_d: paddle.Tensor, eps: float) -> paddle.Tensor:
    """rsqrt(mean(x^2) + eps) [..., 1] of x [..., D], the mean as (x * x) @ inv_d [D, 1] (a GEMV)."""
    return paddle.rsqrt(paddle.matmul(x * x, inv_d) + eps)


class _RMSNorm(PyLayer):
    @staticmethod
    def forward(ctx, x: paddle.Tensor, w: paddle.Tensor, inv_d: paddle.Tensor, eps: float) -> paddle.Tensor:
        r = _factor(x, inv_d, eps)
        xh = x * r
        ctx.save_for_backward(xh, r, w, inv_d)
        ctx.needs = (not x.stop_gradient, not w.stop_gradient)
        return xh * w

    @staticmethod
    def backward(ctx, dy: paddle.Tensor) -> tuple:
        xh, r, w, inv_d = ctx.saved_tensor()
        need_x, need_w = ctx.needs
        dx = dw = None
        if need_w:
            t = (dy * xh).reshape([-1, w.shape[0]])  # every position of x [..., D] is a row
            dw = paddle.matmul(paddle.ones([1, t.shape[0]], dy.dtype), t).reshape(w.shape)
        if need_x:
            dyw = dy * w
            dx = (dyw - xh * paddle.matmul(dyw * xh, inv_d)) * r
        return dx, dw, None


def rms_norm(x: paddle.Tensor, w: paddle.Tensor, inv_d: paddle.Tensor, eps: float) -> paddle.Tensor:
    """RMSNorm of x [..., D] with weight w [D]; inv_d: a [D, 1] tensor of 1/D (the caller's, built once). With
    gradients recorded for x or w, `_RMSNorm` (the backward above); otherwise the plain ops, the same values."""
    if paddle.is_grad_enabled() and not (x.stop_gradient and w.stop_gradient):
        return _RMSNorm.apply(x, w, inv_d, float(eps))
    return x * _factor(x, inv_d, eps) * w
