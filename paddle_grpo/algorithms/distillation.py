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

The exact form (`opd_kl_estimator: full`, `full_reverse_kl`): at every completion position of the student's own
samples, the reverse KL over the whole vocabulary,

    KL_t = sum_v p_s(v | ctx_t) (log p_s(v | ctx_t) - log p_T(v | ctx_t)),

a differentiable loss term through the student's logits (the teacher detached): GKD's generalized JSD with beta = 1
on on-policy samples (Agarwal et al., arXiv 2306.13649, eq. 1 and Algorithm 1 with lambda = 1), in the form of TRL's
`GKDTrainer.generalized_jsd_loss` (both logits divided by the temperature, log-softmax, beta = 1: the KL of the
student's distribution to the teacher's). No sampling noise: every token of the vocabulary is weighed, not only the
one drawn.
"""
from typing import Tuple

import paddle
from paddle.autograd import PyLayer

from ._common import TensorLike, as_float, as_mask, check_same_shape, compute_dtype, masked

# The values of opd_kl_estimator: the sampled token's k1 in the advantages, or the exact KL as a loss term.
OPD_KL_ESTIMATORS = ("sampled", "full")
# Elements of one [rows, V] temporary of `full_reverse_kl` (64 MB in float32): a chunk makes about 7 of them, so a
# few hundred MB at most, whatever the micro-batch (8 x 210 positions x 49,152 tokens would be 330 MB a tensor).
KL_CHUNK_ELEMENTS = 1 << 24


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


def _log_softmaxes(student: paddle.Tensor, teacher: paddle.Tensor, temperature: float,
                   dtype: str) -> Tuple[paddle.Tensor, paddle.Tensor]:
    """log softmax(logits / temperature) of a chunk [rows, V] of each, in `dtype` (the chunk alone is cast), as
    z - logsumexp(z): paddle's CPU log_softmax kernel took 24 s for [64, 49,152] float32, logsumexp 0.03 s."""
    zs, zt = as_float(student, dtype), as_float(teacher, dtype)
    if temperature != 1.0:  # one [rows, V] pass each saved at the usual temperature
        zs, zt = zs / temperature, zt / temperature
    return zs - paddle.logsumexp(zs, axis=-1, keepdim=True), zt - paddle.logsumexp(zt, axis=-1, keepdim=True)


class _FullReverseKL(PyLayer):
    """KL_r [N] of flat logits [N, V], chunk by chunk. Backward, for the student's logits z:
    dKL_r/dz_rv = p_rv (ls_rv - lt_rv - KL_r) / temperature, the gradient of sum_v softmax(z)_v (log softmax(z)_v -
    lt_v) in z, recomputed per chunk: only the two logit tensors are kept for it, no [N, V] intermediate."""

    @staticmethod
    def forward(ctx, student: paddle.Tensor, teacher: paddle.Tensor, keep: paddle.Tensor, temperature: float,
                rows: int, dtype: str) -> paddle.Tensor:
        n = student.shape[0]
        kl = paddle.zeros([n], dtype=dtype)
        for a in range(0, n, rows):
            ls, lt = _log_softmaxes(student[a:a + rows], teacher[a:a + rows], temperature, dtype)
            kl[a:a + rows] = (paddle.exp(ls) * (ls - lt)).sum(-1)
        kl = masked(kl, keep)  # `where`: garbage logits of padding stay out
        ctx.save_for_backward(student, teacher, keep, kl)
        ctx.settings = (temperature, rows, dtype)
        return kl

    @staticmethod
    def backward(ctx, grad: paddle.Tensor) -> tuple:
        student, teacher, keep, kl = ctx.saved_tensor()
        temperature, rows, dtype = ctx.settings
        scale = masked(as_float(grad, dtype), keep) / temperature  # padding: exactly 0, even from NaN logits
        out = paddle.zeros(student.shape, dtype=student.dtype)
        for a in range(0, student.shape[0], rows):
            ls, lt = _log_softmaxes(student[a:a + rows], teacher[a:a + rows], temperature, dtype)
            g = paddle.exp(ls) * (ls - lt - kl[a:a + rows].unsqueeze(-1)) * scale[a:a + rows].unsqueeze(-1)
            out[a:a + rows] = masked(g, keep[a:a + rows].unsqueeze(-1)).astype(student.dtype)
        return out, None, None


def full_reverse_kl(student_logits: paddle.Tensor, teacher_logits: paddle.Tensor, response_mask: TensorLike,
                    temperature: float = 1.0, chunk_elements: int = KL_CHUNK_ELEMENTS) -> paddle.Tensor:
    """The exact per-position reverse KL, KL(pi_s || pi_T) = sum_v p_s(v) (log p_s(v) - log p_T(v)), with
    p = softmax(logits / temperature) (the distribution the policy's log-probs and the rollout use).

    Args:
        student_logits: `[n, T, V]` the student's logits at the completion positions, with their autograd graph
            (any float dtype: each chunk is computed in float32, float64 if an input is float64).
        teacher_logits: `[n, T, V]` the teacher's at the same positions (detached: no gradient reaches them).
        response_mask: `[n, T]`; masked positions get KL 0 and an exactly zero gradient, whatever their logits.
        temperature: > 0.
        chunk_elements: positions are computed `chunk_elements // V` at a time (at least 1), so no temporary is
            larger than about `chunk_elements` elements.
    Returns:
        `[n, T]` KL >= 0 (up to rounding), differentiable in `student_logits`: its gradient in the logits z of a
        position is p_s (log p_s - log p_T - KL) / temperature (GKD, arXiv 2306.13649, beta = 1).
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if list(student_logits.shape) != list(teacher_logits.shape):
        raise ValueError(f"shape mismatch: student_logits={list(student_logits.shape)}, "
                         f"teacher_logits={list(teacher_logits.shape)}")
    n, t, v = student_logits.shape
    mask = as_mask(response_mask, "float32")
    if list(mask.shape) != [n, t]:
        raise ValueError(f"shape mismatch: logits positions={[n, t]}, response_mask={list(mask.shape)}")
    dtype = compute_dtype(student_logits, teacher_logits)
    rows = max(1, chunk_elements // max(v, 1))
    # A contiguous reshape is a view: no copy of the [n, T, V] logits.
    kl = _FullReverseKL.apply(student_logits.reshape([n * t, v]), teacher_logits.detach().reshape([n * t, v]),
                              mask.reshape([n * t]), float(temperature), rows, dtype)
    return kl.reshape([n, t])
