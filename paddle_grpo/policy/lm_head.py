"""The LM head of every log-prob path: the model-facing side of the chunked head.

`head_logprobs` is the one entry point of every log-prob path (causal.py, seq2seq.py): with `chunk_size` None it
computes the full logits and `algorithms/losses.py`'s log-softmax exactly as before; with a chunk size it runs the
chunked head (kernels/chunked_head.py: `chunked_logprobs_and_entropy`, per-token statistics `chunk_size` positions at
a time, never the `[rows, T, V]` logits) on the LM head's weight (`LMHead`: weight, layout, optional bias;
`lm_head_of` reads it from the model's head layer: nn.Linear, PaddleNLP's `*LMHead`, a paddlenlp.peft `LoRALinear`).
The vocab-parallel head of tensor parallelism is built on the same maths in parallel/vocab.py.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import paddle

from ..algorithms import entropy_from_logits, logprobs_from_logits
from ..kernels.chunked_head import chunked_logprobs_and_entropy, num_chunks
from ..precision import full_precision

__all__ = ["LMHead", "chunked_logprobs_and_entropy", "head_logprobs", "lm_head_of", "num_chunks"]

logger = logging.getLogger("paddle_grpo.lm_head")

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
