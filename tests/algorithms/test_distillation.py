"""On-policy distillation's advantages (algorithms/distillation.py) against a numpy loop, and the claim of its
docstring: a policy-gradient loss with those advantages has, in expectation over the student's own samples, the
gradient of the reverse KL KL(pi_s || pi_T), checked against the analytic gradient of that KL.

Tolerances: the advantages are elementwise (a subtraction and a multiply-add of log-probs of size <= 10: 3 float32
roundings, 3 * 6e-8 * 10 = 1.8e-6 absolute; atol 1e-5). The gradient test runs in float64 on a 7-token
vocabulary except for the advantages, which opd_advantages rounds to float32: log-probs of size <= 5 carry
5 * 6e-8 = 3e-7 each, times pi <= 1 in a sum of 7 terms, so atol 1e-6 (2e-6 worst case, far below the
gradient's 1e-2 scale that the test also asserts).
"""
import numpy as np
import paddle
import pytest

from paddle_grpo.algorithms.distillation import opd_advantages, reverse_kl_tokens

pytestmark = pytest.mark.numerics


def reference(adv, sample, teacher, mask, coeff, only):
    out = np.zeros(adv.shape)
    for i, t in np.ndindex(*adv.shape):
        if mask[i, t]:
            k = float(sample[i, t]) - float(teacher[i, t])
            out[i, t] = (0.0 if only else float(adv[i, t])) - coeff * k
    return out


@pytest.mark.parametrize("only", [False, True])
def test_advantages_match_a_loop_and_padding_stays_out(only):
    rng = np.random.default_rng(0)
    adv = rng.normal(size=(3, 5)).astype(np.float32)
    sample = -rng.uniform(0, 10, size=(3, 5)).astype(np.float32)
    teacher = -rng.uniform(0, 10, size=(3, 5)).astype(np.float32)
    mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 0, 0, 0, 0]], dtype=np.int64)
    sample[0, 4], teacher[0, 3] = -np.inf, np.nan  # padding garbage
    k = reverse_kl_tokens(paddle.to_tensor(sample), paddle.to_tensor(teacher), paddle.to_tensor(mask))
    got = opd_advantages(paddle.to_tensor(adv), k, paddle.to_tensor(mask), 0.5, only).numpy()
    want = reference(adv, sample, teacher, mask, 0.5, only)
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
    assert np.isfinite(got).all() and (got[mask == 0] == 0).all()
    k = k.numpy()
    np.testing.assert_allclose(k[mask == 1], (sample - teacher)[mask == 1], atol=1e-5, rtol=0)


def test_the_policy_gradient_with_these_advantages_is_the_reverse_kl_gradient():
    """One position, a 7-token vocabulary: the expected loss sum_x pi(x) * (-A_x l_x) with A_x from opd_advantages
    (pi and A constants, as sampled) has the gradient of KL(softmax(theta) || p_T) in theta:
    dKL/dtheta_j = pi_j (log pi_j - log p_T_j - KL)."""
    rng = np.random.default_rng(1)
    theta = rng.normal(size=7)
    teacher_lp = np.log(rng.dirichlet(np.ones(7)))
    th = paddle.to_tensor(theta, dtype="float64", stop_gradient=False)
    lp = paddle.nn.functional.log_softmax(th)                      # l_x for every token x, as 7 one-token rows
    lp_rows = lp.reshape([7, 1])
    k = reverse_kl_tokens(lp_rows.detach(), paddle.to_tensor(teacher_lp.reshape(7, 1)), paddle.ones([7, 1]))
    adv = opd_advantages(paddle.zeros([7, 1], dtype="float64"), k, paddle.ones([7, 1]), coeff=1.0)
    pi = paddle.exp(lp).detach().reshape([7, 1])
    (pi * -adv.astype("float64").detach() * lp_rows).sum().backward()
    p = np.exp(theta - theta.max())
    p /= p.sum()
    kl = float((p * (np.log(p) - teacher_lp)).sum())
    want = p * (np.log(p) - teacher_lp - kl)
    # float32 advantages (opd_advantages computes in float32): 1e-6 relative on log-probs of size <= 5
    np.testing.assert_allclose(th.grad.numpy(), want, atol=1e-6, rtol=0)
    assert np.abs(want).max() > 1e-2  # not a vacuous zero


def test_a_zero_or_negative_coefficient_is_refused():
    x = paddle.zeros([1, 2])
    with pytest.raises(ValueError, match="coefficient must be > 0"):
        opd_advantages(x, x, paddle.ones([1, 2]), 0.0)
