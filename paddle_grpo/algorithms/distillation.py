"""On-policy distillation (OPD): the student samples, a teacher scores the sampled tokens, and each token's advantage
is lowered by the per-token reverse KL to the teacher.

With `l^s_t` the sampled token's log-prob under the policy that sampled it and `l^T_t` under the teacher,
`k_t = l^s_t - l^T_t` is the per-token sample estimate of KL(pi_s || pi_T) (Schulman's k1; its expectation over the
student's own samples is the reverse KL). The advantage becomes

    A'_t = A_t - c * k_t             (`opd_only` false: on top of the estimator's advantage A_t, slime's OPD)
    A'_t = -c * k_t                  (`opd_only` true: distillation alone, Thinking Machines' on-policy distillation)

and the policy-gradient loss is unchanged. Since the gradient of a policy-gradient loss with advantage `-k_t` is
`-E[k_t grad l_t]`, which is `-grad KL(pi_s || pi_T)` per token (the score-function form; the pathwise part
E[grad l_t] is 0), the update descends the reverse KL: mode-seeking, as Agarwal et al. (GKD, arXiv 2306.13649) and
Thinking Machines ("On-Policy Distillation", 2025) describe. `k_t` is a constant of the update (taken at sampling).

Sources: slime's `--opd-kl-coef` (docs/en/advanced/on-policy-distillation.md: `A_t - coef * KL_t` added to any
estimator's advantage), Thinking Machines' recipe (advantage = teacher log-prob - student log-prob, no reward).
"""
import paddle

from ._common import TensorLike, as_float, as_mask, check_same_shape, masked


def reverse_kl_tokens(sample_log_probs: TensorLike, teacher_log_probs: TensorLike,
                      response_mask: TensorLike) -> paddle.Tensor:
    """`k_t = l^s_t - l^T_t` [bs, T] float32 on valid tokens, 0 on masked ones (whatever their log-probs hold)."""
    sample = as_float(sample_log_probs, "float32")
    teacher = as_float(teacher_log_probs, "float32")
    mask = as_mask(response_mask, "float32")
    check_same_shape(sample_log_probs=sample, teacher_log_probs=teacher, response_mask=mask)
    return masked(sample - teacher, mask)  # `where`: inf/NaN garbage in padding stays out


def opd_advantages(advantages: TensorLike, reverse_kl: TensorLike, response_mask: TensorLike, coeff: float,
                   opd_only: bool = False) -> paddle.Tensor:
    """The advantages [bs, T] with the distillation term: `A_t - coeff * k_t` (`opd_only`: `-coeff * k_t`), 0 on
    masked tokens. `advantages` [bs, T] are the estimator's (ignored with `opd_only`); `reverse_kl` [bs, T] is
    `reverse_kl_tokens` of the sampler's and the teacher's log-probs of the same sampled tokens."""
    if not coeff > 0:
        raise ValueError(f"the distillation coefficient must be > 0, got {coeff!r}")
    mask = as_mask(response_mask, "float32")
    k = masked(as_float(reverse_kl, "float32"), mask)
    if opd_only:
        return -coeff * k
    adv = as_float(advantages, "float32")
    check_same_shape(advantages=adv, reverse_kl=k)
    return masked(adv, mask) - coeff * k
