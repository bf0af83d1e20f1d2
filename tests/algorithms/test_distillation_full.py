"""The exact reverse KL of on-policy distillation (`full_reverse_kl`, opd_kl_estimator full) against a numpy loop
over a tiny vocabulary: its value, its gradient in the student's logits (central finite differences of the loop in
float64, and the analytic p_s (log p_s - log p_T - KL) / temperature), no gradient for the teacher, masked
positions contributing nothing whatever their logits, and the chunking over positions changing nothing beyond
the order of a row's sums.

Tolerances. float64 inputs: the loop and the function differ by rounding of sums of V = 7 terms of size <= 10:
7 * 10 * 1.1e-16 ~ 1e-14, atol 1e-12. The finite differences (step h = 1e-6) carry h^2 * |f'''| / 6 ~ 1e-13 of
truncation and eps64 * |KL| / h ~ 1e-10 of rounding: atol 1e-8. float32 inputs: each log-softmax is exact to a few
ulps of the largest term it sums (|z| / temperature + log V <= 8 here), so each of the V = 7 products p (ls - lt)
is off by about 4 * 6e-8 * 8 * 2 = 4e-6 and their sum by 7 * 4e-6 = 2.7e-5: atol 3e-5 for the value and for
the gradient (the same products, and |g| <= 1 weights).
"""
import numpy as np
import paddle
import pytest

from paddle_grpo.algorithms.distillation import OPD_KL_ESTIMATORS, full_reverse_kl

pytestmark = pytest.mark.numerics

V = 7


def log_softmax(z):
    z = z - z.max()
    return z - np.log(np.exp(z).sum())


def loop_kl(student, teacher, mask, temperature):
    """KL(pi_s || pi_T) per position, the sum over the vocabulary written out."""
    out = np.zeros(mask.shape)
    for i, t in np.ndindex(*mask.shape):
        if mask[i, t]:
            ls = log_softmax(student[i, t] / temperature)
            lt = log_softmax(teacher[i, t] / temperature)
            out[i, t] = sum(np.exp(ls[v]) * (ls[v] - lt[v]) for v in range(V))
    return out


def inputs(seed=0, scale=2.0):
    rng = np.random.default_rng(seed)
    student = rng.normal(scale=scale, size=(3, 4, V))
    teacher = rng.normal(scale=scale, size=(3, 4, V))
    mask = np.array([[1, 1, 1, 0], [1, 1, 1, 1], [0, 1, 0, 0]], dtype=np.int64)
    weights = rng.uniform(-1, 1, size=(3, 4))  # a loss that weighs the positions unequally: backward's scale
    return student, teacher, mask, weights


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_value_and_gradient_match_a_loop_in_float64(temperature):
    student, teacher, mask, weights = inputs()
    s = paddle.to_tensor(student, stop_gradient=False)
    t = paddle.to_tensor(teacher, stop_gradient=False)  # asks for a gradient: it must get none
    kl = full_reverse_kl(s, t, paddle.to_tensor(mask), temperature)
    want = loop_kl(student, teacher, mask, temperature)
    np.testing.assert_allclose(kl.numpy(), want, atol=1e-12, rtol=0)
    assert want[mask == 1].min() > 0.05  # the distributions differ: not a vacuous 0
    (kl * paddle.to_tensor(weights)).sum().backward()
    assert t.grad is None  # the teacher is detached

    def loss(x):
        return float((loop_kl(x, teacher, mask, temperature) * weights).sum())

    h, numeric = 1e-6, np.zeros_like(student)
    for idx in np.ndindex(*student.shape):
        up, down = student.copy(), student.copy()
        up[idx] += h
        down[idx] -= h
        numeric[idx] = (loss(up) - loss(down)) / (2 * h)
    np.testing.assert_allclose(s.grad.numpy(), numeric, atol=1e-8, rtol=0)
    assert np.abs(numeric).max() > 1e-2
    # and the analytic form, p_s (log p_s - log p_T - KL) / temperature per position, times the position's weight
    for i, j in zip(*np.nonzero(mask)):
        ls, lt = log_softmax(student[i, j] / temperature), log_softmax(teacher[i, j] / temperature)
        analytic = np.exp(ls) * (ls - lt - want[i, j]) / temperature * weights[i, j]
        np.testing.assert_allclose(s.grad.numpy()[i, j], analytic, atol=1e-12, rtol=0)


