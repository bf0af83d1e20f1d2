"""On-policy distillation in the step: the teacher's log-probs of the sampled tokens, folded into the update's
advantages (algorithms/distillation.py; docs/algorithms.md, "On-policy distillation")."""
from __future__ import annotations

import time
from typing import Any, Dict, Optional

import paddle

from ..algorithms.distillation import opd_advantages, reverse_kl_tokens
from ..config import ConfigError
from ..parallel import ParallelContext
from ..policy import Policy, load_policy
from .batch import Batch
from .experience import logprobs
from .policy_update import UpdateInputs


def _vocab_size(policy: Policy) -> Optional[int]:
    return getattr(policy.model.config, "vocab_size", None)


def load_teacher(cfg: Any, policy: Policy, load_kwargs: Dict[str, Any]) -> Optional[Policy]:
    """The frozen teacher of teacher_model_name_or_path (None when unset), loaded as the reference model is (the
    policy's tensor-parallel shard and precision plan: `load_kwargs`). Raises ConfigError when its vocabulary is
    not the policy's: it must read the policy's token ids."""
    name = cfg.teacher_model_name_or_path.strip()
    if not name:
        return None
    if policy.is_encoder_decoder:
        raise ConfigError("teacher_model_name_or_path: on-policy distillation scores a decoder-only policy's tokens; "
                          f"actor_model_name_or_path {cfg.actor_model_name_or_path!r} is an encoder-decoder")
    teacher = load_policy(name, trainable=False, **load_kwargs)
    if teacher.is_encoder_decoder or _vocab_size(teacher) != _vocab_size(policy):
        raise ConfigError(f"teacher_model_name_or_path {cfg.teacher_model_name_or_path!r}: the teacher must be a "
                          f"decoder-only model with the policy's vocabulary (it reads the policy's token ids); its "
                          f"vocab_size is {_vocab_size(teacher)}, the policy's {_vocab_size(policy)}")
    return teacher


def distill(par: ParallelContext, teacher: Policy, batch: Batch, inputs: UpdateInputs, cfg: Any,
            vocab_parallel: Any = None, amp: Any = None) -> Dict[str, float]:
    """Replace `inputs.advantages` [n, T] by `opd_advantages` of the teacher's log-probs of this rank's completions
    (against the sampler's own, `batch.sample_logprobs`); returns the metrics: `opd/reverse_kl`, the token-mean of
    l^s - l^T over the global batch's loss tokens (KL(pi_s || pi_T) per token), and `perf/teacher_s`."""
    t0 = time.perf_counter()
    teacher_lp = logprobs(teacher, batch, cfg, vocab_parallel, amp=amp)[0]
    mask = inputs.loss_mask
    k = reverse_kl_tokens(batch.sample_logprobs, teacher_lp, mask)
    inputs.advantages = opd_advantages(inputs.advantages, k, mask, cfg.opd_kl_coeff, cfg.opd_only)
    kl_sum, tokens = par.all_reduce_sum([float(k.sum()), float(paddle.cast(mask, "float32").sum())])
    return {"opd/reverse_kl": float(kl_sum / max(tokens, 1.0)), "perf/teacher_s": time.perf_counter() - t0}
