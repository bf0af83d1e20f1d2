"""The `Policy` interface, and the model helpers that causal and encoder-decoder policies share.

A `Policy` holds one PaddleNLP model (`.model`) and answers everything the trainer asks of a model: the prompt
tokens it expects, G sampled completions per prompt (`generate`), per-token log-probs of completions (`logprobs`),
LoRA adapters and the base model behind them, and `save`. `CausalPolicy` (causal.py) and `Seq2SeqPolicy`
(seq2seq.py) differ only in how a prompt reaches the model (decoder prefix vs encoder input); `load_policy`
(load.py) picks the class from the model's config. What the trainer does with the numbers is not in here.
"""
from __future__ import annotations

import contextlib
import os
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
import paddle

from . import lora
from .hub import resolve_model_dir

if TYPE_CHECKING:
    from paddlenlp.transformers import PretrainedConfig, PretrainedTokenizer

    from ..parallel import VocabParallel
    from ..rollout import Rollout


class Policy:
    """One model behind the trainer's questions. Subclasses set `is_encoder_decoder` and `load_model` (the
    module function that loads their model family) and implement `prompt_token_ids`, `generate`, `logprobs`.

    `.model` is the paddle model; after `apply_lora` / `load_adapters` it is the paddlenlp.peft `LoRAModel`
    wrapping the same base weights (lora.py). `head_chunk_size`: positions per chunk of the LM head in `logprobs`
    (lm_head.head_logprobs; config use_fused_head_and_loss_fn); None: full logits. It applies to every log-prob
    pass of this policy, also the LoRA reference (the same model with its adapters disabled)."""

    is_encoder_decoder: bool = False
    head_chunk_size: int | None = None
    # The model's own end ids (generation_config.json's eos_token_id: Llama 3 and Qwen2.5 list several), where every
    # rollout also stops (`with_end_ids`), whatever end id the caller passes (the tokenizer's EOS).
    end_token_ids: tuple[int, ...] = ()
    load_model = None  # staticmethod(path, *, trainable, recompute, tensor_parallel_degree, tensor_parallel_rank,
    #                                  dtype, config_overrides, recompute_granularity, recompute_use_reentrant)

    def __init__(self, model: paddle.nn.Layer):
        self.model = model

    @classmethod
    def load(cls, path: str, *, trainable: bool = True, recompute: bool = False, tensor_parallel_degree: int = 1,
             tensor_parallel_rank: int = 0, dtype: str = "float32",
             config_overrides: dict[str, Any] | None = None, recompute_granularity: str = "full",
             recompute_use_reentrant: bool = True) -> "Policy":
        """This class's model from a local directory or hub ID (in `dtype`, float32 by default, with
        `config_overrides` set on its config; frozen unless `trainable`), wrapped in the class."""
        policy = cls(cls.load_model(path, trainable=trainable, recompute=recompute,
                                    tensor_parallel_degree=tensor_parallel_degree,
                                    tensor_parallel_rank=tensor_parallel_rank, dtype=dtype,
                                    config_overrides=config_overrides, recompute_granularity=recompute_granularity,
                                    recompute_use_reentrant=recompute_use_reentrant))
        policy.end_token_ids = generation_end_ids(path)
        return policy

    def with_end_ids(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """`rollout.generate` keyword arguments whose `eos_token_ids` also hold the model's `end_token_ids`."""
        given = kwargs.get("eos_token_ids", ())
        given = [given] if np.isscalar(given) else list(given)
        return {**kwargs, "eos_token_ids": sorted({int(i) for i in given} | set(self.end_token_ids))}

    # ------------------------------------------------------------------------------------- what subclasses do

    def prompt_token_ids(self, tokenizer: PretrainedTokenizer, ids: list[int]) -> list[int]:
        """A tokenised prompt as the model takes it (an encoder-decoder wraps it in its special tokens)."""
        raise NotImplementedError

    def generate(self, prompt_ids: paddle.Tensor | np.ndarray, prompt_mask: paddle.Tensor | np.ndarray,
                 **kwargs: Any) -> Rollout:
        """G completions per prompt: prompt_ids/prompt_mask [P, L]; keyword arguments exactly those of
        `rollout.generate` (num_samples, max_new_tokens, temperature, row_keys, ...)."""
        raise NotImplementedError

    def logprobs(self, prompt_ids: paddle.Tensor, prompt_mask: paddle.Tensor, completion_ids: paddle.Tensor,
                 completion_mask: paddle.Tensor, *, temperature: float = 1.0, with_entropy: bool | str = False,
                 vocab_parallel: VocabParallel | None = None) -> tuple[paddle.Tensor, paddle.Tensor | None]:
        """Per-token `(logprobs [n, T], entropy [n, T] or None)` of the completions [n, T] after prompts [n, L],
        float32, of logits / temperature; `with_entropy` False, True or "detached"."""
        raise NotImplementedError

    # -------------------------------------------------------------------------------------------------- LoRA

    def apply_lora(self, rank: int = 8, alpha: float = 16, dropout: float = 0.0,
                   target_modules: str | Sequence[str] | None = None, *,
                   base_model_name_or_path: str | None = None) -> None:
        """Wrap `.model` in fresh LoRA adapters (lora.apply_lora); afterwards only the adapters train."""
        self.model = lora.apply_lora(self.model, rank, alpha, dropout, target_modules,
                                     base_model_name_or_path=base_model_name_or_path)

    def load_adapters(self, adapter_dir: str) -> None:
        """Load saved adapters into `.model`, creating them with the saved settings if it has none yet."""
        self.model = lora.load_adapters(self.model, adapter_dir)

    def adapters_disabled(self) -> contextlib.AbstractContextManager:
        """Context in which `.model` computes the base model exactly (the LoRA reference; lora.adapters_disabled)."""
        return lora.adapters_disabled(self.model)

    def trainable_parameters(self) -> list:
        """What an optimizer updates: under LoRA the adapters only, else every parameter of `.model`."""
        if lora.is_lora_model(self.model):
            return lora.trainable_parameters(self.model)
        return self.model.parameters()

    def save(self, out_dir: str, **save_pretrained_kwargs: Any) -> str:
        """`model.save_pretrained(out_dir, ...)` (under LoRA: the adapters, lora.save_adapters); returns out_dir."""
        self.model.save_pretrained(out_dir, **save_pretrained_kwargs)
        return out_dir


# ---------------------------------------------------------------------------------------------- shared helpers

def quiet_paddlenlp() -> None:
    """PaddleNLP logs every file it loads at INFO; keep its warnings and errors only."""
    from paddlenlp.utils.log import logger as paddlenlp_logger

    paddlenlp_logger.set_level("WARNING")


def load_tokenizer(path: str) -> PretrainedTokenizer:
    """The tokenizer of a local directory or hub ID (hub.resolve_model_dir): its tokenizer.json when it has one,
    whatever class tokenizer_config.json names, else PaddleNLP's AutoTokenizer (tokenizer.read_tokenizer); the pad
    token falls back to EOS; padding side left."""
    from .tokenizer import read_tokenizer

    tokenizer = read_tokenizer(resolve_model_dir(path))
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return tokenizer


def generation_end_ids(path: str) -> tuple[int, ...]:
    """The end ids of generation_config.json's `eos_token_id` (an id or a list) in the model directory or hub ID
    `path` (hub.resolve_model_dir, nothing downloaded); () when it has none."""
    import json

    directory = resolve_model_dir(path, download=False)
    file = os.path.join(directory, "generation_config.json")
    if not os.path.isfile(file):
        return ()
    with open(file, encoding="utf-8") as f:
        ids = json.load(f).get("eos_token_id")
    if ids is None:
        return ()
    return tuple(sorted({int(i) for i in ([ids] if isinstance(ids, int) else ids)}))


def is_encoder_decoder(model_or_path: str | os.PathLike | paddle.nn.Layer | PretrainedConfig) -> bool:
    """True for an encoder-decoder model, config, or model directory / hub ID (its config.json says so)."""
    if isinstance(model_or_path, (str, os.PathLike)):
        from paddlenlp.transformers import AutoConfig

        config = AutoConfig.from_pretrained(resolve_model_dir(os.fspath(model_or_path)))
    else:
        config = getattr(model_or_path, "config", model_or_path)
    return bool(getattr(config, "is_encoder_decoder", False))


def freeze(model: paddle.nn.Layer) -> paddle.nn.Layer:
    """Eval mode and no gradients (a reference model); returns `model`."""
    model.eval()
    for p in model.parameters():
        p.stop_gradient = True
    return model


def position_ids_from_mask(attention_mask: paddle.Tensor) -> paddle.Tensor:
    """Positions counted over real tokens only, so a left-padded prompt starts at position 0. [bs, L] int64."""
    return paddle.clip(paddle.cumsum(attention_mask.astype("int64"), axis=-1) - 1, min=0)


def parameters_by_decay(model: paddle.nn.Layer) -> set[str]:
    """Names of parameters that get weight decay: not biases and not normalisation weights (as PaddleNLP)."""
    return {p.name for n, p in model.named_parameters() if not any(k in n for k in ("bias", "norm", "ln_"))}


def mix_into(reference: paddle.nn.Layer, policy: paddle.nn.Layer, alpha: float) -> None:
    """TR-DPO reference sync: ref <- alpha * policy + (1 - alpha) * ref, in place (seed 001's ref_model_mixup_alpha)."""
    with paddle.no_grad():
        for r, p in zip(reference.parameters(), policy.parameters()):
            r.set_value(alpha * p.detach() + (1.0 - alpha) * r)
