"""The chunked LM head's maths: per-token log-probs and entropy of `hidden @ W / temperature` without ever holding
the `[rows, T, V]` logits.

At a real vocabulary (Qwen's 151,936) the float32 logits of 8 x 512 completion tokens are 2.5 GB, and a plain
log-softmax + entropy + backward keeps several more tensors of that shape (docs/platform.md, "Memory at a real
vocabulary"). `chunked_logprobs_and_entropy` instead walks the flattened `n * T` positions `chunk_size` at a time:
hidden -> logits -> log-sum-exp -> the label's log-prob and the entropy, keeping only per-token statistics. Its
backward (`ChunkedLMHead`, a `paddle.autograd.PyLayer`) recomputes each chunk's logits and accumulates the gradients
of the hidden states and of the head weight chunk by chunk. Peak extra memory is O(chunk_size x V) in both passes.

The formulas are those of `algorithms/losses.py` (`logprobs_from_logits`, `entropy_from_logits`) and
docs/algorithms.md section 4: `z = logits / temperature`, `log p = z[label] - logsumexp(z)`,
`H = logsumexp(z) - sum_v softmax(z)_v z_v`. The elementwise work on each chunk's logits is chunk_kernels.py's
(numpy on CPU, paddle ops elsewhere).

Tensors in, tensors out: no model code and no `paddle.distributed`. Two floors build on it: policy/lm_head.py (reads
the head of a model and calls `chunked_logprobs_and_entropy`) and parallel/vocab.py (the vocab-parallel head: per-shard
chunks and one all-gather of their statistics; it reuses `flat_inputs`, `chunks`, `chunk_logits` and subclasses
`ChunkedLMHead`, whose backward reads `ctx.label_weight`).
"""
from __future__ import annotations

import math
from typing import Any

import paddle
from paddle.autograd import PyLayer

from .chunk_kernels import accumulate_weight_gradient, chunk_gradient, shifted_statistics

__all__ = ["ChunkedLMHead", "as_f32", "chunk_logits", "chunked_logprobs_and_entropy", "chunks", "flat_inputs",
           "num_chunks", "shifted_statistics"]

_F32 = paddle.float32


def as_f32(x: paddle.Tensor) -> paddle.Tensor:
    """`x` in float32 (itself when it already is)."""
    return x if x.dtype == _F32 else x.astype(_F32)


def chunk_logits(h: paddle.Tensor, w: paddle.Tensor, transpose_y: bool, temperature: float,
                 b: paddle.Tensor | None = None) -> paddle.Tensor:
    """`[c, H] x W (+ b [V]) -> [c, V]` float32 logits of one chunk, divided by the temperature (w and b are
    already float32). A fresh tensor, which the callers change in place."""
    z = paddle.matmul(as_f32(h), w, transpose_y=transpose_y)
    # In place here and below: on CPU a new [chunk, V] tensor costs more than the op itself (page faults of a fresh
    # mmap: `scale` 118 ms vs `scale_` 22 ms at [512, 151,936]; tools/bench/bench.py --ops).
    if b is not None:
        z.add_(b)
    if temperature != 1.0:
        z.scale_(1.0 / temperature)
    return z


def chunks(total: int, chunk_size: int) -> list[tuple[int, int]]:
    """The `(start, end)` ranges that cover `total` positions `chunk_size` at a time."""
    return [(s, min(s + chunk_size, total)) for s in range(0, total, chunk_size)]