def test_float32_logits_match_the_float64_loop():
    student, teacher, mask, weights = inputs(seed=1)
    s = paddle.to_tensor(student.astype(np.float32), stop_gradient=False)
    kl = full_reverse_kl(s, paddle.to_tensor(teacher.astype(np.float32)), paddle.to_tensor(mask), 0.7)
    assert kl.dtype == paddle.float32
    s32, t32 = student.astype(np.float32).astype(np.float64), teacher.astype(np.float32).astype(np.float64)
    np.testing.assert_allclose(kl.numpy(), loop_kl(s32, t32, mask, 0.7), atol=3e-5, rtol=0)
    (kl * paddle.to_tensor(weights.astype(np.float32))).sum().backward()
    assert s.grad.dtype == paddle.float32
    want = np.zeros_like(student)
    for i, j in zip(*np.nonzero(mask)):
        ls, lt = log_softmax(s32[i, j] / 0.7), log_softmax(t32[i, j] / 0.7)
        kl_ij = (np.exp(ls) * (ls - lt)).sum()
        want[i, j] = np.exp(ls) * (ls - lt - kl_ij) / 0.7 * weights[i, j]
    np.testing.assert_allclose(s.grad.numpy(), want, atol=3e-5, rtol=0)


def test_masked_positions_contribute_nothing_whatever_their_logits():
    student, teacher, mask, weights = inputs(seed=2)
    student[0, 3, 2], teacher[2, 0, 5], teacher[2, 2, 1] = np.nan, np.inf, -np.inf  # padding garbage
    s = paddle.to_tensor(student, stop_gradient=False)
    kl = full_reverse_kl(s, paddle.to_tensor(teacher), paddle.to_tensor(mask))
    got = kl.numpy()
    assert (got[mask == 0] == 0).all() and np.isfinite(got).all()
    np.testing.assert_allclose(got, loop_kl(student, teacher, mask, 1.0), atol=1e-12, rtol=0)
    (kl * paddle.to_tensor(weights)).sum().backward()
    grad = s.grad.numpy()
    assert (grad[mask == 0] == 0).all() and np.isfinite(grad).all()
    assert np.abs(grad[mask == 1]).max() > 1e-2


def test_chunks_of_positions_give_the_same_values_and_gradients():
    student, teacher, mask, weights = inputs(seed=3)
    results = []
    for chunk in (1, 3 * V, 10 ** 6):  # one position, three, everything at once
        s = paddle.to_tensor(student.astype(np.float32), stop_gradient=False)
        kl = full_reverse_kl(s, paddle.to_tensor(teacher.astype(np.float32)), paddle.to_tensor(mask),
                             chunk_elements=chunk)
        (kl * paddle.to_tensor(weights.astype(np.float32))).sum().backward()
        results.append((kl.numpy(), s.grad.numpy()))
    for kl, grad in results[1:]:
        # each position is computed alone, whatever the chunk; only the order in which a row's V = 7 terms are
        # summed may differ with the chunk's shape (vector width): a few float32 ulps of the largest term, atol
        # 8 * 6e-8 * the largest value
        for got, want in ((kl, results[0][0]), (grad, results[0][1])):
            np.testing.assert_allclose(got, want, atol=8 * 6e-8 * np.abs(want).max(), rtol=0)
            assert np.abs(want).max() > 1e-2


def test_bad_shapes_and_temperatures_are_refused():
    x = paddle.zeros([1, 2, V])
    with pytest.raises(ValueError, match="temperature must be > 0"):
        full_reverse_kl(x, x, paddle.ones([1, 2]), 0.0)
    with pytest.raises(ValueError, match="shape mismatch"):
        full_reverse_kl(x, paddle.zeros([1, 2, V + 1]), paddle.ones([1, 2]))
    with pytest.raises(ValueError, match="shape mismatch"):
        full_reverse_kl(x, x, paddle.ones([1, 3]))
    assert OPD_KL_ESTIMATORS == ("sampled", "full")
