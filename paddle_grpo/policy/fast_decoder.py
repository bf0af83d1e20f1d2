"""A lean forward pass of PaddleNLP's decoder family `Qwen2ForCausalLM` / `LlamaForCausalLM` for the RL hot paths
(log-probs, updates, decoding). The two share their blocks (pre-norm RMSNorm, grouped-query attention with RoPE,
SwiGLU MLP, tied or untied LM head); Llama's q/k/v projections have no bias, which is the only difference here.

It computes the same function with the SAME parameter tensors (read from the PaddleNLP model object at each call,
so gradients, optimizer updates and checkpoints are PaddleNLP's own; nothing is copied or renamed), written with
fewer and cheaper paddle ops, and it shares work between the G samples of a prompt:

- Prompt sharing: rows with identical prompts (the G samples of a group) run their prompt tokens through the model
  once; their completion tokens attend to the shared prompt keys/values (gathered per row). Exact: the prompt's
  states do not depend on the completion. For G = 8 and prompt = completion length this removes 44 % of the tokens
  of every log-prob and update pass. The last completion token is not fed either (it predicts nothing we need).
- Tokens kept flat `[tokens, hidden]` outside attention, so each projection is one GEMM over prompts and completions.
- q/k/v and gate/up projections fused into one GEMM each (weights concatenated per call, inside autograd).
- Grouped-query attention by reshaping the queries to `[B, kv_heads, group * S, d]` instead of `tile`-repeating keys
  and values; RoPE tables gathered once per forward (not per layer) and `rotate_half` as one `roll`; RMSNorm with
  `x * x` instead of `pow` (paddle's CPU `pow` is ~30x slower than a multiply); one attention bias for all layers.
- Paddle's slow CPU kernels avoided: with gradients, RMSNorm's backward reduces by matrix products
  (kernels/norm.py); `silu(gate) * up` instead of `swiglu`; key axes of 96-127 keys padded with masked keys to 128,
  where paddle's CPU softmax takes a faster kernel (`key_padding`).
- Decoding: a preallocated KV cache `[N, kv_heads, L + max_new, d]` written in place, instead of a concat per step;
  with `keep` (multi-turn rollouts) each row writes its own next slot, so its tokens stay consecutive.

Numbers equal PaddleNLP's forward up to float32 rounding (tests/policy/test_fast_decoder.py compares logits, log-probs,
greedy generations and gradients against `Qwen2ForCausalLM.forward` and `LlamaForCausalLM.forward`).

Switch: `enabled_for(model)` / `refusal(model)` accept a plain float32 `Qwen2ForCausalLM` or `LlamaForCausalLM`, or
the critic's `Qwen2ForSequenceClassification` or ValueModel (critic.py: hidden states only, no LM head), built as
PaddleNLP builds the family, and refuse, with the reason, any class, layer or config value this path does not
implement (LoRA/quantised layers, tensor/sequence parallelism, fused layouts, rope scaling other than rope.py's
tables (linear, dynamic, llama3, yarn: installed at load), another head_dim, extra
biases, GPU kernel flags, AMP, ...), or everything when the environment sets `PADDLE_GRPO_FAST=0`. A refused model
runs PaddleNLP's forward (modeling.py / rollout/); `describe(model)` is the start-up line that says which.

LoRA: a LoRAModel's log-probs and updates run PaddleNLP's forward (its LoRALinear layers, whose gradients reach the
adapters), but its sampling runs the lean path (`sampling_refusal`, `sampling_decoder`): once per rollout each
adapted projection's weight is merged into a copy, W + scaling * A @ B (lora.merged_weight, under no_grad; the
model's parameters are not written), and FastDecoder (and on CPU decode_engine.py) decodes with the copies. Merged,
the products round differently from x W + s (x A) B: sampled tokens equal PaddleNLP's forward's up to float32
rounding, as the plain model's do (tests/policy/test_lora_sampling.py).

Recompute: with the model config's `recompute` (PaddleNLP's key; causal.load_causal_lm sets it on the trainable
policy only) and gradients being recorded, `prompt_completion_hidden` checkpoints per `recompute_granularity`, as
PaddleNLP's forward does: "full" each decoder layer, "full_attn" each attention sub-block (q/k/v projections, RoPE,
attention, output projection), "core_attn" each softmax(QK^T + bias) V; layers in `no_recompute_layers` are not.
It runs paddle's own recompute (parallel/recompute.py) with `recompute_use_reentrant`. Exact: this path has no
dropout, so the rerun computes the same values.
"""
from __future__ import annotations

import functools
import math
import os
from typing import Any, Callable, Optional, Tuple

import numpy as np
import paddle
import paddle.nn.functional as F

from ..parallel.recompute import checkpoint, needs_grad
from ..kernels.attention import blockwise_attention, query_block
from ..kernels.mlp import mlp, mlp_plan
from ..kernels.norm import rms_norm
from . import lora

ENV_SWITCH = "PADDLE_GRPO_FAST"
LORA_REFUSAL = "LoRA adapters (LoRAModel): its LoRA layers run in PaddleNLP's forward"

