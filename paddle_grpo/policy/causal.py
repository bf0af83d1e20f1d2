"""Decoder-only policies: `CausalPolicy`, loading, and per-token log-probs of completions.

Models are PaddleNLP causal LMs loaded with `AutoModelForCausalLM` from a local directory or a hub ID (hub.py).
Log-probs are computed from the decoder's hidden states at the completion positions only, so the `[bs, T, V]`
logits of the prompt positions are never materialised (with a 150k vocabulary they would dominate memory).
For a plain float32 Qwen2 or Llama model (no tensor parallelism, no LoRA layers: fast_decoder.refusal lists the
rest) `completion_logprobs` runs the lean forward of fast_decoder.py, which also computes each group's shared prompt
once; other models use PaddleNLP's forward. `PADDLE_GRPO_FAST=0` forces PaddleNLP's forward everywhere.
`decoder_path` is the start-up line that says which. Sampling (`generate`) is rollout/'s decode loop, run through
this module's steppers (`stepper_for`): the rollout knows no model, the policy hands it the model's side of the loop.
Under LoRA the log-probs run PaddleNLP's forward (its LoRA layers) and sampling the lean path, with the adapters
merged into weight copies once per rollout (fast_decoder.sampling_decoder).
"""
from __future__ import annotations

import functools
import os
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import paddle

from .. import cpu_tuning, rollout
from ..algorithms import logprobs_from_logits
from ..precision import full_precision
from ..rollout import Rollout, Stepper
from . import decode_engine, fast_decoder, rope
from .base import Policy, freeze, position_ids_from_mask
from .hub import resolve_model_dir
from .lm_head import LMHead, entropy, head_logprobs

if TYPE_CHECKING:
    from paddlenlp.transformers import PretrainedTokenizer

    from ..parallel import VocabParallel


def load_causal_lm(path: str, *, trainable: bool = True, recompute: bool = False, tensor_parallel_degree: int = 1,
                   tensor_parallel_rank: int = 0, dtype: str = "float32",
                   config_overrides: dict[str, Any] | None = None, recompute_granularity: str = "full",
                   recompute_use_reentrant: bool = True) -> paddle.nn.Layer:
    """`AutoModelForCausalLM` from a local directory or hub ID (hub.resolve_model_dir), in `dtype` (float32 unless
    the precision plan says otherwise); frozen (eval, no grads) unless `trainable`. `config_overrides`: model-config
    fields to set before the model is built (the plan's kernel flags: use_flash_attention, use_fused_rms_norm, ...).

    `recompute` (trainable models only: frozen ones run without gradients) checkpoints the decoder in backward with
    PaddleNLP's `recompute_granularity` ("full" layers, "full_attn" attention sub-blocks, "core_attn" the core
    attention) and `recompute_use_reentrant`, in PaddleNLP's forward and in the lean decoder path (fast_decoder.py).

    With `tensor_parallel_degree > 1` this rank's shard is loaded (PaddleNLP splits the full checkpoint); its
    forward then returns full-vocabulary logits (gathered), which generation needs, while `completion_logprobs`
    asks the LM head for the vocab-parallel shard and reduces it without gathering (distributed.VocabParallel)."""
    from paddlenlp.transformers import AutoModelForCausalLM

    path = resolve_model_dir(path)
    config = model_config(path, trainable=trainable, recompute=recompute,
                          tensor_parallel_degree=tensor_parallel_degree, tensor_parallel_rank=tensor_parallel_rank,
                          config_overrides=config_overrides, recompute_granularity=recompute_granularity,
                          recompute_use_reentrant=recompute_use_reentrant)
    model = AutoModelForCausalLM.from_pretrained(path, config=config, dtype=dtype)
    return prepare_loaded(model, trainable)


