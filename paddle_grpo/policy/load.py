"""`load_policy`: the Policy class a model (directory or hub ID) needs, chosen from its config (is_encoder_decoder)."""
from __future__ import annotations

from typing import Any

from .base import Policy, is_encoder_decoder
from .causal import CausalPolicy
from .hub import resolve_model_dir
from .seq2seq import Seq2SeqPolicy


def policy_class(path: str) -> type[Policy]:
    """Seq2SeqPolicy when the config.json of `path` (a local directory or hub ID: hub.resolve_model_dir) says
    is_encoder_decoder, else CausalPolicy."""
    return Seq2SeqPolicy if is_encoder_decoder(path) else CausalPolicy


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
