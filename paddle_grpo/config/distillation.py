"""DistillationArguments: on-policy distillation from a teacher model (docs/algorithms.md, "On-policy
distillation"; algorithms/distillation.py)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Optional

from .fields import _from_algorithms, arg


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
                                "No effect without teacher_model_name_or_path. With opd_kl_estimator full: the "
                                "policy-gradient term leaves the loss and the exact KL alone trains.")
    opd_kl_estimator: str = arg(
        "sampled", "(new) How the reverse KL to the teacher enters the update. sampled: the sampled token's "
                   "estimate l^s_t - l^T_t in the advantages, as described under teacher_model_name_or_path (one "
                   "teacher forward pass per step). full: at every completion position the exact KL over the "
                   "vocabulary, sum_v p_s(v) (log p_s(v) - log p_T(v)) with both distributions at the policy's "
                   "temperature, added to the loss as opd_kl_coeff * (its aggregate over the loss tokens, as "
                   "loss_agg_mode aggregates the policy loss), the gradient through the student's logits, the "
                   "teacher detached: GKD with beta = 1 on the student's own samples (Agarwal et al., arXiv "
                   "2306.13649; TRL's GKDTrainer). The advantages stay the estimator's (opd_only: the "
                   "policy-gradient term is dropped). Costs: the teacher runs in every micro-batch of the update "
                   "(every pass), and the student's and the teacher's [micro-batch, T, V] logits are held there "
                   "(8 x 210 x 49,152 float32: 330 MB each), the LM head unchunked for the student in the update. "
                   "Not with tensor_parallel_degree > 1 or pipeline_parallel_degree > 1.",
        choices=_from_algorithms("OPD_KL_ESTIMATORS"))


def distillation_refusal(cfg: Any, given: Dict[str, str]) -> Optional[str]:
    """Why a distilling run's opd_kl_estimator cannot run with the rest of `cfg` (a message naming the keys and
    where they were set, `given`), or None. `full` needs the student's and the teacher's whole-vocabulary logits in
    the update's own micro-batch loop (step.distillation.FullReverseKL): tensor parallelism splits the LM head's
    vocabulary across ranks (the KL's sum over v would need the vocab-parallel reductions, not written for it), and
    under pipeline parallelism the last stage computes the loss inside fleet's schedule, where no teacher runs."""
    if cfg.opd_kl_estimator != "full" or not cfg.teacher_model_name_or_path.strip():
        return None
    where = given.get("opd_kl_estimator")
    head = f"{where + ': ' if where else ''}key 'opd_kl_estimator' = 'full': the exact reverse KL needs"
    for key, why in (("tensor_parallel_degree", "splits the LM head's vocabulary across ranks"),
                     ("pipeline_parallel_degree", "has the last stage compute the loss inside fleet's schedule, "
                                                  "where the teacher does not run")):
        value = getattr(cfg, key)
        if value > 1:
            at = f", {given[key]}" if given.get(key) else ""
            return (f"{head} the student's and the teacher's logits over the whole vocabulary in the update's "
                    f"micro-batches, and {key} ({value}{at}) {why}: not supported with full. Use "
                    f"opd_kl_estimator: sampled (the sampled token's estimate), or {key}: 1")
    return None