def model_config(path: str, *, trainable: bool = True, recompute: bool = False, tensor_parallel_degree: int = 1,
                 tensor_parallel_rank: int = 0, config_overrides: dict[str, Any] | None = None,
                 recompute_granularity: str = "full", recompute_use_reentrant: bool = True) -> Any:
    """The PaddleNLP config of the model in the local directory `path`, set up as `load_causal_lm` describes
    (recompute of a trainable model, this rank's tensor-parallel shard, `config_overrides`); shared with the critic
    (critic.py), whose backbone loads the same way."""
    from paddlenlp.transformers import AutoConfig

    cpu_tuning.apply()  # CPU runs only: MKL's AVX2 or AVX-512 path on AMD, no page fault per tensor; before any forward
    # rope_theta / rope_scaling as transformers 4 or 5 wrote them (PaddleNLP reads only the top-level rope_theta):
    # set before the model is built; a type not computed here is refused naming the key (rope.py)
    config = rope.normalize(AutoConfig.from_pretrained(path), os.path.join(path, "config.json"))
    config.recompute = bool(recompute and trainable)
    if config.recompute:
        if recompute_granularity not in fast_decoder.GRANULARITIES:
            raise ValueError(f"recompute_granularity must be one of {fast_decoder.GRANULARITIES}, "
                             f"got {recompute_granularity!r}")
        config.recompute_granularity = recompute_granularity
        config.recompute_use_reentrant = bool(recompute_use_reentrant)
    if tensor_parallel_degree > 1:
        config.tensor_parallel_degree = tensor_parallel_degree
        config.tensor_parallel_rank = tensor_parallel_rank
        config.tensor_parallel_output = False
    for key, value in (config_overrides or {}).items():
        setattr(config, key, value)
    return config


def prepare_loaded(model: paddle.nn.Layer, trainable: bool) -> paddle.nn.Layer:
    """A model just loaded with `model_config`'s config: rope scaling's tables installed (rope.install), recompute
    switched on when the config asks for it, then train mode, or frozen (eval, no gradients) unless `trainable`.
    Returns `model`."""
    rope.install(model)  # transformers' scaled rotary tables when the config asks for scaling (rope.py)
    if model.config.recompute:
        # The config field alone is inert: PaddleNLP's layers recompute only once `enable_recompute` is set, which
        # its Trainer does for `--recompute` (this is the model's own method for it).
        model.recompute_enable()
    if trainable:
        model.train()
    else:
        freeze(model)
    return model


def completion_hidden(model: paddle.nn.Layer, prompt_ids: paddle.Tensor, prompt_mask: paddle.Tensor,
                      completion_ids: paddle.Tensor, completion_mask: paddle.Tensor, *,
                      fast: bool = True) -> tuple[paddle.Tensor, paddle.nn.Layer | LMHead]:
    """`(hidden [bs, T, H], head)`: the final hidden states that predict each completion token (the token at
    position L + t is predicted from the state at L + t - 1) and the LM head that turns them into logits (the
    model's head layer, or an `LMHead` on the lean path). Inputs as `completion_logprobs`; `fast`: the lean decoder
    forward of fast_decoder.py where it applies (Qwen2, Llama), else PaddleNLP's."""
    rope.check(model)  # a config with rope scaling over plain rotary tables: other logits, never silently
    if fast and fast_decoder.enabled_for(model):
        # Lean decoder forward (Qwen2, Llama) with each group's shared prompt computed once (fast_decoder.py).
        lean = fast_decoder.FastDecoder(model)
        hidden = lean.final_hidden(lean.prompt_completion_hidden(prompt_ids, prompt_mask, completion_ids,
                                                                 completion_mask))
        return hidden, LMHead(lean.head, lean.head_t)
    input_ids = paddle.concat([prompt_ids, completion_ids], axis=1)
    attention_mask = paddle.concat([prompt_mask, completion_mask], axis=1).astype("int64")
    position_ids = position_ids_from_mask(attention_mask)
    L = prompt_ids.shape[1]
    decoder = model.get_decoder()
    hidden = decoder(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                     use_cache=False, return_dict=True).last_hidden_state
    return hidden[:, L - 1:-1], model.get_output_embeddings()


