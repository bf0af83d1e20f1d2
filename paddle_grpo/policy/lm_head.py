"""A chunked LM head: per-token log-probs and entropy without ever holding the `[rows, T, V]` logits (issue 15).

At a real vocabulary (Qwen's 151,936) the float32 logits of 8 x 512 completion tokens are 2.5 GB, and a plain
log-softmax + entropy + backward keeps several more tensors of that shape (docs/platform.md, "Memory at a real
vocabulary"). `chunked_logprobs_and_entropy` instead walks the flattened `n * T` positions `chunk_size` at a time:
hidden -> logits -> log-sum-exp -> the label's log-prob and the entropy, keeping only per-token statistics. Its
backward (`_ChunkedLMHead`, a `paddle.autograd.PyLayer`) recomputes each chunk's logits and accumulates the gradients
of the hidden states and of the head weight chunk by chunk. Peak extra memory is O(chunk_size x V) in both passes.

The formulas are those of `algorithms/losses.py` (`logprobs_from_logits`, `entropy_from_logits`) and
docs/algorithms.md section 4: `z = logits / temperature`, `log p = z[label] - logsumexp(z)`,
`H = logsumexp(z) - sum_v softmax(z)_v z_v`. This module does not import `paddle.distributed`: a vocab-parallel head
(per-shard chunks, one all-gather of their statistics) is built on top of it in `parallel/vocab.py`, which imports
`_shifted_statistics`, `_flat_inputs` and subclasses `_ChunkedLMHead` (its backward reads `ctx.label_weight`).
"""
from __future__ import annotations

import math

import paddle
from paddle.autograd import PyLayer

__all__ = ["chunked_logprobs_and_entropy", "num_chunks"]

_F32 = paddle.float32


def _as_f32(x: paddle.Tensor) -> paddle.Tensor:
    return x if x.dtype == _F32 else x.astype(_F32)


def _chunk_logits(h: paddle.Tensor, w: paddle.Tensor, transpose_y: bool, temperature: float) -> paddle.Tensor:
    """`[c, H] x W -> [c, V]` float32 logits of one chunk, divided by the temperature (w is already float32)."""
    z = paddle.matmul(_as_f32(h), w, transpose_y=transpose_y)
    if temperature != 1.0:
        z = paddle.scale(z, scale=1.0 / temperature)
    return z


def _chunks(total: int, chunk_size: int) -> list[tuple[int, int]]:
    return [(s, min(s + chunk_size, total)) for s in range(0, total, chunk_size)]


def _shifted_statistics(z: paddle.Tensor, labels: paddle.Tensor, with_entropy: bool
                        ) -> tuple[paddle.Tensor, paddle.Tensor, paddle.Tensor, paddle.Tensor | None]:
    """Per-row statistics of one chunk's logits `z` [c, V] for `labels` [c], each relative to the row maximum m:
    `(m, z[label] - m, logsumexp(z) - m, sum_v softmax(z)_v z_v - m or None)`, all [c]. Shared with the
    vocab-parallel head (parallel/vocab.py), which combines the shards' statistics."""
    # Max-subtracted log-sum-exp: exp never sees a large logit, and `z - m` is reused for p and the entropy.
    # (Not F.log_softmax: superlinear in V on paddle's CPU kernels, docs/platform.md.)
    m = paddle.max(z, axis=-1, keepdim=True)
    zs = paddle.subtract(z, m)
    del z  # the caller passes the logits without keeping a name for them: this frees them
    e = paddle.exp(zs)
    sum_e = paddle.sum(e, axis=-1)
    lse_s = paddle.log(sum_e)                                           # logsumexp(z) - m
    picked = paddle.take_along_axis(zs, labels.unsqueeze(-1), axis=-1).squeeze(-1)
    mean_s = paddle.sum(paddle.multiply(e, zs), axis=-1) / sum_e if with_entropy else None
    return m.squeeze(-1), picked, lse_s, mean_s