# The PaddleNLP classes the lean forward implements, by family. Both families have the same decoder blocks (pre-norm
# RMSNorm, grouped-query attention with rotary positions, SwiGLU MLP, final RMSNorm, optional tied head); Qwen2's
# q/k/v projections have biases, Llama's have none. A sequence classifier / ValueModel is the critic (critic.py:
# hidden states only, no LM head).
FAMILIES = {
    "Qwen2ForCausalLM": "qwen2", "Qwen2ForSequenceClassification": "qwen2", "LlamaForCausalLM": "llama",
}
# ValueModel (value_model.py) backbones: the critic of a family without a sequence classifier (Llama).
BACKBONES = {"Qwen2Model": "qwen2", "LlamaModel": "llama"}
# PaddleNLP rotary classes whose cached cos/sin tables are plain RoPE at the config's rope_theta (no scaling), and
# rope.py's ScaledRotary (transformers' scaled tables, installed at load for a config with rope scaling).
PLAIN_ROTARY = ("Qwen2RotaryEmbedding", "LlamaRotaryEmbedding")
SCALED_ROTARY = "ScaledRotary"
# Kernel flags (the precision plan's, or a config's): PaddleNLP's GPU kernels, not this path's ops.
KERNEL_FLAGS = ("use_flash_attention", "use_fused_rms_norm", "use_fused_rope", "use_flash_attention_for_generation")
# paddle's CPU softmax takes a slower kernel over a last axis shorter than 128: measured (paddle 3.3.1, one AMD EPYC
# core, 2M elements) 4.4-6.7 ns per element at 32-127 keys, 1.5-2.5 ns at 128-257. Key axes of PAD_KEYS_FROM or
# more are padded to SOFTMAX_FAST_KEYS with masked keys (zero keys and values, bias finfo.min: probability exactly 0),
# which costs at most a third more in the two attention products. At the TRL comparison shape (127 keys) the
# forward's softmax takes 3.9 ms instead of 9.5 per layer.
SOFTMAX_FAST_KEYS = 128
PAD_KEYS_FROM = 96


def key_padding(keys: int) -> int:
    """How many masked keys to append to an attention over `keys` keys (0: none)."""
    return SOFTMAX_FAST_KEYS - keys if PAD_KEYS_FROM <= keys < SOFTMAX_FAST_KEYS else 0


def decoder_of(model: paddle.nn.Layer) -> paddle.nn.Layer:
    """The decoder (embeddings, layers, final norm) of a model `refusal` accepts: `model.<base_model_prefix>`."""
    return getattr(model, model.base_model_prefix)


def family(model: paddle.nn.Layer) -> Optional[str]:
    """"qwen2" or "llama": the family of `model`'s exact class (FAMILIES; a ValueModel by its backbone's class), or
    None for any other model."""
    name = type(model).__name__
    if name == "ValueModel" and type(model).__module__.endswith("policy.value_model"):
        return BACKBONES.get(type(decoder_of(model)).__name__)
    if name in FAMILIES and type(model).__module__.startswith("paddlenlp.transformers."):
        return FAMILIES[name]
    return None


def refusal(model: paddle.nn.Layer) -> Optional[str]:
    """None when the lean path computes exactly what `model`'s own forward would; otherwise why not, naming the
    class, layer or config field (and its value) that it does not implement. Accepted: a float32 model of FAMILIES
    (exact type: not a `paddle.DataParallel` or LoRA wrapper), or the critic's ValueModel over one of BACKBONES,
    built as its family builds it: plain `nn.Linear` projections, q/k/v biases all present (Qwen2) or all absent
    (Llama) and no other bias, SiLU gating, plain RoPE at the config's rope_theta, head_dim = hidden / heads,
    rms_norm_eps and tied or untied embeddings as configured; PaddleNLP's recompute keys are implemented too."""
    if os.environ.get(ENV_SWITCH, "1") == "0":
        return f"{ENV_SWITCH}=0"
    if type(model).__name__ == "LoRAModel":
        return LORA_REFUSAL
    return _model_refusal(model, (paddle.nn.Linear,))


