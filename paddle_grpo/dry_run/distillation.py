"""The teacher of on-policy distillation (teacher_model_name_or_path): where it comes from and whether it can read
the policy's token ids."""
from __future__ import annotations

from typing import List, Optional, Tuple

from ..config import Config
from .models import inspect_model

TEACHER_KEY = "teacher_model_name_or_path"


def teacher_spec(cfg: Config) -> List[Tuple[str, str]]:
    """[(teacher_model_name_or_path, name)] when the run distills, else []: the files preflight checks."""
    name = cfg.teacher_model_name_or_path.strip()
    return [(TEACHER_KEY, name)] if name else []


def check_teacher(cfg: Config, policy_vocab: Optional[int]) -> Tuple[List[str], List[str]]:
    """(lines, problems) about the teacher of a distilling run (nothing for other runs): it resolves as the policy
    does, its config and tokenizer load, and its vocab_size is the policy model's (`policy_vocab`, None when
    unknown), as the run refuses it otherwise (step.load_teacher). No weights are read."""
    name = cfg.teacher_model_name_or_path.strip()
    if not name:
        return [], []
    problems, config, _ = inspect_model(name, TEACHER_KEY, cfg=cfg)
    vocab = getattr(config, "vocab_size", None) if config is not None else None
    if vocab is not None and policy_vocab is not None and vocab != policy_vocab:
        problems.append(f"{TEACHER_KEY}: '{name}' has vocab_size {vocab}, the policy {policy_vocab}: the teacher "
                        "must share the policy's tokenizer (it reads the policy's token ids)")
    teacher = f"on-policy distillation: teacher '{name}'" + (f" (vocab_size {vocab})" if vocab is not None else "")
    if cfg.opd_kl_estimator == "full":
        how = ("the loss is c * agg(KL) alone (opd_only)" if cfg.opd_only else
               "the loss is the policy loss + c * agg(KL)")
        return [f"{teacher}, c = opd_kl_coeff {cfg.opd_kl_coeff}: {how}; the teacher runs in every micro-batch of "
                "the update",
                "opd_kl_estimator: full (the exact reverse KL over the vocabulary at each completion position, "
                "GKD with beta = 1; [micro-batch, T, V] logits of the student and the teacher)"], problems
    how = ("the advantages are -c * (l^s - l^T) alone (opd_only)" if cfg.opd_only else
           "each token's advantage is A - c * (l^s - l^T)")
    line = f"{teacher}, c = opd_kl_coeff {cfg.opd_kl_coeff}: {how}; one more forward pass per step"
    return [line, "opd_kl_estimator: sampled (the sampled token's l^s - l^T, in the advantages)"], problems