def completion_logprobs(model: paddle.nn.Layer, prompt_ids: paddle.Tensor, prompt_mask: paddle.Tensor,
                        completion_ids: paddle.Tensor, completion_mask: paddle.Tensor, *, temperature: float = 1.0,
                        with_entropy: bool | str = False, vocab_parallel: VocabParallel | None = None,
                        chunk_size: int | None = None) -> tuple[paddle.Tensor, paddle.Tensor | None]:
    """Log-probs (and optionally entropies) of the completion tokens under `model`.

    prompt_ids/prompt_mask: [bs, L] left-padded; completion_ids/completion_mask: [bs, T].
    Returns `(logprobs [bs, T], entropy [bs, T] or None)`, float32, with logits divided by `temperature` (the
    distribution the rollout sampled from). Positions where completion_mask is 0 hold meaningless values.
    `with_entropy`: False, True, or "detached" (the entropy is only logged: no gradient graph is built for it).
    `vocab_parallel` (distributed.VocabParallel) computes both from this rank's vocabulary shard under tensor
    parallelism. `chunk_size` (Policy.head_chunk_size; use_fused_head_and_loss_fn): the LM head runs `chunk_size`
    positions at a time and never holds the [bs, T, V] logits (lm_head.py); None: full logits.
    """
    hidden, head = completion_hidden(model, prompt_ids, prompt_mask, completion_ids, completion_mask,
                                     fast=vocab_parallel is None)
    if vocab_parallel is not None and not head_is_vocab_sharded(head, model.config.vocab_size):
        # PaddleNLP splits the LM head only when tensor_parallel_degree divides vocab_size (not Qwen's 151,936 over
        # 3 ranks): every rank then holds the whole head, and reducing it as a shard would be wrong by log(tp).
        vocab_parallel = None
    if vocab_parallel is not None:
        if chunk_size is not None:  # this rank's weight shard, chunk by chunk (parallel/vocab.py)
            with full_precision():
                logprobs, ent = vocab_parallel.chunked_logprobs_and_entropy(
                    hidden, head.weight, completion_ids, temperature=temperature,
                    chunk_size=chunk_size, with_entropy=with_entropy, transpose_y=head.transpose_y)
            return logprobs, ent
        logits = head(hidden, tensor_parallel_output=True)
        with full_precision():
            logprobs = vocab_parallel.logprobs(logits, completion_ids, temperature)
            return logprobs, (vocab_parallel.entropy(logits, temperature) if with_entropy else None)
    return head_logprobs(hidden, head, completion_ids, temperature=temperature,
                         with_entropy=with_entropy, chunk_size=chunk_size)


def completion_logits(model: paddle.nn.Layer, prompt_ids: paddle.Tensor, prompt_mask: paddle.Tensor,
                      completion_ids: paddle.Tensor, completion_mask: paddle.Tensor) -> paddle.Tensor:
    """The full logits [bs, T, V] (the head's dtype, with their autograd graph) that predict the completion tokens:
    what a loss over the whole vocabulary at each position needs (on-policy distillation's exact reverse KL).
    Inputs as `completion_logprobs`. The head runs unchunked and unsharded: [bs, T, V] is held (8 x 210 x 49,152
    float32 is 330 MB), so callers pass a micro-batch; not under tensor parallelism."""
    hidden, head = completion_hidden(model, prompt_ids, prompt_mask, completion_ids, completion_mask)
    return head(hidden)


# ------------------------------------------------------------------------------------------------ sampling


