"""The SwiGLU MLP `swiglu(h @ w_gate_up) @ w_down` of a long sequence, without autograd's full-length intermediates.

Autograd keeps, per layer, the gate/up projection `gu` [n, 2I] (for swiglu's backward) and the activation
`swiglu(gu)` [n, I] (for the down projection's), and its backward makes as many again ([n, I] and [n, 2I]
gradients) at once. For 8 completions of 2,048 tokens at Qwen2.5-0.5B's intermediate size 4,864 that is
~1 GB kept plus ~1 GB of transients per layer, at the moment of the backward when memory peaks. `mlp` instead:
- keeps h [n, D] and, with `keep_gu`, gu; without it gu is recomputed in the backward (one more [n, D] x [D, 2I]
  product: about a fifth of the MLP's forward + backward arithmetic);
- computes forward and backward `block` rows at a time, so no [n, I] or [n, 2I] transient exists (without
  gradients too: the reference model's forward and recompute's first pass).
The gradients are the same ops as autograd's: swiglu's own backward kernel (through `paddle.grad`) and the matrix
products of the two projections, accumulated over the blocks.

policy/fast_decoder.py chooses by size (`mlp_plan`): autograd below KEEP_GU_ABOVE activation elements (the tiny models
of the quickstart and tests keep their exact path), `keep_gu` up to RECOMPUTE_GU_ABOVE, recomputing gu beyond.
"""
from __future__ import annotations

import paddle
import paddle.nn.functional as F
from paddle.autograd import PyLayer

__all__ = ["BLOCK_ELEMENTS", "KEEP_GU_ABOVE", "RECOMPUTE_GU_ABOVE", "mlp", "mlp_plan"]

# Activation [n, I] sizes, in float32 elements: above 2^24 (64 MB) blocks and no kept activation; above 2^26
# (256 MB, e.g. 8 x 1,700 tokens at I = 4,864) gu is recomputed too.
KEEP_GU_ABOVE = 1 << 24
RECOMPUTE_GU_ABOVE = 1 << 26
# Rows per block: about this many elements of gu [rows, 2I] (16 MB).
BLOCK_ELEMENTS = 1 << 22


def mlp_plan(rows: int, intermediate: int) -> tuple[int, bool] | None:
    """(rows per block, keep gu) for an MLP over `rows` tokens, or None: plain autograd (small enough)."""
    size = rows * intermediate
    if size <= KEEP_GU_ABOVE:
        return None
    return max(1, BLOCK_ELEMENTS // (2 * intermediate)), size <= RECOMPUTE_GU_ABOVE


def _forward(h: paddle.Tensor, w_gu: paddle.Tensor, w_down: paddle.Tensor, block: int, gus: list | None = None
             ) -> paddle.Tensor:
    """The MLP `block` rows at a time; each block's gu is appended to `gus` when given."""
    outs = []
    for s in range(0, h.shape[0], block):
        gu = paddle.matmul(h[s:s + block], w_gu)
        outs.append(paddle.matmul(F.swiglu(gu), w_down))
        if gus is not None:
            gus.append(gu)
    return paddle.concat(outs)


class _MLP(PyLayer):
    @staticmethod
    def forward(ctx, h: paddle.Tensor, w_gu: paddle.Tensor, w_down: paddle.Tensor, block: int, keep_gu: bool
                ) -> paddle.Tensor:
        gus = [] if keep_gu else None
        out = _forward(h, w_gu, w_down, block, gus)
        ctx.block = block
        ctx.save_for_backward(h, w_gu, w_down, paddle.concat(gus) if keep_gu else None)
        return out

    @staticmethod
    def backward(ctx, dout: paddle.Tensor) -> tuple:
        h, w_gu, w_down, kept = ctx.saved_tensor()
        d_h = [] if not h.stop_gradient else None
        d_gu_w = None if w_gu.stop_gradient else paddle.zeros_like(w_gu)
        d_down_w = None if w_down.stop_gradient else paddle.zeros_like(w_down)
        for s in range(0, h.shape[0], ctx.block):
            h_b, dout_b = h[s:s + ctx.block], dout[s:s + ctx.block]
            x = (kept[s:s + ctx.block] if kept is not None else paddle.matmul(h_b, w_gu)).detach()
            x.stop_gradient = False
            with paddle.set_grad_enabled(True):
                act = F.swiglu(x)
            if d_down_w is not None:
                d_down_w.add_(paddle.matmul(act.detach(), dout_b, transpose_x=True))
            d_gu = paddle.grad(act, x, paddle.matmul(dout_b, w_down, transpose_y=True))[0]
            if d_h is not None:
                d_h.append(paddle.matmul(d_gu, w_gu, transpose_y=True))
            if d_gu_w is not None:
                d_gu_w.add_(paddle.matmul(h_b, d_gu, transpose_x=True))
        return (None if d_h is None else paddle.concat(d_h)), d_gu_w, d_down_w


def mlp(h: paddle.Tensor, w_gu: paddle.Tensor, w_down: paddle.Tensor, block: int, keep_gu: bool) -> paddle.Tensor:
    """`F.swiglu(h @ w_gu) @ w_down` for h [n, D], w_gu [D, 2I] (gate and up halves), w_down [I, D] -> [n, D],
    `block` rows at a time; with `keep_gu` the backward reuses the saved gate/up projection, else recomputes it."""
    if block < 1:
        raise ValueError(f"block must be >= 1, got {block}")
    if not paddle.is_grad_enabled() or (h.stop_gradient and w_gu.stop_gradient and w_down.stop_gradient):
        return _forward(h, w_gu, w_down, int(block))  # nothing to keep: the blocks bound the transients
    return _MLP.apply(h, w_gu, w_down, int(block), bool(keep_gu))
