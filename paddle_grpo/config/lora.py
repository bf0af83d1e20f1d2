"""LoRAArguments: low-rank adapters on the policy."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List

from .fields import arg


@dataclass
class LoRAArguments:
    lora: bool = arg(False, "Train LoRA adapters (paddlenlp.peft) instead of all weights. The reference model is "
                            "the base model with the adapters disabled (no second copy of the weights); checkpoints "
                            "hold the adapters only (tools/models/merge_lora.py makes a full model of them).")
    lora_path: str = arg("", "Adapters to start from (a LoRA checkpoint, or PaddleNLP LoRA output); their saved rank, "
                             "alpha and target modules are used, as in PaddleNLP. Empty: new adapters (B = 0, so "
                             "training starts from the base model).")
    lora_rank: int = arg(8, "LoRA rank r.")
    lora_alpha: float = arg(16.0, "LoRA alpha: the adapter update B A is scaled by lora_alpha / lora_rank; -1: "
                                  "2 x lora_rank (PaddleNLP's default).")
    lora_dropout: float = arg(0.0, "(new) Dropout on the adapters' input during the update (0 keeps the "
                                   "importance ratio of the update exact).")
    target_modules: List[str] = arg(None, "(new) Regexes, matched in full against layer names such as "
                                          "qwen2.layers.0.self_attn.q_proj, of the linear layers that get adapters. "
                                          "Empty: every attention and MLP projection (q/k/v/o, gate/up/down).",
                                    default_factory=list)
