"""On-policy distillation in the step (algorithms/distillation.py; docs/algorithms.md, "On-policy distillation"):
`sampled`, the teacher's log-probs of the sampled tokens folded into the update's advantages; `full`, the exact
reverse KL over the vocabulary as a loss term, the teacher's logits computed beside the student's in each
micro-batch of the update (`FullReverseKL`: never stored for the whole batch)."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

import paddle

from ..algorithms.distillation import full_reverse_kl, opd_advantages, reverse_kl_tokens
from ..config import ConfigError
from ..parallel import ParallelContext
from ..policy import Policy, load_policy
from ..policy.causal import logprobs_from_completion_logits
from .batch import Batch, MicroBatch
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


@dataclass
class FullReverseKL:
    """The exact reverse KL of one micro-batch of the update (opd_kl_estimator full; UpdateInputs.distill): the
    student's full logits at the completion positions (with their graph), its log-probs and entropies from them,
    the teacher's logits under no_grad, and `full_reverse_kl` of the two. The teacher's [mb, T, V] logits live for
    one micro-batch only. Accumulates the KL's token sum for `metrics` (this rank; `metrics` sums over ranks)."""
    par: ParallelContext
    teacher: Policy
    kl_sum: float = 0.0
    tokens: float = 0.0
    seconds: float = 0.0

    def __call__(self, policy: Policy, mb: MicroBatch, inputs: UpdateInputs, temperature: float,
                 with_entropy: Any) -> Tuple[paddle.Tensor, paddle.Tensor, paddle.Tensor]:
        """`(log-probs, entropies, KL)` [mb, T] of micro-batch `mb` (float32; the KL 0 outside the loss mask)."""
        args = mb.inputs(inputs.batch)
        logits = policy.completion_logits(*args)
        lp, entropy = logprobs_from_completion_logits(logits, args[2], temperature, with_entropy)
        t0 = time.perf_counter()
        with paddle.no_grad():
            teacher_logits = self.teacher.completion_logits(*args)
        self.seconds += time.perf_counter() - t0
        mask = mb.completion(inputs.loss_mask)
        kl = full_reverse_kl(logits, teacher_logits, mask, temperature)
        self.kl_sum += float(kl.detach().sum())
        self.tokens += float(paddle.cast(mask, "float32").sum())
        return lp, entropy, kl

    def metrics(self) -> Dict[str, float]:
        """`opd/reverse_kl`: the exact KL(pi_s || pi_T) per loss token, over every micro-batch the update ran (all
        passes and mini-batches, every rank); `perf/teacher_s`: this rank's seconds in the teacher's forward."""
        kl_sum, tokens = self.par.all_reduce_sum([self.kl_sum, self.tokens])
        return {"opd/reverse_kl": float(kl_sum / max(tokens, 1.0)), "perf/teacher_s": self.seconds}


def distill(par: ParallelContext, teacher: Policy, batch: Batch, inputs: UpdateInputs, cfg: Any,
            vocab_parallel: Any = None, amp: Any = None) -> Dict[str, float]:
    """`sampled`: replace `inputs.advantages` [n, T] by `opd_advantages` of the teacher's log-probs of this rank's
    completions (against the sampler's own, `batch.sample_logprobs`); returns the metrics: `opd/reverse_kl`, the
    token-mean of l^s - l^T over the global batch's loss tokens (KL(pi_s || pi_T) per token), and
    `perf/teacher_s`. `full`: the advantages stay the estimator's; `inputs.distill` becomes a `FullReverseKL`,
    which the update calls per micro-batch (its metrics come with the update's); returns {}."""
    if cfg.opd_kl_estimator == "full":
        inputs.distill = FullReverseKL(par, teacher)
        return {}
    t0 = time.perf_counter()
    teacher_lp = logprobs(teacher, batch, cfg, vocab_parallel, amp=amp)[0]
    mask = inputs.loss_mask
    k = reverse_kl_tokens(batch.sample_logprobs, teacher_lp, mask)
    inputs.advantages = opd_advantages(inputs.advantages, k, mask, cfg.opd_kl_coeff, cfg.opd_only)
    kl_sum, tokens = par.all_reduce_sum([float(k.sum()), float(paddle.cast(mask, "float32").sum())])
    return {"opd/reverse_kl": float(kl_sum / max(tokens, 1.0)), "perf/teacher_s": time.perf_counter() - t0}