def generate(model: paddle.nn.Layer, prompt_ids: paddle.Tensor | np.ndarray, prompt_mask: paddle.Tensor | np.ndarray,
             **kwargs: Any) -> Rollout:
    """G completions per prompt from a decoder-only `model`: `rollout.generate` (same arguments, same `Rollout`)
    with the model's stepper (`stepper_for`) unless `stepper` is given. prompt_ids/prompt_mask [P, L] left-padded."""
    kwargs.setdefault("stepper", stepper_for(model))
    return rollout.generate(model, prompt_ids, prompt_mask, **kwargs)


def decoder_path(model: paddle.nn.Layer, precision: str | None = None) -> str:
    """The start-up line naming the path `completion_logprobs` and `stepper_for` take for `model`:
    "decoder: fast path (llama)" or "decoder: PaddleNLP's forward (<why the fast path refuses it>)". With the
    rollout's `precision` (rollout_precision), checked here to be one this model can sample in, and on CPU a second
    line: the decode engine's products (decode_engine.describe)."""
    line = fast_decoder.describe(model)
    if precision is None:
        return line
    precision = cpu_rollout_precision(paddle.get_device(), precision)
    _check_precision(model, precision)
    if fast_decoder.sampling_refusal(model) is None and paddle.get_device() == "cpu":
        line += f"\n{decode_engine.describe(precision)}"
    return line


def stepper_for(model: paddle.nn.Layer, precision: str = "float32") -> Callable[[paddle.nn.Layer], Stepper]:
    """The decode stepper of `model` (rollout.Stepper; called with the model): the lean decoder path when it computes
    what the model's forward would up to float32 rounding (`fast_decoder.sampling_refusal`: also a LoRAModel, its
    adapters merged), else the model's own decoder. `precision` (rollout_precision) other than float32 needs the
    lean path (its CPU decode engine)."""
    rope.check(model)
    _check_precision(model, precision)
    if fast_decoder.sampling_refusal(model) is not None:
        return PaddleNLPStepper
    return FastDecoderStepper if precision == "float32" else functools.partial(FastDecoderStepper,
                                                                               precision=precision)


def cpu_rollout_precision(device: str, precision: str) -> str:
    """The decode engine's precision for rollout_precision `precision` on `device` (paddle.get_device()): as given
    on a CPU; float32 elsewhere, where the key has no effect (a GPU rollout runs in the AMP precision of bf16 /
    fp16; the config's effect table says so)."""
    return precision if device == "cpu" else "float32"


def _check_precision(model: paddle.nn.Layer, precision: str) -> None:
    why = fast_decoder.sampling_refusal(model) if precision != "float32" else None
    if why is not None:
        raise ValueError(f"rollout_precision {precision} needs the lean decoder path and its CPU decode engine, "
                         f"which do not run this model: {why}")


