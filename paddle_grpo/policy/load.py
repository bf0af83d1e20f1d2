"""`load_policy`: the Policy class a model directory needs, chosen from its config (`is_encoder_decoder`)."""
from __future__ import annotations

from typing import Any

from .base import Policy, is_encoder_decoder
from .causal import CausalPolicy
from .seq2seq import Seq2SeqPolicy


def policy_class(path: str) -> type[Policy]:
    """Seq2SeqPolicy when the config.json of the local directory `path` says is_encoder_decoder, else CausalPolicy."""
    return Seq2SeqPolicy if is_encoder_decoder(path) else CausalPolicy


def load_policy(path: str, *, trainable: bool = True, recompute: bool = False, tensor_parallel_degree: int = 1,
                tensor_parallel_rank: int = 0, dtype: str = "float32",
                config_overrides: dict[str, Any] | None = None) -> Policy:
    """The model of the local directory `path` in its Policy class; frozen (eval, no gradients) unless
    `trainable`. `recompute` turns on activation recompute of a trainable causal LM (ignored, with a warning, by
    encoder-decoders); tensor_parallel_*: this rank's shard (causal LMs only). `dtype` (float32 by default) and
    `config_overrides` (model-config fields, e.g. use_flash_attention) come from the precision plan
    (precision.py: PrecisionPlan.load_kwargs). Nothing is ever downloaded."""
    return policy_class(path).load(path, trainable=trainable, recompute=recompute,
                                   tensor_parallel_degree=tensor_parallel_degree,
                                   tensor_parallel_rank=tensor_parallel_rank, dtype=dtype,
                                   config_overrides=config_overrides)