class _ChunkedLMHead(PyLayer):
    """Forward: per-token (log-prob, log-sum-exp, entropy) chunk by chunk. Backward: recompute each chunk's logits.

    Saved for backward: the hidden states and the weight (inputs, no copies), the labels and two `[N]` float32
    statistics (logsumexp, entropy). Nothing of size V outlives a chunk."""

    @staticmethod
    def forward(ctx, hidden: paddle.Tensor, weight: paddle.Tensor, labels: paddle.Tensor, temperature: float,
                chunk_size: int, with_entropy: bool, transpose_y: bool) -> tuple[paddle.Tensor, paddle.Tensor]:
        w = _as_f32(weight)
        total = hidden.shape[0]
        logps, lses, ents = [], [], []
        for start, end in _chunks(total, chunk_size):
            # The logits go straight into the call (no name holds them here): they are freed inside, after `z - m`.
            m, picked, lse_s, mean_s = _shifted_statistics(_chunk_logits(hidden[start:end], w, transpose_y,
                                                                         temperature), labels[start:end],
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
        ctx.save_for_backward(hidden, weight, labels, paddle.concat(lses), ent)
        return logp, ent

    @staticmethod
    def backward(ctx, grad_logp: paddle.Tensor, grad_ent: paddle.Tensor) -> tuple:
        # Why the gradient is what it is. With z = logits / tau, p = softmax(z), log p_v = z_v - lse:
        #   d log p_y / d z_k = [k = y] - p_k                                   (d lse / d z_k = p_k)
        #   H = lse - sum_v p_v z_v, and d p_v / d z_k = p_v ([v = k] - p_k), so
        #   d H / d z_k = p_k - (p_k + p_k z_k - p_k sum_v p_v z_v) = -p_k (z_k - sum_v p_v z_v).
        # Since sum_v p_v z_v = lse - H, the entropy term is -p_k (log p_k + H): it needs only the saved lse and H,
        # not a second pass over V. With upstream gradients a (log-prob) and b (entropy), per position
        #   dL/dz = a * onehot(y) - p * (a + b * (log p + H)),   dL/dlogits = dL/dz / tau,
        # and logits = h W (or h W^T), so dL/dh = dL/dlogits W^T and dL/dW = h^T dL/dlogits, summed over chunks.
        hidden, weight, labels, lse, ent = ctx.saved_tensor()
        temperature, transpose_y = ctx.temperature, ctx.transpose_y
        # [N] float32 or None: scales each position's one-hot term. The vocab-parallel head (parallel/vocab.py, a
        # subclass with its own forward) sets it to 0 where another shard holds the label.
        label_weight = getattr(ctx, "label_weight", None)
        need_h, need_w = not hidden.stop_gradient, not weight.stop_gradient
        w = _as_f32(weight)
        grad_logp = _as_f32(grad_logp)
        grad_ent = _as_f32(grad_ent) if ctx.with_entropy else None
        total = hidden.shape[0]
        dh_chunks = []
        dw = paddle.zeros(w.shape, dtype=_F32) if need_w else None
        for start, end in _chunks(total, ctx.chunk_size):
            h = _as_f32(hidden[start:end])
            z = _chunk_logits(h, w, transpose_y, temperature)
            logp_all = paddle.subtract(z, lse[start:end].unsqueeze(-1))
            del z
            p = paddle.exp(logp_all)
            a = grad_logp[start:end].unsqueeze(-1)
            coeff = a
            if grad_ent is not None:
                b = grad_ent[start:end].unsqueeze(-1)
                coeff = a + b * (logp_all + ent[start:end].unsqueeze(-1))
            del logp_all
            dz = paddle.multiply(p, coeff)                              # p * coeff - a * onehot = -dL/dz
            del p, coeff
            lab = labels[start:end].unsqueeze(-1)
            onehot = a if label_weight is None else a * label_weight[start:end].unsqueeze(-1)
            dz = paddle.put_along_axis(dz, lab, paddle.take_along_axis(dz, lab, axis=-1) - onehot, axis=-1)
            dz = paddle.scale(dz, scale=-1.0 / temperature)             # dL/dlogits
            if need_h:
                dh_chunks.append(paddle.matmul(dz, w, transpose_y=not transpose_y).astype(hidden.dtype))
            if need_w:
                # logits = h @ W ([H, V]): dW = h^T dz; logits = h @ W^T ([V, H]): dW = dz^T h.
                # In place: a new [H, V] sum per chunk would be one more weight-sized tensor at the peak.
                dw.add_(paddle.matmul(dz, h, transpose_x=True) if transpose_y
                        else paddle.matmul(h, dz, transpose_x=True))
            del dz
        dh = paddle.concat(dh_chunks) if need_h else None
        if dw is not None and dw.dtype != weight.dtype:
            dw = dw.astype(weight.dtype)
        return dh, dw


def chunked_logprobs_and_entropy(hidden: paddle.Tensor, weight: paddle.Tensor, labels: paddle.Tensor, *,
                                 temperature: float = 1.0, chunk_size: int = 1024, with_entropy: bool = True,
                                 transpose_y: bool = False) -> tuple[paddle.Tensor, paddle.Tensor | None]:
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
        with_entropy: also return the entropy (and take its gradient).
        transpose_y: `weight` is `[V, H]` (logits = hidden @ weight^T), as PaddleNLP's `transpose_y`.
    Returns:
        `(logprobs [n, T] float32, entropy [n, T] float32 or None)`.
    """
    flat_h, flat_labels = _flat_inputs(hidden, weight, labels, temperature, chunk_size, transpose_y)
    logp, ent = _ChunkedLMHead.apply(flat_h, weight, flat_labels, float(temperature), int(chunk_size),
                                     bool(with_entropy), bool(transpose_y))
    n, t = labels.shape
    logp = logp.reshape([n, t])
    return logp, (ent.reshape([n, t]) if with_entropy else None)


def _flat_inputs(hidden: paddle.Tensor, weight: paddle.Tensor, labels: paddle.Tensor, temperature: float,
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