class PaddleNLPStepper:
    """A `rollout.Stepper`: decoding through the model's own decoder and LM head (any PaddleNLP causal LM, as
    completion_logprobs runs them): `past_key_values` grown by concat. The head runs on the last position only: at
    prefill the model's forward would make [P, L, V] logits (GBs at a 152k vocabulary) to keep one row of each
    prompt."""

    def __init__(self, model: paddle.nn.Layer):
        self.model = model
        self.decoder, self.head = model.get_decoder(), model.get_output_embeddings()

    def _next_logits(self, input_ids, attention_mask, position_ids, past_key_values=None):
        """The decoder over `input_ids` [N, S] (self.cache updated), then the head on position S - 1: [N, V] float32
        (full vocabulary: under tensor parallelism the head gathers, as the model's forward does)."""
        out = self.decoder(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                           past_key_values=past_key_values, use_cache=True, return_dict=True)
        self.cache = out.past_key_values
        return self.head(out.last_hidden_state[:, -1:, :])[:, -1, :].astype("float32")

    def start(self, prompt_ids: paddle.Tensor, prompt_mask: paddle.Tensor, G: int,
              max_new_tokens: int) -> paddle.Tensor:
        """Prefill [P, L] once; returns the next-token logits [P * G, V] float32, each prompt's rows consecutive."""
        position_ids = position_ids_from_mask(prompt_mask)
        logits = self._next_logits(prompt_ids, prompt_mask, position_ids)
        # Share each prompt's prefill among its G samples.
        self.cache = _expand_cache(self.cache, G)
        self.attention_mask = paddle.repeat_interleave(prompt_mask, G, axis=0)
        self.next_pos = paddle.repeat_interleave(position_ids[:, -1:], G, axis=0) + 1
        return paddle.repeat_interleave(logits, G, axis=0)

    def step(self, token: paddle.Tensor, keep: paddle.Tensor | None = None) -> paddle.Tensor:
        """token [N] -> next-token logits [N, V] float32. keep bool [N] (None: all): rows whose token is appended.

        Every step appends one cache column for all rows; a row not kept gets attention mask 0 there (a hole) and
        keeps its position. Its later tokens therefore see the same keys and positions as when decoded alone but
        in a longer, holed layout that depends on the other rows' timing: equal up to float32 rounding, not bit
        for bit (the lean stepper keeps each row's tokens consecutive)."""
        N = token.shape[0]
        column = paddle.ones([N, 1], dtype="int64") if keep is None else keep.astype("int64").reshape([N, 1])
        self.attention_mask = paddle.concat([self.attention_mask, column], axis=1)
        logits = self._next_logits(token.unsqueeze(-1), self.attention_mask, self.next_pos, self.cache)
        self.next_pos = self.next_pos + column
        return logits


class FastDecoderStepper:
    """A `rollout.Stepper`: decoding through fast_decoder (preallocated KV cache, lean ops), for the models
    `fast_decoder.sampling_refusal` accepts. Built per rollout (rollout.generate calls `stepper(model)`), so a
    LoRAModel's merged weights (fast_decoder.sampling_decoder) are those of its adapters' current values."""

    def __init__(self, model: paddle.nn.Layer, precision: str = "float32"):
        self.fast = fast_decoder.sampling_decoder(model)
        self.precision = precision
        self.engine: decode_engine.DecodeEngine | None = None

    def start(self, prompt_ids: paddle.Tensor, prompt_mask: paddle.Tensor, G: int,
              max_new_tokens: int) -> paddle.Tensor:
        """Prefill [P, L]; the next-token logits [P * G, V] float32: decode_engine.py's where it accepts the model
        (CPU, no gradients), else fast_decoder.FastDecoder.start_decoding's; the steps then run in the same one."""
        if decode_engine.refusal(self.fast) is None:
            if self.engine is None:  # packed once per stepper: the weights do not change within a rollout
                self.engine = decode_engine.DecodeEngine(self.fast, self.precision)
            return paddle.to_tensor(self.engine.prefill(np.asarray(prompt_ids), np.asarray(prompt_mask), G,
                                                        max_new_tokens))
        if self.precision != "float32":
            raise ValueError(f"a {self.precision} rollout needs the CPU decode engine, which does not run here: "
                             f"{decode_engine.refusal(self.fast)}")
        return self.fast.start_decoding(prompt_ids, prompt_mask, G, max_new_tokens)

    def step(self, token: paddle.Tensor, keep: paddle.Tensor | None = None) -> paddle.Tensor:
        """token [N] -> next-token logits [N, V] float32; keep bool [N] (None: all): `FastDecoder.decode`."""
        if self.engine is not None and self.engine.attached:
            return self.engine.step(token, keep)
        return self.fast.decode(token, keep)

    @property
    def drops_rows(self) -> bool:
        """Whether `keep_rows` works: decoding runs in the engine (rollout.decode drops finished rows then)."""
        return self.engine is not None and self.engine.attached

    def keep_rows(self, rows: np.ndarray) -> None:
        """Go on decoding the rows `rows` (indices into the current rows) only: DecodeEngine.keep_rows."""
        self.engine.keep_rows(rows)