class ChunkedLMHead(PyLayer):
    """Forward: per-token (log-prob, log-sum-exp, entropy) chunk by chunk. Backward: recompute each chunk's logits.

    Saved for backward: the hidden states and the weight (inputs, no copies), the labels and two `[N]` float32
    statistics (logsumexp, entropy). Nothing of size V outlives a chunk."""

    @staticmethod
    def forward(ctx: Any, hidden: paddle.Tensor, weight: paddle.Tensor, labels: paddle.Tensor, temperature: float,
                chunk_size: int, with_entropy: bool | str, transpose_y: bool, bias: paddle.Tensor | None = None
                ) -> tuple[paddle.Tensor, paddle.Tensor]:
        # with_entropy "detached": the entropy is computed in the same pass (its terms are at hand) but takes no
        # gradient: backward ignores the (zero) gradient paddle passes for it.
        w = as_f32(weight)
        b = None if bias is None else as_f32(bias).reshape([-1])
        total = hidden.shape[0]
        logps, lses, ents = [], [], []
        for start, end in chunks(total, chunk_size):
            # The logits go straight into the call (no name holds them here): they are freed inside, after `z - m`.
            m, picked, lse_s, mean_s = shifted_statistics(chunk_logits(hidden[start:end], w, transpose_y,
                                                                       temperature, b), labels[start:end],
                                                          with_entropy)
            logps.append(picked - lse_s)
            lses.append(lse_s + m)                                     # the unshifted logsumexp(z)
            if with_entropy:
                # H = logsumexp(z) - sum p z; both terms shift by m, so the shifted statistics give it exactly.
                ents.append(lse_s - mean_s)
        logp = paddle.concat(logps)
        ent = paddle.concat(ents) if with_entropy else paddle.zeros_like(logp)
        ctx.temperature, ctx.chunk_size, ctx.with_entropy, ctx.transpose_y = (temperature, chunk_size, with_entropy,
                                                                              transpose_y)
        ctx.save_for_backward(hidden, weight, labels, paddle.concat(lses), ent, bias)
        return logp, ent

    @staticmethod
    def backward(ctx: Any, grad_logp: paddle.Tensor, grad_ent: paddle.Tensor) -> tuple:
        # Why the gradient is what it is. With z = logits / tau, p = softmax(z), log p_v = z_v - lse:
        #   d log p_y / d z_k = [k = y] - p_k                                   (d lse / d z_k = p_k)
        #   H = lse - sum_v p_v z_v, and d p_v / d z_k = p_v ([v = k] - p_k), so
        #   d H / d z_k = p_k - (p_k + p_k z_k - p_k sum_v p_v z_v) = -p_k (z_k - sum_v p_v z_v).
        # Since sum_v p_v z_v = lse - H, the entropy term is -p_k (log p_k + H): it needs only the saved lse and H,
        # not a second pass over V. With upstream gradients a (log-prob) and b (entropy), per position
        #   dL/dz = a * onehot(y) - p * (a + b * (log p + H)),   dL/dlogits = dL/dz / tau,
        # and logits = h W (or h W^T), so dL/dh = dL/dlogits W^T and dL/dW = h^T dL/dlogits, summed over chunks.
        # A bias b adds to the logits, so dL/db = the column sum of dL/dlogits over the positions.
        hidden, weight, labels, lse, ent, bias = ctx.saved_tensor()
        temperature, transpose_y = ctx.temperature, ctx.transpose_y
        # [N] float32 or None: scales each position's one-hot term. The vocab-parallel head (parallel/vocab.py, a
        # subclass with its own forward) sets it to 0 where another shard holds the label.
        label_weight = getattr(ctx, "label_weight", None)
        need_h, need_w = not hidden.stop_gradient, not weight.stop_gradient
        need_b = bias is not None and not bias.stop_gradient
        w = as_f32(weight)
        b32 = None if bias is None else as_f32(bias).reshape([-1])
        grad_logp = as_f32(grad_logp)
        grad_ent = as_f32(grad_ent) if ctx.with_entropy is True else None
        total = hidden.shape[0]
        dh_chunks = []
        dw = paddle.zeros(w.shape, dtype=_F32) if need_w else None
        db = paddle.zeros(b32.shape, dtype=_F32) if need_b else None
        for start, end in chunks(total, ctx.chunk_size):
            h = as_f32(hidden[start:end])
            # dL/dlogits, computed in the recomputed logits' memory (chunk_kernels.py: numpy on CPU).
            dz = chunk_gradient(chunk_logits(h, w, transpose_y, temperature, b32), labels[start:end],
                                lse[start:end], ent[start:end], grad_logp[start:end],
                                None if grad_ent is None else grad_ent[start:end],
                                None if label_weight is None else label_weight[start:end], temperature)
            if need_h:
                dh_chunks.append(paddle.matmul(dz, w, transpose_y=not transpose_y).astype(hidden.dtype))
            if need_w:
                # logits = h @ W ([H, V]): dW = h^T dz; logits = h @ W^T ([V, H]): dW = dz^T h. In place, and on
                # CPU without a weight-sized product (chunk_kernels.accumulate_weight_gradient).
                accumulate_weight_gradient(dw, h, dz, transpose_y)
            if need_b:
                db.add_(paddle.sum(dz, axis=0))
            del dz
        dh = paddle.concat(dh_chunks) if need_h else None
        if dw is not None and dw.dtype != weight.dtype:
            dw = dw.astype(weight.dtype)
        if bias is None:
            return dh, dw
        return dh, dw, None, (db.reshape(bias.shape).astype(bias.dtype) if need_b else None)  # None: the labels


