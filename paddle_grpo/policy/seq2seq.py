"""Encoder-decoder policies (T5 / BART family): `Seq2SeqPolicy`, loading, sampling G completions per prompt,
per-token log-probs.

`generate` and `completion_logprobs` have the signatures and contracts of `rollout.generate` and
`causal.completion_logprobs`; `Seq2SeqPolicy` offers them through the `Policy` interface (base.py), so the trainer
never asks which kind of model it has. Here the prompt is the encoder input (the document) and the completion is
what the decoder produces after the model's `decoder_start_token_id`; everything downstream (rewards, advantages,
losses) is unchanged.

- Encoder inputs may be padded on either side: rows are packed to the left (real tokens first) before the encoder,
  which is exact for both families (the encoder is bidirectional and attends to real tokens only, and BART's learned
  absolute positions then start at 0 as in pre-training). The trainer collates left-padded.
- The encoder runs once per prompt: `generate` encodes the B prompts and shares each one's encoder output and first
  decoder step among its G samples; `completion_logprobs` encodes each run of identical consecutive prompt rows once.
- Sampling follows rollout/ exactly (temperature -> repetition penalty -> EOS blocked until `min_new_tokens` ->
  top-p -> multinomial or counter-based uniforms), except that the repetition penalty counts only the tokens the
  decoder generated, not the source document (as HF does for encoder-decoders: a summary should copy from it).
- Dropout is switched off when loading (as for the decoder-only policies, whose configs have none): with dropout the
  on-policy ratio exp(l - l.detach()) and the rollout's log-probs would not describe the same policy.
Not supported: tensor parallelism (`vocab_parallel`), PaddleNLP's fused/fast generation.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import numpy as np
import paddle

from .. import rollout
from ..algorithms import logprobs_from_logits
from ..precision import full_precision
from .base import Policy, freeze, is_encoder_decoder  # noqa: F401 (is_encoder_decoder: API)
from .hub import resolve_model_dir
from .lm_head import LMHead, entropy, head_logprobs

if TYPE_CHECKING:
    from paddlenlp.transformers import PretrainedTokenizer

    from ..parallel import VocabParallel

logger = logging.getLogger("paddle_grpo.seq2seq")

# Config attributes holding dropout probabilities in the T5 and BART families.
_DROPOUT_KEYS = ("dropout_rate", "dropout", "attention_dropout", "activation_dropout")


def load_seq2seq_lm(path: str, *, trainable: bool = True, recompute: bool = False, tensor_parallel_degree: int = 1,
                    tensor_parallel_rank: int = 0, dtype: str = "float32",
                    config_overrides: dict[str, Any] | None = None, recompute_granularity: str = "full",
                    recompute_use_reentrant: bool = True) -> paddle.nn.Layer:
    """`AutoModelForConditionalGeneration` from a local directory or hub ID, in `dtype` (float32 by default),
    dropout off; frozen unless `trainable`. `config_overrides`: model-config fields to set (as
    `causal.load_causal_lm`).

    Same keyword arguments as `causal.load_causal_lm` (recompute and its settings are ignored); tensor parallelism is not supported for encoder-decoders.
    """
    from paddlenlp.transformers import AutoConfig, AutoModelForConditionalGeneration

    if tensor_parallel_degree > 1:
        raise NotImplementedError("tensor_parallel_degree > 1 is not supported for encoder-decoder policies")
    path = resolve_model_dir(path)
    config = AutoConfig.from_pretrained(path)
    if not getattr(config, "is_encoder_decoder", False):
        raise ValueError(f"{path}: config.is_encoder_decoder is false; load it with causal.load_causal_lm")
    for key in _DROPOUT_KEYS:
        if hasattr(config, key):
            setattr(config, key, 0.0)
    for key, value in (config_overrides or {}).items():
        setattr(config, key, value)
    model = AutoModelForConditionalGeneration.from_pretrained(path, config=config, dtype=dtype)
    if recompute and trainable:
        # PaddleNLP 3.0.0b4's T5 recompute (model.recompute_enable) changes the encoder's gradients (max abs
        # difference 0.03 on a tiny T5, measured); BART has no recompute at all.
        logger.warning("recompute is ignored for encoder-decoder policies")
    if trainable:
        model.train()
    else:
        freeze(model)
    return model


def decoder_start_id(model: paddle.nn.Layer) -> int:
    """The token the decoder starts from: config.decoder_start_token_id, else pad (T5's convention)."""
    config = model.config
    start = getattr(config, "decoder_start_token_id", None)
    start = getattr(config, "pad_token_id", None) if start is None else start
    if start is None:
        raise ValueError("the model config has neither decoder_start_token_id nor pad_token_id")
    return int(start)


def encoder_input_ids(tokenizer: PretrainedTokenizer, ids: list[int]) -> list[int]:
    """A prompt's token ids as the encoder input: wrapped in the tokenizer's own special tokens, as in pre-training
    (T5: `ids </s>`, BART: `<s> ids </s>`); tokenizers that add none (Qwen2's) leave them unchanged."""
    return [int(i) for i in tokenizer.build_inputs_with_special_tokens(list(ids), None)]


def pack_left(ids: paddle.Tensor, mask: paddle.Tensor) -> tuple[paddle.Tensor, paddle.Tensor]:
    """Move each row's real tokens (mask 1) to the front, keeping their order. [bs, L] -> [bs, L] each."""
    order = paddle.argsort(1 - mask.astype("int64"), axis=-1, stable=True)
    return paddle.take_along_axis(ids, order, axis=-1), paddle.take_along_axis(mask, order, axis=-1)


def encode(model: paddle.nn.Layer, prompt_ids: paddle.Tensor, prompt_mask: paddle.Tensor
           ) -> tuple[paddle.Tensor, paddle.Tensor]:
    """Encoder output for prompts padded on either side: (hidden [bs, L, D], packed mask [bs, L] int64)."""
    ids, mask = pack_left(prompt_ids.astype("int64"), prompt_mask.astype("int64"))
    out = model.get_encoder()(input_ids=ids, attention_mask=mask, return_dict=True)
    return out.last_hidden_state, mask


def decoder_logits(model: paddle.nn.Layer, encoder_hidden: paddle.Tensor, encoder_mask: paddle.Tensor,
                   decoder_input_ids: paddle.Tensor, cache: Any = None, use_cache: bool = False
                   ) -> tuple[paddle.Tensor, Any]:
    """One decoder pass: (logits [bs, t, V] float32, cache or None). With a cache, decoder_input_ids is only the
    new token; `use_cache` with no cache starts one (PaddleNLP's BART builds it from the encoder output)."""
    out = model(input_ids=None, attention_mask=encoder_mask, decoder_input_ids=decoder_input_ids,
                encoder_output=(encoder_hidden,), cache=cache, use_cache=use_cache, return_dict=True)
    return out.logits.astype("float32"), out.past_key_values


def completion_logprobs(model: paddle.nn.Layer, prompt_ids: paddle.Tensor, prompt_mask: paddle.Tensor,
                        completion_ids: paddle.Tensor, completion_mask: paddle.Tensor, *, temperature: float = 1.0,
                        with_entropy: bool | str = False, vocab_parallel: VocabParallel | None = None,
                        chunk_size: int | None = None) -> tuple[paddle.Tensor, paddle.Tensor | None]:
    """Log-probs (and optionally entropies) of the completion tokens under an encoder-decoder `model`.

    prompt_ids/prompt_mask: [bs, L] encoder inputs (either padding side); completion_ids/completion_mask: [bs, T],
    right-padded. The decoder is teacher-forced on [start] + completion[:, :-1] (causal, so the padding after EOS
    cannot affect earlier positions). Returns `(logprobs [bs, T], entropy [bs, T] or None)`, float32, of
    logits / temperature. Positions where completion_mask is 0 hold meaningless values. `with_entropy` and
    `chunk_size` (the chunked LM head) as in `causal.completion_logprobs`.
    """
    if vocab_parallel is not None:
        raise NotImplementedError("vocab-parallel log-probs are not supported for encoder-decoder policies")
    completion_ids = completion_ids.astype("int64")
    first, inverse = _runs_of_equal_rows(prompt_ids, prompt_mask)
    hidden, mask = encode(model, paddle.gather(prompt_ids, first), paddle.gather(prompt_mask, first))
    if len(first) < prompt_ids.shape[0]:  # share each prompt's encoding among its G rows (gradients add up)
        hidden, mask = paddle.gather(hidden, inverse), paddle.gather(mask, inverse)
    start = paddle.full([completion_ids.shape[0], 1], decoder_start_id(model), dtype="int64")
    decoder_input_ids = paddle.concat([start, completion_ids[:, :-1]], axis=1)
    parts = decoder_hidden(model, hidden, mask, decoder_input_ids)
    if parts is None:  # a family decoder_hidden does not know: the model's own forward, full logits
        if chunk_size is not None:
            logger.warning("use_fused_head_and_loss_fn: full logits for %s (its LM head is not known here)",
                           type(model).__name__)
        logits, _ = decoder_logits(model, hidden, mask, decoder_input_ids)
        with full_precision():  # float32 log-softmax under the update's AMP
            return (logprobs_from_logits(logits, completion_ids, temperature=temperature),
                    entropy(logits, temperature, with_entropy))
    sequence_output, head = parts
    return head_logprobs(sequence_output, head, completion_ids, temperature=temperature, with_entropy=with_entropy,
                         chunk_size=chunk_size)


def decoder_hidden(model: paddle.nn.Layer, encoder_hidden: paddle.Tensor, encoder_mask: paddle.Tensor,
                   decoder_input_ids: paddle.Tensor) -> tuple[paddle.Tensor, paddle.nn.Layer | LMHead] | None:
    """A teacher-forced decoder pass without the LM head: `(hidden [bs, t, D], head)` such that `head(hidden)` is
    exactly the logits of the model's forward (`decoder_logits`), so lm_head.head_logprobs can chunk the head.
    T5 and BART, as PaddleNLP 3.0.0b4's forward computes them; None for other families.

    T5: the decoder's output; with tied embeddings scaled by d_model ** -0.5 (as T5's forward does) and the head is
    the shared embedding `[V, D]` transposed, else `lm_head` (nn.Linear). BART: the decoder's output, head
    `lm_head_weight` `[V, D]` transposed plus the `final_logits_bias` buffer."""
    from paddlenlp.transformers import BartForConditionalGeneration, T5ForConditionalGeneration

    if type(model) is T5ForConditionalGeneration:
        # T5's forward with encoder_output given: a 2-D encoder mask becomes [bs, 1, 1, L].
        out = model.t5.decoder(input_ids=decoder_input_ids, encoder_hidden_states=encoder_hidden,
                               encoder_attention_mask=encoder_mask.unsqueeze([1, 2]), use_cache=False,
                               return_dict=True)
        sequence_output = out[0]
        if model.t5.config["tie_word_embeddings"]:
            sequence_output = sequence_output * (model.t5.config["d_model"] ** -0.5)
            return sequence_output, LMHead(model.t5.shared.weight, transpose_y=True)
        return sequence_output, model.lm_head
    if type(model) is BartForConditionalGeneration:
        out = model.bart(None, encoder_mask, decoder_input_ids, None, (encoder_hidden,), use_cache=False,
                         return_dict=True)
        return out[0], LMHead(model.lm_head_weight, transpose_y=True, bias=model.final_logits_bias)
    return None


def _runs_of_equal_rows(ids, mask):
    """Indices of the first row of each run of identical consecutive (ids, mask) rows, and each row's run. int64."""
    a = np.concatenate([np.asarray(ids.numpy()), np.asarray(mask.numpy())], axis=1)
    new_run = np.ones(len(a), dtype=bool)
    new_run[1:] = (a[1:] != a[:-1]).any(axis=1)
    first = np.flatnonzero(new_run)
    return paddle.to_tensor(first, dtype="int64"), paddle.to_tensor(np.cumsum(new_run) - 1, dtype="int64")


def generate(model: paddle.nn.Layer, prompt_ids: paddle.Tensor | np.ndarray, prompt_mask: paddle.Tensor | np.ndarray,
             **kwargs: Any) -> rollout.Rollout:
    """Sample decoder outputs for encoder inputs: `rollout.generate` (same arguments, same `Rollout`) with the
    encoder-decoder stepper; prompts may be padded on either side, and the source document does not count for the
    repetition penalty (a summary should copy from it). Multi-turn rollouts with tools are refused: the tool turns
    would have to go into the encoder's document or the decoder's output, which this policy does not model."""
    if kwargs.get("tools") is not None:
        raise ValueError("the `tools` key (multi-turn rollouts with tools) needs a decoder-only policy; "
                         f"{type(model).__name__} is an encoder-decoder: leave `tools` empty")
    return rollout.generate(model, prompt_ids, prompt_mask, stepper=Seq2SeqStepper, penalize_prompt=False, **kwargs)


class Seq2SeqPolicy(Policy):
    """An encoder-decoder LM: the prompt is the encoder input, completions are the decoder's output."""

    is_encoder_decoder = True
    load_model = staticmethod(load_seq2seq_lm)

    def prompt_token_ids(self, tokenizer: PretrainedTokenizer, ids: list[int]) -> list[int]:
        """`encoder_input_ids`: the prompt wrapped in the tokenizer's special tokens, as in pre-training."""
        return encoder_input_ids(tokenizer, ids)

    def generate(self, prompt_ids: paddle.Tensor | np.ndarray, prompt_mask: paddle.Tensor | np.ndarray,
                 **kwargs: Any) -> rollout.Rollout:
        """`generate(self.model, prompt_ids, prompt_mask, **kwargs)` (this module's, keyword arguments of
        rollout.generate), stopping also at the model's own end ids (Policy.with_end_ids). rollout_precision: float32
        only (the reduced-precision decode engine runs decoder-only Qwen2 / Llama models)."""
        precision = kwargs.pop("rollout_precision", "float32")
        if precision != "float32":
            raise ValueError(f"rollout_precision {precision}: encoder-decoder policies sample in float32 only")
        return generate(self.model, prompt_ids, prompt_mask, **self.with_end_ids(kwargs))

    def logprobs(self, prompt_ids: paddle.Tensor, prompt_mask: paddle.Tensor, completion_ids: paddle.Tensor,
                 completion_mask: paddle.Tensor, *, temperature: float = 1.0, with_entropy: bool | str = False,
                 vocab_parallel: VocabParallel | None = None) -> tuple[paddle.Tensor, paddle.Tensor | None]:
        """`completion_logprobs(self.model, ...)` of this module: encoder inputs [n, L], completions [n, T]; the LM
        head chunked by `self.head_chunk_size`."""
        return completion_logprobs(self.model, prompt_ids, prompt_mask, completion_ids, completion_mask,
                                   temperature=temperature, with_entropy=with_entropy, vocab_parallel=vocab_parallel,
                                   chunk_size=self.head_chunk_size)


class Seq2SeqStepper:
    """Incremental decoding with a KV cache; the interface of rollout/single_turn.py's steppers (start, step)."""

    def __init__(self, model: paddle.nn.Layer):
        self.model = model

    def start(self, prompt_ids: paddle.Tensor, prompt_mask: paddle.Tensor, G: int,
              max_new_tokens: int | None = None) -> paddle.Tensor:
        """Encode [P, L] once and run the first decoder step on P rows; returns logits [P * G, V] float32."""
        hidden, mask = encode(self.model, prompt_ids, prompt_mask)
        start = paddle.full([hidden.shape[0], 1], decoder_start_id(self.model), dtype="int64")
        logits, cache = decoder_logits(self.model, hidden, mask, start, use_cache=True)
        self.hidden, self.mask = _repeat(hidden, G), _repeat(mask, G)
        self.cache = _repeat(cache, G)
        return _repeat(logits[:, -1], G)

    def step(self, token: paddle.Tensor, keep: paddle.Tensor | None = None) -> paddle.Tensor:
        """token [N] -> next-token logits [N, V] float32. Every row appends its token: `keep` (multi-turn rollouts
        only) is refused."""
        if keep is not None:
            raise ValueError("the encoder-decoder stepper appends every row's token; per-row `keep` comes from the "
                             "`tools` key (multi-turn rollouts), which needs a decoder-only policy")
        logits, self.cache = decoder_logits(self.model, self.hidden, self.mask, token.unsqueeze(-1), self.cache,
                                           use_cache=True)
        return logits[:, -1]


def _repeat(x, G):
    """repeat_interleave by G along the batch axis, through nested tuples/lists/namedtuples (decoder caches)."""
    if G == 1 or x is None:
        return x
    if isinstance(x, paddle.Tensor):
        return paddle.repeat_interleave(x, G, axis=0)
    items = [_repeat(v, G) for v in x]
    return type(x)(*items) if hasattr(x, "_fields") else type(x)(items)