def _model_refusal(model: paddle.nn.Layer, linear: tuple[type, ...]) -> Optional[str]:
    """`refusal`'s checks of the model's class, layers and config, its projections being of a type in `linear`."""
    fam = family(model)
    if fam is None:
        return (f"{type(model).__name__} is not a class it implements ({', '.join(FAMILIES)}, or the critic's "
                f"ValueModel over {' / '.join(BACKBONES)})")
    c, decoder = model.config, decoder_of(model)
    # First the layouts that change the layers' classes (named by their key rather than by the layer they make).
    for key in ("tensor_parallel_degree", "context_parallel_degree", "sep_parallel_degree"):
        if int(getattr(c, key, 1) or 1) > 1:
            return f"{key} is {getattr(c, key)}"
    for key in ("sequence_parallel", "fuse_attention_qkv", "fuse_attention_ffn"):
        if getattr(c, key, None):
            return f"{key} is {getattr(c, key)!r}"
    qkv_bias: list[bool] = []
    rotary = ""
    for layer_index, layer in enumerate(decoder.layers):
        # Plain nn.Linear only: a LoRA (or quantised) layer inside the model has extra weights that this path,
        # which reads `.weight`/`.bias`, would silently ignore (sampling_refusal admits LoRALinear, whose
        # adapters sampling_decoder merges); fused layouts have other names.
        a, m = layer.self_attn, layer.mlp
        for name, projection in _projections(layer):
            if type(projection) not in linear:
                kinds = " or ".join("nn.Linear" if t is paddle.nn.Linear else t.__name__ for t in linear)
                return f"layer {layer_index} {name} is {type(projection).__name__}, not a plain {kinds}"
        qkv_bias = [getattr(a, name).bias is not None for name in ("q_proj", "k_proj", "v_proj")]
        if len(set(qkv_bias)) > 1:
            return f"layer {layer_index} has a bias on some of q/k/v_proj only"
        for part, name in ((a, "o_proj"), (m, "gate_proj"), (m, "up_proj"), (m, "down_proj")):
            if getattr(part, name).bias is not None:
                return f"layer {layer_index} {name} has a bias"
        rotary = type(getattr(a, "rotary_emb", None)).__name__
        if rotary not in PLAIN_ROTARY + (SCALED_ROTARY,):
            return f"the rotary embedding is {rotary} (plain RoPE, or rope.py's scaled tables, only)"
    dtype = decoder.embed_tokens.weight.dtype
    if dtype != paddle.float32:
        # PaddleNLP's RMSNorm upcasts bf16/fp16 activations, which this path does not replicate.
        return f"the parameters are {str(dtype).replace('paddle.', '')} (float32 only)"
    if paddle.amp.is_autocast_enabled():
        return "an autocast (AMP) is active"
    for flag in KERNEL_FLAGS:
        if getattr(c, flag, False):
            return f"{flag} is set (PaddleNLP's kernels)"
    # rope_interleaved (SmolLM2's config.json spells it out, false): rotating pairs of adjacent dimensions instead
    # of the two halves, which neither PaddleNLP's layers nor this path do.
    for key in ("refined_recompute", "alibi", "use_long_sequence_strategies", "use_sliding_window", "mlp_bias",
                "rope_interleaved"):
        if getattr(c, key, None):
            return f"{key} is {getattr(c, key)!r}"
    # HF-style configs spell out the q/k/v biases (Qwen2: true, Llama: false); PaddleNLP's layers do not read the
    # field (Qwen2 always has them, Llama never), so a value that contradicts the built layers means checkpoint
    # weights PaddleNLP's model does not compute with: refused rather than guessed.
    bias = getattr(c, "attention_bias", None)
    if bias is not None and bool(bias) != any(qkv_bias):
        return f"attention_bias is {bias!r}"
    # Scaling is computed only through rope.py's tables (the layer check above accepts them): a config that asks for
    # it over PaddleNLP's plain tables is refused here (rope.check stops such a model before any forward).
    if getattr(c, "rope_scaling_type", None) is not None:
        return f"rope_scaling_type is {c.rope_scaling_type!r} (PaddleNLP's own scaling; not computed here)"
    if getattr(c, "rope_scaling", None) and rotary != SCALED_ROTARY:
        return f"rope_scaling is {c.rope_scaling!r} over the {rotary} tables (plain RoPE)"
    act = getattr(c, "hidden_act", "silu")  # PaddleNLP's Llama has no such field: its MLP is SwiGLU
    if act != "silu":
        return f"hidden_act is {act!r} (SiLU only)"
    if float(getattr(c, "attention_dropout", 0.0) or 0.0) != 0.0:
        return f"attention_dropout is {c.attention_dropout}"
    head_dim = getattr(c, "head_dim", None)
    if head_dim is not None and int(head_dim) != c.hidden_size // c.num_attention_heads:
        return (f"head_dim is {head_dim}, not hidden_size / num_attention_heads = "
                f"{c.hidden_size // c.num_attention_heads} (PaddleNLP's layers use the latter)")
    return None


def enabled_for(model: paddle.nn.Layer) -> bool:
    """Whether the lean path computes exactly what `model`'s own forward would (`refusal` says why not)."""
    return refusal(model) is None


def _projections(layer: paddle.nn.Layer) -> list[tuple[str, Optional[paddle.nn.Layer]]]:
    """The seven projections of a decoder layer the lean path reads, (name, layer or None when absent)."""
    a, m = layer.self_attn, layer.mlp
    return [(name, getattr(a, name, None)) for name in ("q_proj", "k_proj", "v_proj", "o_proj")] + [
        (name, getattr(m, name, None)) for name in ("gate_proj", "up_proj", "down_proj")]


def sampling_refusal(model: paddle.nn.Layer) -> Optional[str]:
    """None when sampling runs the lean path (`sampling_decoder`), else why not: `refusal(model)` for any model but a
    LoRAModel; a LoRAModel is accepted when its base model passes `refusal`'s checks with LoRALinear projections
    (their adapters merged), every LoRA layer is a plain LoRALinear (lora.merge_refusal: not quantised,
    tensor-parallel, MoRA, ...) and each is one of the projections the lean path reads."""
    if type(model).__name__ != "LoRAModel":
        return refusal(model)
    if os.environ.get(ENV_SWITCH, "1") == "0":
        return f"{ENV_SWITCH}=0"
    from paddlenlp.peft.lora import LoRALinear

    base = model.model
    why = lora.merge_refusal(model) or _model_refusal(base, (paddle.nn.Linear, LoRALinear))
    if why is None:
        read = {id(projection) for layer in decoder_of(base).layers for _, projection in _projections(layer)}
        outside = [name for name, layer in lora.lora_layers(model).items() if id(layer) not in read]
        why = f"{outside[0]} is adapted, which the lean path does not read" if outside else None
    return None if why is None else f"LoRA adapters (LoRAModel): {why}"