def chunked_logprobs_and_entropy(hidden: paddle.Tensor, weight: paddle.Tensor, labels: paddle.Tensor, *,
                                 temperature: float = 1.0, chunk_size: int = 1024, with_entropy: bool | str = True,
                                 transpose_y: bool = False, bias: paddle.Tensor | None = None
                                 ) -> tuple[paddle.Tensor, paddle.Tensor | None]:
    """Per-token `log softmax(h W / temperature)[label]` and the entropy of that distribution, `chunk_size`
    positions at a time, differentiable w.r.t. `hidden` and `weight`.

    Args:
        hidden: `[n, T, H]` final hidden states (any float dtype; each chunk is computed in float32).
        weight: the LM head weight, `[H, V]` as PaddleNLP's `Qwen2LMHead` stores it, or `[V, H]` (tied embeddings,
            `transpose_y`) with `transpose_y=True`. May be frozen (`stop_gradient`): it then gets no gradient.
        labels: `[n, T]` int token ids. Negative ids (an ignore index) are read as id 0; mask those positions.
        temperature: the logits are divided by it (> 0).
        chunk_size: positions per chunk, over the flattened `n * T` positions; the peak extra memory of forward
            and backward is O(chunk_size x V).
        with_entropy: also return the entropy (and take its gradient); "detached": return it without a gradient
            (computed in the same pass; for logging).
        transpose_y: `weight` is `[V, H]` (logits = hidden @ weight^T), as PaddleNLP's `transpose_y`.
        bias: optional `[V]` (or `[1, V]`) added to the logits before the temperature (BART's final_logits_bias);
            it gets a gradient unless it is frozen.
    Returns:
        `(logprobs [n, T] float32, entropy [n, T] float32 or None)`.
    """
    flat_h, flat_labels = flat_inputs(hidden, weight, labels, temperature, chunk_size, transpose_y)
    vocab = weight.shape[0] if transpose_y else weight.shape[1]
    if bias is not None and int(math.prod(bias.shape)) != vocab:
        raise ValueError(f"bias {list(bias.shape)} does not have the head's {vocab} outputs")
    if with_entropy not in (True, False, "detached"):
        raise ValueError(f"with_entropy must be True, False or 'detached', got {with_entropy!r}")
    logp, ent = ChunkedLMHead.apply(flat_h, weight, flat_labels, float(temperature), int(chunk_size),
                                    with_entropy, bool(transpose_y), bias)
    n, t = labels.shape
    logp = logp.reshape([n, t])
    if not with_entropy:
        return logp, None
    ent = ent.reshape([n, t])
    return logp, (ent.detach() if with_entropy == "detached" else ent)


def flat_inputs(hidden: paddle.Tensor, weight: paddle.Tensor, labels: paddle.Tensor, temperature: float,
                chunk_size: int, transpose_y: bool) -> tuple[paddle.Tensor, paddle.Tensor]:
    """The checked arguments of `chunked_logprobs_and_entropy` (also parallel/vocab.py's) flattened over positions:
    hidden `[n * T, H]` and labels `[n * T]` int64, negative ids read as 0."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    if len(hidden.shape) != 3 or len(labels.shape) != 2 or list(labels.shape) != list(hidden.shape[:2]):
        raise ValueError(f"hidden must be [n, T, H] and labels [n, T], got {list(hidden.shape)} and "
                         f"{list(labels.shape)}")
    n, t, h_size = hidden.shape
    w_hidden = weight.shape[1] if transpose_y else weight.shape[0]
    if len(weight.shape) != 2 or w_hidden != h_size:
        layout = "[V, H] (transpose_y=True)" if transpose_y else "[H, V] (transpose_y=False)"
        raise ValueError(f"weight {list(weight.shape)} is not {layout} for hidden size {h_size}")
    return hidden.reshape([n * t, h_size]), paddle.clip(labels.astype("int64"), min=0).reshape([n * t])


def num_chunks(positions: int, chunk_size: int) -> int:
    """How many chunks `chunked_logprobs_and_entropy` walks for `positions` (= n * T) positions."""
    return math.ceil(positions / chunk_size)