def _expand_cache(past_key_values, G):
    if G == 1:
        return past_key_values
    return tuple(tuple(paddle.repeat_interleave(t, G, axis=0) for t in layer) for layer in past_key_values)


def head_is_vocab_sharded(head: paddle.nn.Layer, vocab_size: int) -> bool:
    """Whether the LM head `head` holds a slice of the `vocab_size` outputs (tensor parallelism split it) rather
    than all of them. Its weight is `[H, V]`, or `[V, H]` with `transpose_y` (tied embeddings)."""
    weight = head.weight
    outputs = weight.shape[0] if getattr(head, "transpose_y", False) else weight.shape[1]
    return outputs < vocab_size


def logprobs_from_completion_logits(logits: paddle.Tensor, completion_ids: paddle.Tensor, temperature: float = 1.0,
                                    with_entropy: bool | str = True) -> tuple[paddle.Tensor, paddle.Tensor]:
    """Log-probs (differentiable) and entropies ([bs, T] float32) from the logits [bs, T, V] that predict
    `completion_ids` [bs, T]: the pipeline model's last stage, whose LM head sees every position. `with_entropy`:
    True (differentiable) or "detached" (logged only: no gradient graph)."""
    logits = logits.astype("float32")
    with full_precision():
        return (logprobs_from_logits(logits, completion_ids, temperature=temperature),
                entropy(logits, temperature, with_entropy))


class CausalPolicy(Policy):
    """A decoder-only LM: the prompt is the decoder's prefix, completions continue it (`generate`)."""

    is_encoder_decoder = False
    load_model = staticmethod(load_causal_lm)

    def prompt_token_ids(self, tokenizer: PretrainedTokenizer, ids: list[int]) -> list[int]:
        """The prompt's own tokens, unchanged (the chat template already framed them)."""
        return ids

    def generate(self, prompt_ids: paddle.Tensor | np.ndarray, prompt_mask: paddle.Tensor | np.ndarray,
                 **kwargs: Any) -> Rollout:
        """`generate(self.model, prompt_ids, prompt_mask, **kwargs)`: rollout/'s decode loop with this model's
        stepper, stopping also at the model's own end ids (Policy.with_end_ids). `rollout_precision` (the config
        key) applies on CPU only (`cpu_rollout_precision`)."""
        precision = cpu_rollout_precision(paddle.get_device(), kwargs.pop("rollout_precision", "float32"))
        if precision != "float32":
            kwargs.setdefault("stepper", stepper_for(self.model, precision))
        return generate(self.model, prompt_ids, prompt_mask, **self.with_end_ids(kwargs))

    def logprobs(self, prompt_ids: paddle.Tensor, prompt_mask: paddle.Tensor, completion_ids: paddle.Tensor,
                 completion_mask: paddle.Tensor, *, temperature: float = 1.0, with_entropy: bool | str = False,
                 vocab_parallel: VocabParallel | None = None) -> tuple[paddle.Tensor, paddle.Tensor | None]:
        """`completion_logprobs(self.model, ...)`: prompts [n, L] left-padded, completions [n, T]; the LM head
        chunked by `self.head_chunk_size`."""
        return completion_logprobs(self.model, prompt_ids, prompt_mask, completion_ids, completion_mask,
                                   temperature=temperature, with_entropy=with_entropy, vocab_parallel=vocab_parallel,
                                   chunk_size=self.head_chunk_size)

    def completion_logits(self, prompt_ids: paddle.Tensor, prompt_mask: paddle.Tensor, completion_ids: paddle.Tensor,
                          completion_mask: paddle.Tensor) -> paddle.Tensor:
        """`completion_logits(self.model, ...)`: the full logits [n, T, V] at the completion positions (not chunked,
        not vocab-parallel), differentiable unless called under no_grad."""
        return completion_logits(self.model, prompt_ids, prompt_mask, completion_ids, completion_mask)
