"""A chunked LM head: per-token log-probs and entropy without ever holding the `[rows, T, V]` logits (issue 15).

At a real vocabulary (Qwen's 151,936) the float32 logits of 8 x 512 completion tokens are 2.5 GB, and a plain
log-softmax + entropy + backward keeps several more tensors of that shape (docs/platform.md, "Memory at a real
vocabulary"). `chunked_logprobs_and_entropy` instead walks the flattened `n * T` positions `chunk_size` at a time:
hidden -> logits -> log-sum-exp -> the label's log-prob and the entropy, keeping only per-token statistics. Its
backward (`_ChunkedLMHead`, a `paddle.autograd.PyLayer`) recomputes each chunk's logits and accumulates the gradients
of the hidden states and of the head weight chunk by chunk. Peak extra memory is O(chunk_size x V) in both passes.

`head_logprobs` is the one entry point of every log-prob path (causal.py, seq2seq.py): with `chunk_size` None it
computes the full logits and `algorithms/losses.py`'s log-softmax exactly as before; with a chunk size it runs the
chunked head on the LM head's weight (`LMHead`: weight, layout, optional bias; `lm_head_of` reads it from the model's
head layer: nn.Linear, PaddleNLP's `*LMHead`, a paddlenlp.peft `LoRALinear`).

The formulas are those of `algorithms/losses.py` (`logprobs_from_logits`, `entropy_from_logits`) and
docs/algorithms.md section 4: `z = logits / temperature`, `log p = z[label] - logsumexp(z)`,
`H = logsumexp(z) - sum_v softmax(z)_v z_v`. This module does not import `paddle.distributed`: a vocab-parallel head
(per-shard chunks, one all-gather of their statistics) is built on top of it in `parallel/vocab.py`, which imports
`shifted_statistics`, `_flat_inputs` and subclasses `_ChunkedLMHead` (its backward reads `ctx.label_weight`). The
elementwise work on each chunk's logits is chunk_kernels.py's (numpy on CPU, paddle ops elsewhere).
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import paddle
from paddle.autograd import PyLayer

from ..algorithms import entropy_from_logits, logprobs_from_logits
from .base import full_precision
from .chunk_kernels import accumulate_weight_gradient, chunk_gradient, shifted_statistics

__all__ = ["LMHead", "chunked_logprobs_and_entropy", "head_logprobs", "lm_head_of", "num_chunks"]

logger = logging.getLogger("paddle_grpo.lm_head")

_F32 = paddle.float32


def _as_f32(x: paddle.Tensor) -> paddle.Tensor:
    return x if x.dtype == _F32 else x.astype(_F32)


def _chunk_logits(h: paddle.Tensor, w: paddle.Tensor, transpose_y: bool, temperature: float,
                  b: paddle.Tensor | None = None) -> paddle.Tensor:
    """`[c, H] x W (+ b [V]) -> [c, V]` float32 logits of one chunk, divided by the temperature (w and b are
    already float32). A fresh tensor, which the callers change in place."""
    z = paddle.matmul(_as_f32(h), w, transpose_y=transpose_y)
    # In place here and below: on CPU a new [chunk, V] tensor costs more than the op itself (page faults of a fresh
    # mmap: `scale` 118 ms vs `scale_` 22 ms at [512, 151,936]; tools/bench.py --ops).
    if b is not None:
        z.add_(b)
    if temperature != 1.0:
        z.scale_(1.0 / temperature)
    return z


def _chunks(total: int, chunk_size: int) -> list[tuple[int, int]]:
    return [(s, min(s + chunk_size, total)) for s in range(0, total, chunk_size)]


class _ChunkedLMHead(PyLayer):
    """Forward: per-token (log-prob, log-sum-exp, entropy) chunk by chunk. Backward: recompute each chunk's logits.

    Saved for backward: the hidden states and the weight (inputs, no copies), the labels and two `[N]` float32
    statistics (logsumexp, entropy). Nothing of size V outlives a chunk."""

    @staticmethod
    def forward(ctx, hidden: paddle.Tensor, weight: paddle.Tensor, labels: paddle.Tensor, temperature: float,
                chunk_size: int, with_entropy: bool | str, transpose_y: bool, bias: paddle.Tensor | None = None
                ) -> tuple[paddle.Tensor, paddle.Tensor]:
        # with_entropy "detached": the entropy is computed in the same pass (its terms are at hand) but takes no
        # gradient: backward ignores the (zero) gradient paddle passes for it.
        w = _as_f32(weight)
        b = None if bias is None else _as_f32(bias).reshape([-1])
        total = hidden.shape[0]
        logps, lses, ents = [], [], []
        for start, end in _chunks(total, chunk_size):
            # The logits go straight into the call (no name holds them here): they are freed inside, after `z - m`.
            m, picked, lse_s, mean_s = shifted_statistics(_chunk_logits(hidden[start:end], w, transpose_y,
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
    def backward(ctx, grad_logp: paddle.Tensor, grad_ent: paddle.Tensor) -> tuple:
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
        w = _as_f32(weight)
        b32 = None if bias is None else _as_f32(bias).reshape([-1])
        grad_logp = _as_f32(grad_logp)
        grad_ent = _as_f32(grad_ent) if ctx.with_entropy is True else None
        total = hidden.shape[0]
        dh_chunks = []
        dw = paddle.zeros(w.shape, dtype=_F32) if need_w else None
        db = paddle.zeros(b32.shape, dtype=_F32) if need_b else None
        for start, end in _chunks(total, ctx.chunk_size):
            h = _as_f32(hidden[start:end])
            # dL/dlogits, computed in the recomputed logits' memory (chunk_kernels.py: numpy on CPU).
            dz = chunk_gradient(_chunk_logits(h, w, transpose_y, temperature, b32), labels[start:end],
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
    flat_h, flat_labels = _flat_inputs(hidden, weight, labels, temperature, chunk_size, transpose_y)
    vocab = weight.shape[0] if transpose_y else weight.shape[1]
    if bias is not None and int(math.prod(bias.shape)) != vocab:
        raise ValueError(f"bias {list(bias.shape)} does not have the head's {vocab} outputs")
    if with_entropy not in (True, False, "detached"):
        raise ValueError(f"with_entropy must be True, False or 'detached', got {with_entropy!r}")
    logp, ent = _ChunkedLMHead.apply(flat_h, weight, flat_labels, float(temperature), int(chunk_size),
                                     with_entropy, bool(transpose_y), bias)
    n, t = labels.shape
    logp = logp.reshape([n, t])
    if not with_entropy:
        return logp, None
    ent = ent.reshape([n, t])
    return logp, (ent.detach() if with_entropy == "detached" else ent)


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


# ------------------------------------------------------------------------------------ the head of every path


@dataclass(frozen=True)
class LMHead:
    """An LM head as the chunked path needs it: logits = hidden @ weight (`[H, V]`), or hidden @ weight^T
    (`[V, H]`, `transpose_y`, tied embeddings), plus an optional `bias` `[V]` / `[1, V]`. Calling it computes the
    full logits with exactly those ops (the unchunked path of heads that are not a layer: T5's tied embedding,
    BART's `lm_head_weight` + `final_logits_bias`, the fast Qwen2 path)."""
    weight: paddle.Tensor
    transpose_y: bool = False
    bias: paddle.Tensor | None = None

    def __call__(self, hidden: paddle.Tensor) -> paddle.Tensor:
        """`[..., H] -> [..., V]` logits in the weight's dtype."""
        logits = paddle.matmul(hidden, self.weight, transpose_y=self.transpose_y)
        return logits if self.bias is None else logits + self.bias


def lm_head_of(head: paddle.nn.Layer | LMHead) -> tuple[LMHead | None, str]:
    """`(LMHead, "")` describing `head` for the chunked path, or `(None, why)` when it cannot be chunked exactly.

    Reads: an `LMHead` as is; a plain `nn.Linear` (`[in, out]` = `[H, V]`, with its bias); PaddleNLP's
    `Qwen2LMHead` / `LlamaLMHead` (a `weight` and a `transpose_y` attribute, no bias); a paddlenlp.peft
    `LoRALinear` as `W + scaling * A @ B` inside autograd (the adapters get their gradients through the merged
    weight; W alone when the adapters are disabled or merged). Not chunkable: a vocabulary-sharded weight (the
    vocab-parallel path handles those), sequence-parallel heads, LoRA with dropout in training or a LoRA variant."""
    if isinstance(head, LMHead):
        return head, ""
    from paddlenlp.peft.lora.lora_layers import LoRALinear

    if getattr(head, "weight", None) is None:
        return None, f"{type(head).__name__} has no weight"
    if getattr(head.weight, "is_distributed", False):
        return None, f"{type(head).__name__}'s weight is a tensor-parallel shard (use the vocab-parallel path)"
    if isinstance(head, LoRALinear):
        return _lora_head(head)
    if type(head) is paddle.nn.Linear:
        return LMHead(head.weight, False, head.bias), ""
    if isinstance(getattr(head, "transpose_y", None), bool) and getattr(head, "bias", None) is None:
        if getattr(getattr(head, "config", None), "sequence_parallel", False):
            return None, f"{type(head).__name__} gathers sequence-parallel hidden states"
        return LMHead(head.weight, head.transpose_y), ""
    return None, f"{type(head).__name__} is not a head this module knows how to read"


def _lora_head(head):
    """LoRALinear -> its effective weight (see lm_head_of)."""
    if head.disable_lora or head.merged:
        return LMHead(head.weight, False, head.bias), ""
    variant = [k for k in ("lora_use_mixer", "use_mora", "pissa") if getattr(head, k, False)]
    if variant:
        return None, f"LoRALinear with {variant[0]} is not plain LoRA"
    if isinstance(head.lora_dropout, paddle.nn.Dropout) and head.training and head.lora_dropout.p > 0:
        return None, "LoRA dropout on the head's input in training does not fold into one weight"
    # Same function as LoRALinear.forward: x W + b + (x A B) * s = x (W + s A B) + b (rounding aside).
    return LMHead(head.weight + paddle.matmul(head.lora_A, head.lora_B) * head.scaling, False, head.bias), ""


_warned: set[str] = set()


def head_logprobs(hidden: paddle.Tensor, head: paddle.nn.Layer | LMHead, labels: paddle.Tensor, *,
                  temperature: float = 1.0, with_entropy: bool | str = False, chunk_size: int | None = None
                  ) -> tuple[paddle.Tensor, paddle.Tensor | None]:
    """Per-token log-probs (and entropy) of `labels` under `head(hidden) / temperature`: the LM head of every
    log-prob path (causal.py, seq2seq.py).

    Args:
        hidden: `[n, T, H]` final hidden states (after the model's last norm and any scaling its forward applies).
        head: the model's head layer (`get_output_embeddings()`) or an `LMHead`.
        labels: `[n, T]` token ids.
        with_entropy: False, True (differentiable) or "detached" (no gradient graph; for logging).
        chunk_size: None: the full `[n, T, V]` logits, then algorithms' `logprobs_from_logits` /
            `entropy_from_logits` in float32 (the unchunked path, unchanged). An int: `chunked_logprobs_and_entropy`
            on the head's weight, `chunk_size` positions at a time (peak extra memory O(chunk_size x V)); a head
            that cannot be chunked exactly (`lm_head_of`) falls back to the full logits, with one warning.
    Returns:
        `(logprobs [n, T] float32, entropy [n, T] float32 or None)`.
    """
    if chunk_size is not None:
        with full_precision():  # under AMP: a LoRA head's merged weight and every chunk in float32
            spec, why = lm_head_of(head)
            if spec is not None:
                return chunked_logprobs_and_entropy(hidden, spec.weight, labels, temperature=temperature,
                                                    chunk_size=chunk_size, with_entropy=with_entropy,
                                                    transpose_y=spec.transpose_y, bias=spec.bias)
        if why not in _warned:
            _warned.add(why)
            logger.warning("use_fused_head_and_loss_fn: full logits instead of the chunked LM head: %s", why)
    logits = head(hidden).astype("float32")
    with full_precision():
        return logprobs_from_logits(logits, labels, temperature=temperature), entropy(logits, temperature,
                                                                                      with_entropy)


def entropy(logits: paddle.Tensor, temperature: float, with_entropy: bool | str) -> paddle.Tensor | None:
    """None, the entropy [bs, T] of logits [bs, T, V] / temperature (differentiable), or with "detached" the
    entropy without an autograd graph (for logging only: no [bs, T, V] intermediates are kept for a backward pass
    that will not use them)."""
    if not with_entropy:
        return None
    if with_entropy == "detached":
        with paddle.no_grad():
            return entropy_from_logits(logits.detach() / temperature)
    return entropy_from_logits(logits / temperature)
