"""RolloutArguments: sampling (temperature, top-p/k, repetition penalty, group size)."""
from __future__ import annotations

from dataclasses import dataclass

from .fields import arg, off


@dataclass
class RolloutArguments:
    max_prompt_len: int = arg(512, "Prompts longer than this are truncated from the left (the end is kept).")
    max_dec_len: int = arg(4096, "Maximum number of generated tokens per completion.")
    min_dec_len: int = arg(32, "Minimum number of generated tokens before EOS is allowed.")
    top_p: float = arg(1.0, "Nucleus sampling threshold, in (0, 1].")
    top_k: int = arg(0, "(new) Sample only among the top_k most likely tokens (ties at the k-th kept; 0: off), "
                        "applied before top_p as in PaddleNLP's generation; both restrict to a few candidates "
                        "instead of sorting the vocabulary.")
    temperature: float = arg(0.7, "Sampling temperature (> 0); log-probs are computed at the same temperature.")
    repetition_penalty: float = arg(1.0, "Repetition penalty (1.0: none).")
    rollout_max_num_seqs: int = arg(32, "Most sequences one generation call handles; larger rollouts are chunked.")
    rollout_quant_type: str = arg("", "Weight quantisation of the rollout model (e.g. weight_only_int8).",
                                  cpu=off("quantised inference kernels are GPU-only in PaddleNLP"),
                                  gpu=off("not implemented: generation runs on the training model's weights, "
                                          "there is no separate (quantised) rollout model"))