def sampling_decoder(model: paddle.nn.Layer) -> FastDecoder:
    """The FastDecoder sampling decodes `model` with (a model `sampling_refusal` accepts): FastDecoder(model), or
    for a LoRAModel one over its base model whose adapted projections are merged copies W + scaling * A @ B
    (lora.merged_weight), computed here under no_grad. Build one per rollout (causal.FastDecoderStepper does): it
    samples with the adapters' values at build time. The model's parameters are read only."""
    if type(model).__name__ != "LoRAModel":
        return FastDecoder(model)
    return FastDecoder(model.model, weight=lora.merged_weight)


def describe(model: paddle.nn.Layer) -> str:
    """The start-up line of the path `model`'s log-probs and decoding take: "decoder: fast path (llama)",
    "decoder: PaddleNLP's forward (<why>)", or for a LoRAModel whose sampling runs the lean path (`sampling_refusal`)
    "decoder: sampling on the fast path (llama) with the LoRA adapters merged ...; log-probs on PaddleNLP's forward
    ..."."""
    why = refusal(model)
    if why is None:
        return f"decoder: fast path ({family(model)})"
    if why == LORA_REFUSAL:
        sampling_why = sampling_refusal(model)
        if sampling_why is not None:
            return f"decoder: PaddleNLP's forward ({sampling_why})"
        return (f"decoder: sampling on the fast path ({family(model.model)}) with the LoRA adapters merged "
                f"(W + scaling * A @ B, once per rollout); log-probs and updates on PaddleNLP's forward (its LoRA "
                f"layers)")
    return f"decoder: PaddleNLP's forward ({why})"


GRANULARITIES = ("full", "full_attn", "core_attn")


def recompute_granularity(model: paddle.nn.Layer) -> Optional[str]:
    """None, or what the lean path recomputes in backward: the config's `recompute_granularity` when its `recompute`
    is on (or PaddleNLP's Trainer switched the decoder's `enable_recompute` on: the same two ways PaddleNLP's forward
    is told)."""
    c = model.config
    if not (c.recompute or decoder_of(model).enable_recompute):
        return None
    if c.recompute_granularity not in GRANULARITIES:
        raise ValueError(f"recompute_granularity must be one of {GRANULARITIES}, got {c.recompute_granularity!r}")
    return c.recompute_granularity


