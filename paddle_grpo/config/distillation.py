"""DistillationArguments: on-policy distillation from a teacher model (docs/algorithms.md, "On-policy
distillation"; algorithms/distillation.py)."""
from __future__ import annotations

from dataclasses import dataclass

from .fields import arg


@dataclass
class DistillationArguments:
    teacher_model_name_or_path: str = arg(
        "", "(new) On-policy distillation: the teacher that scores the policy's sampled tokens (TRL's GKD key), a "
            "local directory, a run's checkpoint-N or a hub ID, resolved as actor_model_name_or_path is. It must "
            "share the policy's tokenizer (the same vocabulary: it reads the policy's token ids). Each token's "
            "advantage becomes A_t - opd_kl_coeff * (l^s_t - l^T_t), the sampler's log-prob minus the teacher's: "
            "the update descends the per-token reverse KL to the teacher. Loaded frozen in the trainer's process "
            "(one more forward pass per step). Empty: no distillation.")
    opd_kl_coeff: float = arg(1.0, "(new) The distillation term's weight c in A_t - c * (l^s_t - l^T_t) (slime's "
                                   "--opd-kl-coef); > 0. No effect without teacher_model_name_or_path.")
    opd_only: bool = arg(False, "(new) true: the advantages are the distillation term alone, -c * (l^s_t - l^T_t) "
                                "(Thinking Machines' on-policy distillation: the rewards are computed and logged "
                                "but do not train); false: the term is added to the estimator's advantages (slime). "
                                "No effect without teacher_model_name_or_path.")
