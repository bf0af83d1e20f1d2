"""The SwiGLU MLP's second half, `swiglu(gu) @ w_down`, keeping only its input for the backward.

Autograd through `F.swiglu` then `matmul` keeps both the gate/up projection `gu` [n, 2I] (for swiglu's backward)
and the activation `swiglu(gu)` [n, I] (for the matmul's). The activation is one elementwise op away from `gu`, so
`swiglu_down` saves `gu` alone and recomputes the activation in its backward: for 8 completions of 2,048 tokens at
Qwen2.5-0.5B's intermediate size 4,864 that is 330 MB less per layer for one more swiglu per layer (no GEMM is
repeated). The gradients are the same ops as autograd's: swiglu's own backward kernel (through `paddle.grad`) and
the two products of the matmul's.

fast_qwen2.py uses it from SAVE_ACTIVATION_ABOVE elements of activation: below that the memory is small, and the
tiny models of the quickstart and tests keep autograd's path.
"""
from __future__ import annotations

import paddle
import paddle.nn.functional as F
from paddle.autograd import PyLayer

__all__ = ["SAVE_ACTIVATION_ABOVE", "swiglu_down"]

# Activations of more than this many elements (64 MB of float32) are recomputed instead of kept.
SAVE_ACTIVATION_ABOVE = 1 << 24


class _SwigluDown(PyLayer):
    @staticmethod
    def forward(ctx, gu: paddle.Tensor, w_down: paddle.Tensor) -> paddle.Tensor:
        ctx.save_for_backward(gu, w_down)
        return paddle.matmul(F.swiglu(gu), w_down)

    @staticmethod
    def backward(ctx, dout: paddle.Tensor) -> tuple:
        gu, w_down = ctx.saved_tensor()
        x = gu.detach()
        x.stop_gradient = False
        with paddle.set_grad_enabled(True):
            act = F.swiglu(x)
        d_act = paddle.matmul(dout, w_down, transpose_y=True)
        dw = None if w_down.stop_gradient else paddle.matmul(act.detach(), dout, transpose_x=True)
        dgu = None if gu.stop_gradient else paddle.grad(act, x, d_act)[0]
        return dgu, dw


def swiglu_down(gu: paddle.Tensor, w_down: paddle.Tensor) -> paddle.Tensor:
    """`F.swiglu(gu) @ w_down` for gu [n, 2I] (gate and up halves) and w_down [I, D] -> [n, D]; the backward
    recomputes `swiglu(gu)` instead of keeping it."""
    return _SwigluDown.apply(gu, w_down)