class FastDecoder:
    """The lean forward bound to one model `refusal` accepts (a Qwen2 or Llama causal LM, or the critic's classifier
    / ValueModel over their decoder). Holds no parameters; build one per call (the fused weights are concatenations
    of the current parameters, inside autograd when gradients are on).

    `weight(linear layer) -> [in, out]`: the weight each projection computes with (default its `.weight`);
    `sampling_decoder` passes lora.merged_weight (W + scaling * A @ B, copies without gradient: sampling only)."""

    def __init__(self, model: paddle.nn.Layer, weight: Optional[Callable[[paddle.nn.Layer], paddle.Tensor]] = None):
        self.model = model
        merged = weight is not None
        weight = weight or (lambda linear: linear.weight)
        c = model.config
        self.H, self.KV = c.num_attention_heads, c.num_key_value_heads
        self.D = c.hidden_size
        self.d = self.D // self.H
        self.g = self.H // self.KV
        self.eps = c.rms_norm_eps
        self.neg = float(np.finfo(np.float32).min)  # PaddleNLP's additive mask value (finfo(dtype).min)
        decoder = decoder_of(model)
        self.embed = decoder.embed_tokens.weight
        self.final_norm = decoder.norm.weight
        head = getattr(model, "lm_head", None)  # none in the critic (critic.py), which reads final_hidden only
        self.head, self.head_t = (head.weight, head.transpose_y) if head is not None else (None, False)
        self.layers = []
        for layer in decoder.layers:
            a, m = layer.self_attn, layer.mlp
            wg, wu = weight(m.gate_proj), weight(m.up_proj)
            self.layers.append(dict(
                ln1=layer.input_layernorm.weight, ln2=layer.post_attention_layernorm.weight,
                wqkv=paddle.concat([weight(a.q_proj), weight(a.k_proj), weight(a.v_proj)], axis=1),
                # Qwen2's q/k/v biases; None for Llama (no bias: `refusal` checked they are all or none)
                bqkv=(paddle.concat([a.q_proj.bias, a.k_proj.bias, a.v_proj.bias], axis=0)
                      if a.q_proj.bias is not None else None),
                wo=weight(a.o_proj),
                wgu=paddle.concat([wg, wu], axis=1), wd=weight(m.down_proj),
                # the decode steps' (`decode_mlp`); merged copies are not kept twice (wgu holds them): decode_mlp
                # then takes the halves of one product with wgu
                wg=None if merged else wg, wu=None if merged else wu))
        self.rotary = decoder.layers[0].self_attn.rotary_emb
        half = self.d // 2
        self.sign = paddle.to_tensor([-1.0] * half + [1.0] * (self.d - half), dtype="float32")
        self.inv_d = paddle.full([self.D, 1], 1.0 / self.D, dtype="float32")

    # ------------------------------------------------------------------------------------------ pieces

    def rms(self, x: paddle.Tensor, w: paddle.Tensor) -> paddle.Tensor:
        """RMSNorm of x [n, D] (PaddleNLP: rsqrt(mean(x^2) + eps) * x * w). The mean is a GEMV and the [n, 1]
        factor is the right operand: paddle's CPU broadcast is ~10x slower with it on the left, and its `mean`
        reduction slower than a matrix-vector product; with gradients, kernels/norm.py's backward (its reductions
        are matrix products too)."""
        return rms_norm(x, w, self.inv_d, self.eps)

    def rope_tables(self, positions: paddle.Tensor) -> tuple[paddle.Tensor, paddle.Tensor]:
        """positions: int64 [n] -> (cos, signed sin) [n, H + KV, d] from PaddleNLP's own cached tables, expanded
        over the q and k heads once per forward (a broadcast multiply over the middle axis is ~15x slower on CPU)."""
        need = int(positions.max()) + 1
        if need > self.rotary.max_seq_len_cached:
            self.rotary._set_cos_sin_cache(need)
        shape = [positions.shape[0], self.H + self.KV, self.d]
        cos = paddle.index_select(self.rotary.cos_cached[0, :, 0, :], positions)
        sin = paddle.index_select(self.rotary.sin_cached[0, :, 0, :], positions) * self.sign
        return cos.unsqueeze(1).expand(shape), sin.unsqueeze(1).expand(shape)

    def qkv(self, x: paddle.Tensor, lw: dict[str, paddle.Tensor], cos: paddle.Tensor, sin: paddle.Tensor
            ) -> tuple[paddle.Tensor, paddle.Tensor, paddle.Tensor]:
        """x [n, D] -> q [n, H, d], k [n, KV, d], v [n, KV, d] with RoPE applied to q and k."""
        n = x.shape[0]
        mixed = F.linear(x, lw["wqkv"], lw["bqkv"]).reshape([n, self.H + 2 * self.KV, self.d])
        qk, v = paddle.split(mixed, [self.H + self.KV, self.KV], axis=1)
        # rotate_half(x) * sin == roll(x, d/2) * (sin with the first half negated)
        qk = qk * cos + paddle.roll(qk, self.d // 2, axis=-1) * sin
        q, k = paddle.split(qk, [self.H, self.KV], axis=1)
        return q, k, v

    def heads(self, t: paddle.Tensor, B: int, S: int) -> paddle.Tensor:
        """[B*S, KV, d] -> [B, KV, S, d]"""
        return t.reshape([B, S, self.KV, self.d]).transpose([0, 2, 1, 3])

    def attend(self, q: paddle.Tensor, k: paddle.Tensor, v: paddle.Tensor, bias: paddle.Tensor) -> paddle.Tensor:
        """Grouped-query attention without repeating k/v.

        q [B, Sq, H, d]; k, v [B, KV, Sk, d]; bias [B, KV, g, Sq, Sk] (0 or finfo.min) -> [B * Sq, H * d]."""
        B, Sq = q.shape[0], q.shape[1]
        Sk = k.shape[2]
        qg = q.reshape([B, Sq, self.KV, self.g, self.d]).transpose([0, 2, 3, 1, 4])
        qg = qg.reshape([B, self.KV, self.g * Sq, self.d]) / math.sqrt(self.d)
        scores = paddle.matmul(qg, k, transpose_y=True).reshape([B, self.KV, self.g, Sq, Sk]) + bias
        probs = F.softmax(scores, axis=-1).reshape([B, self.KV, self.g * Sq, Sk])
        out = paddle.matmul(probs, v).reshape([B, self.KV, self.g, Sq, self.d])
        return out.transpose([0, 3, 1, 2, 4]).reshape([B * Sq, self.H * self.d])

    def attend_blocks(self, q: paddle.Tensor, k: paddle.Tensor, v: paddle.Tensor, bias: paddle.Tensor, block: int
                      ) -> paddle.Tensor:
        """`attend` `block` queries at a time (kernels/attention.py: the scores never exist for all queries at once).

        q [B, Sq, H, d]; k, v [B, KV, Sk, d]; bias [B, 1, 1, Sq, Sk] (the compact mask) -> [B * Sq, H * d]."""
        B, Sq = q.shape[0], q.shape[1]
        qg = q.reshape([B, Sq, self.KV, self.g, self.d]).transpose([0, 2, 3, 1, 4]) / math.sqrt(self.d)
        out = blockwise_attention(qg, k, v, bias, block)
        return out.transpose([0, 3, 1, 2, 4]).reshape([B * Sq, self.H * self.d])

    def attention_for(self, B: int, Sq: int, Sk: int, keep: paddle.Tensor) -> tuple[Callable[..., paddle.Tensor],
                                                                                     paddle.Tensor, int]:
        """The core attention for scores [B, H, Sq, Sk], its mask from keep bool [B, Sq, Sk] and the number of
        masked keys the caller appends (`pad_keys`): `attend` with the full-shape bias over Sk + `key_padding(Sk)`
        keys, or above attention.BLOCK_ABOVE elements `attend_blocks` (its own softmax: no padding) with the
        compact one."""
        block = query_block(B, self.H, Sq, Sk)
        if block is None:
            pad = key_padding(Sk)
            if pad:
                keep = paddle.concat([keep, paddle.zeros([B, Sq, pad], dtype="bool")], axis=2)
            return self.attend, self.bias(keep, B, Sq, Sk + pad), pad
        return functools.partial(self.attend_blocks, block=block), self.bias(keep, B, Sq, Sk, expand=False), 0

    def pad_keys(self, t: paddle.Tensor, pad: int) -> paddle.Tensor:
        """Keys or values [B, KV, S, d] followed by `pad` zero rows: [B, KV, S + pad, d]."""
        if not pad:
            return t
        return paddle.concat([t, paddle.zeros([t.shape[0], self.KV, pad, self.d], dtype=t.dtype)], axis=2)

    def mlp_block(self, x: paddle.Tensor, lw: dict[str, paddle.Tensor]) -> paddle.Tensor:
        """Residual MLP sub-block on flat tokens [n, D]."""
        h = self.rms(x, lw["ln2"])
        plan = mlp_plan(h.shape[0], lw["wd"].shape[0])
        if plan is None:
            # silu(gate) * up, PaddleNLP's unfused MLP's arithmetic: paddle's CPU `swiglu` kernel is slower than
            # the two ops (one core, [2272, 1408]: forward + backward 21 ms against 15 ms with the split).
            gate, up = paddle.split(paddle.matmul(h, lw["wgu"]), 2, axis=-1)
            return x + paddle.matmul(F.silu(gate) * up, lw["wd"])
        return x + mlp(h, lw["wgu"], lw["wd"], *plan)  # a long sequence: in row blocks, less kept (kernels/mlp.py)

    def decode_mlp(self, x: paddle.Tensor, lw: dict[str, paddle.Tensor]) -> paddle.Tensor:
        """`mlp_block` for the decode steps' few rows x [N, D]: gate and up as two products with the model's own
        weights instead of one with their concatenation. At these row counts paddle's MKL is slow on the wide
        concatenation ([32, 576] x [576, 3072] at 31-35 GFLOP/s, the two halves at ~43, one core, AMD EPYC): a
        SmolLM2-135M rollout 17 % shorter at 1 thread and 10 % at 2, the TRL comparison shape 2-3 %
        (docs/PERFORMANCE.md). The same sums per output column, so the same values up to float rounding (bit for
        bit where measured)."""
        h = self.rms(x, lw["ln2"])
        if lw["wg"] is None:  # merged LoRA weights (`weight`): gate and up held once, in wgu
            gate, up = paddle.split(paddle.matmul(h, lw["wgu"]), 2, axis=-1)
            return x + paddle.matmul(F.silu(gate) * up, lw["wd"])
        return x + paddle.matmul(F.silu(paddle.matmul(h, lw["wg"])) * paddle.matmul(h, lw["wu"]), lw["wd"])

    def final_hidden(self, h: paddle.Tensor) -> paddle.Tensor:
        """The final RMSNorm: [..., D] -> [..., D], what the LM head reads (lm_head.head_logprobs)."""
        return self.rms(h, self.final_norm)

    def logits(self, h: paddle.Tensor) -> paddle.Tensor:
        """Final norm + LM head: [..., D] -> [..., V]."""
        return paddle.matmul(self.final_hidden(h), self.head, transpose_y=self.head_t)

    def bias(self, keep: paddle.Tensor, B: int, Sq: int, Sk: int, expand: bool = True) -> paddle.Tensor:
        """keep bool [B, Sq, Sk] -> additive float32 bias [B, KV, g, Sq, Sk] (0 where kept, finfo.min elsewhere),
        materialised at the full scores shape once per forward: a broadcast add is ~20x slower on CPU. Memory: one
        scores-sized tensor per forward, shared by all layers (autograd keeps one probs tensor per layer anyway).
        `expand=False`: the compact [B, 1, 1, Sq, Sk] (attend_blocks broadcasts it per block)."""
        bias = paddle.where(keep, paddle.zeros([1], "float32"), paddle.full([1], self.neg, "float32"))
        bias = bias.reshape([B, 1, 1, Sq, Sk])
        return bias.expand([B, self.KV, self.g, Sq, Sk]) if expand else bias

    # ---------------------------------------------------------------------------------- shared-prompt pass

    def prompt_completion_hidden(self, prompt_ids: paddle.Tensor, prompt_mask: paddle.Tensor,
                                 completion_ids: paddle.Tensor, completion_mask: paddle.Tensor) -> paddle.Tensor:
        """Hidden states (before the final norm) that predict each completion token.

        prompt_ids/mask [N, L] left-padded; completion_ids/mask [N, T]. Identical prompt rows are computed once.
        Returns [N, T, D]: row i, column t is the state at position L + t - 1 of sequence i.
        """
        N, L = prompt_ids.shape
        T = completion_ids.shape[1]
        rows_np, first = unique_rows(prompt_ids.numpy(), prompt_mask.numpy())
        P, Tc = len(first), T - 1  # the last completion token is never an input
        first_t = paddle.to_tensor(first, dtype="int64")
        rows = paddle.to_tensor(rows_np, dtype="int64")
        pid, pmask = paddle.index_select(prompt_ids, first_t), paddle.index_select(prompt_mask, first_t)
        positions = paddle.clip(paddle.cumsum(paddle.concat([prompt_mask, completion_mask], axis=1)
                                              .astype("int64"), axis=-1) - 1, min=0)
        ppos = paddle.index_select(positions[:, :L], first_t).reshape([-1])
        pkeep = pmask.astype("bool")
        causal_p = paddle.tril(paddle.ones([L, L], dtype="bool"))
        attend_p, bias_p, pad_p = self.attention_for(P, L, L, pkeep[:, None, :] & causal_p[None])
        tokens = paddle.index_select(self.embed, pid.reshape([-1]))  # [P*L, D]
        if Tc > 0:
            cpos = positions[:, L:L + Tc].reshape([-1])
            cmask = completion_mask[:, :Tc].astype("bool")
            causal_c = paddle.tril(paddle.ones([Tc, Tc], dtype="bool"))
            keep_c = paddle.concat([paddle.index_select(pkeep, rows)[:, None, :].expand([N, Tc, L]),
                                    cmask[:, None, :] & causal_c[None]], axis=2)
            attend_c, bias_c, pad_c = self.attention_for(N, Tc, L + Tc, keep_c)
            tokens = paddle.concat([tokens, paddle.index_select(self.embed, completion_ids[:, :Tc].reshape([-1]))])
            cos, sin = self.rope_tables(paddle.concat([ppos, cpos]))
        else:
            attend_c, bias_c, pad_c = None, None, 0
            cos, sin = self.rope_tables(ppos)
        granularity = recompute_granularity(self.model)
        skip = set(self.model.config.no_recompute_layers or ())
        reentrant = bool(self.model.config.recompute_use_reentrant)

        def attention(xn, wqkv, bqkv, wo, core):
            """Attention sub-block: normed tokens [P*L + N*Tc, D] -> output projection [P*L + N*Tc, D]."""
            q, k, v = self.qkv(xn, {"wqkv": wqkv, "bqkv": bqkv}, cos, sin)
            if Tc > 0:
                (qp, qc), (kp, kc), (vp, vc) = (paddle.split(t, [P * L, N * Tc], axis=0) for t in (q, k, v))
            else:
                qp, kp, vp = q, k, v
            kp, vp = self.heads(kp, P, L), self.heads(vp, P, L)
            attn = core(attend_p, qp.reshape([P, L, self.H, self.d]), self.pad_keys(kp, pad_p),
                        self.pad_keys(vp, pad_p), bias_p)
            if Tc > 0:
                pad = [paddle.zeros([N, self.KV, pad_c, self.d], dtype=kc.dtype)] if pad_c else []
                keys = paddle.concat([paddle.index_select(kp, rows), self.heads(kc, N, Tc)] + pad, axis=2)
                values = paddle.concat([paddle.index_select(vp, rows), self.heads(vc, N, Tc)] + pad, axis=2)
                attn = paddle.concat([attn, core(attend_c, qc.reshape([N, Tc, self.H, self.d]), keys, values,
                                                 bias_c)])
            return paddle.matmul(attn, wo)

        def layer(x, ln1, ln2, wqkv, bqkv, wo, wgu, wd, block, core):
            """One decoder layer on flat tokens [P*L + N*Tc, D]; `block`/`core` run the attention sub-block / the
            core attention, either directly or checkpointed."""
            x = x + block(attention, self.rms(x, ln1), wqkv, bqkv, wo, core)
            return self.mlp_block(x, {"ln2": ln2, "wgu": wgu, "wd": wd})

        x = tokens
        for i, lw in enumerate(self.layers):
            # Every tensor a gradient must reach is an argument of the checkpointed function (parallel/recompute.py).
            weights = [lw[key] for key in ("ln1", "ln2", "wqkv", "bqkv", "wo", "wgu", "wd")]
            mode = granularity if i not in skip else None
            full, part = _runner(mode == "full", reentrant), _runner(mode == "full_attn", reentrant)
            x = full(layer, x, *weights, part, _runner(mode == "core_attn", reentrant))
        last_prompt = paddle.index_select(x[:P * L].reshape([P, L, self.D])[:, L - 1], rows)  # [N, D]
        if Tc == 0:
            return last_prompt.unsqueeze(1)
        return paddle.concat([last_prompt.unsqueeze(1), x[P * L:].reshape([N, Tc, self.D])], axis=1)

    # ------------------------------------------------------------------------------------------- decoding

    def start_decoding(self, prompt_ids: paddle.Tensor, prompt_mask: paddle.Tensor, num_samples: int,
                       max_new_tokens: int) -> paddle.Tensor:
        """Prefill each prompt once, allocate the KV cache for its `num_samples` rows.

        prompt_ids/mask [P, L]. Returns the next-token logits [P * num_samples, V] (float32); rows of one prompt are
        consecutive. Call `decode(token)` for the following steps."""
        P, L = prompt_ids.shape
        G, S = num_samples, L + max_new_tokens
        N = P * G
        positions = paddle.clip(paddle.cumsum(prompt_mask.astype("int64"), axis=-1) - 1, min=0)
        pkeep = prompt_mask.astype("bool")
        bias_p = self.bias(pkeep[:, None, :] & paddle.tril(paddle.ones([L, L], dtype="bool"))[None], P, L, L)
        cos, sin = self.rope_tables(positions.reshape([-1]))
        x = paddle.index_select(self.embed, prompt_ids.reshape([-1]))
        self.cache = []
        zeros = paddle.zeros([N, self.KV, max_new_tokens, self.d], dtype="float32")
        for lw in self.layers:
            q, k, v = self.qkv(self.rms(x, lw["ln1"]), lw, cos, sin)
            k, v = self.heads(k, P, L), self.heads(v, P, L)
            attn = self.attend(q.reshape([P, L, self.H, self.d]), k, v, bias_p)
            x = self.mlp_block(x + paddle.matmul(attn, lw["wo"]), lw)
            self.cache.append([paddle.concat([paddle.repeat_interleave(t, G, axis=0), zeros], axis=2)
                               for t in (k, v)])
        # Decoding attends to all S slots; unfilled slots are masked (exp(finfo.min - max) == 0 exactly).
        keep = paddle.concat([paddle.repeat_interleave(prompt_mask.astype("int64"), G, axis=0),
                              paddle.zeros([N, max_new_tokens], dtype="int64")], axis=1).astype("bool")
        self.dec_bias = self.bias(keep[:, None, :], N, 1, S).clone()  # updated in place: own memory
        self.next_pos = paddle.repeat_interleave(positions[:, -1], G, axis=0) + 1  # [N]
        self.slot = L
        self.write = None  # [N] per-row next slot, from the first step with `keep` (None: every row at self.slot)
        last = x.reshape([P, L, self.D])[:, L - 1]
        return paddle.repeat_interleave(self.logits(last).astype("float32"), G, axis=0)

    def decode(self, token: paddle.Tensor, keep: Optional[paddle.Tensor] = None) -> paddle.Tensor:
        """token int64 [N] (the previous step's choice) -> next-token logits [N, V] float32.

        keep bool [N] (None: all): rows whose token is appended. A row's kept tokens fill consecutive slots right
        after its prompt whatever the other rows do, so its cache and logits are those of decoding it alone (up to
        the rounding of other GEMM shapes). A row not kept writes its next slot, which stays masked and is
        overwritten by its next kept token; its position does not advance and its logits mean nothing. Until the
        first `keep`, every row writes slot `self.slot` with slice assignments (the single-turn path, unchanged)."""
        if keep is None and self.write is None:
            return self._decode_aligned(token)
        N = token.shape[0]
        if self.write is None:
            self.write = paddle.full([N], self.slot, dtype="int64")
        keep = paddle.ones([N], dtype="bool") if keep is None else keep.astype("bool")
        # A row that filled all L + max_new_tokens slots is finished: the rollout never reads its logits again, so
        # it may scribble on its last slot instead of writing past the cache.
        w = paddle.minimum(self.write, paddle.full([1], self.dec_bias.shape[-1] - 1, dtype="int64"))
        idx = w.reshape([N, 1, 1, 1, 1]).expand([N, self.KV, self.g, 1, 1])
        shown = paddle.where(keep, paddle.zeros([1], "float32"), paddle.full([1], self.neg, "float32"))
        self.dec_bias.put_along_axis_(idx, shown.reshape([N, 1, 1, 1, 1]).expand([N, self.KV, self.g, 1, 1]),
                                      axis=4)
        slot = w.reshape([N, 1, 1, 1]).expand([N, self.KV, 1, self.d])
        cos, sin = self.rope_tables(self.next_pos)
        x = paddle.index_select(self.embed, token)
        for lw, (kc, vc) in zip(self.layers, self.cache):
            q, k, v = self.qkv(self.rms(x, lw["ln1"]), lw, cos, sin)
            kc.put_along_axis_(slot, k.unsqueeze(2), axis=2)  # in place: row i's [KV, d] into its slot w[i]
            vc.put_along_axis_(slot, v.unsqueeze(2), axis=2)
            attn = self.attend(q.reshape([N, 1, self.H, self.d]), kc, vc, self.dec_bias)
            x = self.decode_mlp(x + paddle.matmul(attn, lw["wo"]), lw)
        step = keep.astype("int64")
        self.write = self.write + step
        self.next_pos = self.next_pos + step
        return self.logits(x).astype("float32")

    def _decode_aligned(self, token: paddle.Tensor) -> paddle.Tensor:
        """`decode` while every row appends every step: all rows write slot `self.slot`."""
        N = token.shape[0]
        s = self.slot
        self.dec_bias[:, :, :, :, s] = 0.0  # the new token's own slot becomes visible to every row
        cos, sin = self.rope_tables(self.next_pos)
        x = paddle.index_select(self.embed, token)
        for lw, (kc, vc) in zip(self.layers, self.cache):
            q, k, v = self.qkv(self.rms(x, lw["ln1"]), lw, cos, sin)
            kc[:, :, s] = k  # in place: [N, KV, d] into slot s
            vc[:, :, s] = v
            attn = self.attend(q.reshape([N, 1, self.H, self.d]), kc, vc, self.dec_bias)
            x = self.decode_mlp(x + paddle.matmul(attn, lw["wo"]), lw)
        self.slot += 1
        self.next_pos = self.next_pos + 1
        return self.logits(x).astype("float32")


def _runner(recompute: bool, use_reentrant: bool) -> Callable[..., Any]:
    """`run(fn, *args)`: `fn(*args)`, checkpointed (parallel/recompute.py) when `recompute` and a tensor argument
    needs a gradient (as PaddleNLP: with no gradient recorded there is nothing to recompute for)."""
    def run(fn: Callable[..., Any], *args: Any) -> Any:
        if recompute and needs_grad(*args):
            return checkpoint(fn, *args, use_reentrant=use_reentrant)
        return fn(*args)
    return run


def unique_rows(ids: np.ndarray, mask: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """Map each row of (ids, mask) [N, L] to the first row with the same prompt.

    Returns (rows [N] index into the unique prompts, first [P] the row index of each unique prompt)."""
    seen, rows, first = {}, [], []
    for i in range(ids.shape[0]):
        key = ids[i].tobytes() + mask[i].tobytes()
        if key not in seen:
            seen[key] = len(first)
            first.append(i)
        rows.append(seen[key])
    return np.asarray(rows, dtype=np.int64), np.asarray(first, dtype=np.int64)
