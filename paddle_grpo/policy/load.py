"""`load_policy`: the Policy class a model (directory or hub ID) needs, chosen from its config (is_encoder_decoder)."""
from __future__ import annotations

import logging
from typing import Any

from .base import Policy, is_encoder_decoder
from .causal import CausalPolicy
from .hub import resolve_model_dir
from .seq2seq import Seq2SeqPolicy

logger = logging.getLogger("paddle_grpo.policy")


def policy_class(path: str) -> type[Policy]:
    """Seq2SeqPolicy when the config.json of `path` (a local directory or hub ID: hub.resolve_model_dir) says
    is_encoder_decoder, else CausalPolicy."""
    return Seq2SeqPolicy if is_encoder_decoder(path) else CausalPolicy


def model_vocab_size(path: str) -> int:
    """The vocabulary size in the model config of `path` (a local directory or hub ID: hub.resolve_model_dir): the
    LM head's output size, which decides the head's default (config.Config.lm_head_decision)."""
    from paddlenlp.transformers import AutoConfig

    return int(AutoConfig.from_pretrained(resolve_model_dir(path)).vocab_size)


def head_chunk_size(cfg: Any, *, announce: bool = True) -> int | None:
    """Positions per chunk of the LM head of `cfg`'s policy (load_policy's `head_chunk_size`; None: full logits):
    `cfg.lm_head_decision` at the policy's vocabulary size, logged in one line (`LM head: ...`) when `announce`."""
    chunk, line = cfg.lm_head_decision(model_vocab_size(cfg.actor_model_name_or_path))
    if announce:
        logger.info(line)
    return chunk


def load_policy(path: str, *, trainable: bool = True, recompute: bool = False, tensor_parallel_degree: int = 1,
                tensor_parallel_rank: int = 0, dtype: str = "float32",
                config_overrides: dict[str, Any] | None = None, head_chunk_size: int | None = None,
                recompute_granularity: str = "full", recompute_use_reentrant: bool = True) -> Policy:
    """The model of `path` (a local directory, or a hub ID resolved in PaddleNLP's cache: hub.resolve_model_dir)
    in its Policy class; frozen (eval, no gradients) unless `trainable`. `recompute` turns on activation recompute
    of a trainable causal LM with `recompute_granularity` / `recompute_use_reentrant` (PaddleNLP's keys; ignored, with a
    warning, by encoder-decoders); tensor_parallel_*: this rank's shard
    (causal LMs only). `dtype` (float32 by default) and `config_overrides` (model-config fields, e.g.
    use_flash_attention) come from the precision plan (precision.py: PrecisionPlan.load_kwargs).
    `head_chunk_size`: the policy's `head_chunk_size` (the chunked LM head; config.lm_head_chunk_size)."""
    path = resolve_model_dir(path)
    policy = policy_class(path).load(path, trainable=trainable, recompute=recompute,
                                     tensor_parallel_degree=tensor_parallel_degree,
                                     tensor_parallel_rank=tensor_parallel_rank, dtype=dtype,
                                     config_overrides=config_overrides, recompute_granularity=recompute_granularity,
                                     recompute_use_reentrant=recompute_use_reentrant)
    policy.head_chunk_size = head_chunk_size
    return policy
