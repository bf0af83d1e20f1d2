"""kernels/chunk_kernels.py (with kernels/numpy_kernels.py): the numpy (CPU) and paddle-op kernels of the chunked
head against a float64 numpy reference written from the formulas, for row counts that do and do not fill the
threads' row groups.

Tolerances (tests/numerics.py): the statistics of a row of 301 logits ~N(0, 4): the max is exact, the logsumexp is the
log of a sum of 301 positive terms (relative error <= 301 u = 1.8e-5, absolute in the log: atol 2e-5), the mean
sum p (z - m) a sum of 301 terms of one sign (relative error <= 301 u: STAT_RTOL). The logits' gradient is elementwise
in p = exp(z - lse), whose relative error is lse's absolute one (1.8e-5) plus a few roundings: rtol 1e-4. The weight
gradient adds 6 products h * dz (sum of |terms| ~6) to its start: f32_sum_tol(6, 6) = 4.3e-6, atol 1e-5.
"""
import numpy as np
import paddle
import pytest
from numerics import f32_sum_tol

from paddle_grpo.kernels import numpy_kernels
from paddle_grpo.kernels.chunk_kernels import chunk_gradient, shifted_statistics

pytestmark = pytest.mark.numerics  # compares float results: CI reruns it on other CPU kernels


STAT_RTOL = f32_sum_tol(301, 1.0)  # 3.6e-5 (two evaluations' bound; each is within half of it of the exact value)


def _reference_statistics(z: np.ndarray, labels: np.ndarray):
    z = z.astype(np.float64)
    m = z.max(axis=1)
    lse = np.log(np.exp(z - m[:, None]).sum(axis=1)) + m
    p = np.exp(z - lse[:, None])
    rows = np.arange(len(labels))
    return m, z[rows, labels] - m, lse - m, (p * z).sum(axis=1) - m


def _reference_gradient(z, labels, a, b, weight, temperature):
    z = z.astype(np.float64)
    lse = np.log(np.exp(z - z.max(axis=1, keepdims=True)).sum(axis=1)) + z.max(axis=1)
    logp = z - lse[:, None]
    p = np.exp(logp)
    ent = -(p * logp).sum(axis=1)
    onehot = np.zeros_like(z)
    onehot[np.arange(len(labels)), labels] = 1.0
    coeff = a[:, None] + (0.0 if b is None else b[:, None] * (logp + ent[:, None]))
    return (a[:, None] * weight[:, None] * onehot - p * coeff) / temperature, lse, ent


@pytest.fixture(params=["numpy", "paddle"])
def kernels(request, monkeypatch):
    monkeypatch.setenv("PADDLE_GRPO_NUMPY_KERNELS", "1" if request.param == "numpy" else "0")
    return request.param


@pytest.mark.parametrize("rows", [1, 7, 8, 13, 33])
@pytest.mark.parametrize("threads", ["1", "2", "3"])
@pytest.mark.parametrize("with_entropy", [True, False])
def test_statistics_match_float64(kernels, monkeypatch, rows, threads, with_entropy):
    monkeypatch.setenv("OMP_NUM_THREADS", threads)
    rng = np.random.default_rng(rows)
    z = (rng.standard_normal((rows, 301)) * 4).astype(np.float32)
    labels = rng.integers(0, 301, rows)
    tensor = paddle.to_tensor(z)
    assert numpy_kernels.enabled(tensor) == (kernels == "numpy")
    got = shifted_statistics(tensor, paddle.to_tensor(labels), with_entropy)
    want = _reference_statistics(z, labels)
    for name, g, w in zip(("max", "picked", "logsumexp", "mean"), got, want):
        if name == "mean" and not with_entropy:
            assert g is None
            continue
        np.testing.assert_allclose(g.numpy(), w, rtol=STAT_RTOL, atol=2e-5, err_msg=name)


@pytest.mark.parametrize("rows", [1, 9, 16, 21])
@pytest.mark.parametrize("with_entropy_grad", [True, False])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_gradient_matches_float64(kernels, monkeypatch, rows, with_entropy_grad, temperature):
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    rng = np.random.default_rng(100 + rows)
    z = (rng.standard_normal((rows, 257)) * 3).astype(np.float32)
    labels = rng.integers(0, 257, rows)
    a = rng.standard_normal(rows).astype(np.float32)
    b = rng.standard_normal(rows).astype(np.float32) if with_entropy_grad else None
    weight = (rng.random(rows) > 0.3).astype(np.float32)                # the vocab-parallel one-hot weight
    want, lse, ent = _reference_gradient(z, labels, a, b, weight, temperature)
    got = chunk_gradient(paddle.to_tensor(z), paddle.to_tensor(labels), paddle.to_tensor(lse.astype(np.float32)),
                         paddle.to_tensor(ent.astype(np.float32)), paddle.to_tensor(a),
                         None if b is None else paddle.to_tensor(b), paddle.to_tensor(weight), temperature)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-6)


def test_numpy_kernels_write_into_the_tensor_they_are_given(monkeypatch):
    """The gradient is built in the logits' own memory (no [c, V] copy): the returned tensor is the input."""
    monkeypatch.setenv("PADDLE_GRPO_NUMPY_KERNELS", "1")
    z = paddle.to_tensor(np.ones((3, 5), np.float32))
    # logits all 1 over 5 entries: logsumexp = 1 + log 5, p = 0.2, entropy log 5; dL/dlogits = onehot - p.
    out = chunk_gradient(z, paddle.to_tensor(np.array([0, 1, 4])), paddle.full([3], 1.0 + np.log(5.0)),
                         paddle.full([3], np.log(5.0)), paddle.ones([3]), None, None, 1.0)
    assert out.data_ptr() == z.data_ptr()
    np.testing.assert_allclose(z.numpy(), [[0.8, -0.2, -0.2, -0.2, -0.2], [-0.2, 0.8, -0.2, -0.2, -0.2],
                                           [-0.2, -0.2, -0.2, -0.2, 0.8]], rtol=1e-5)


def test_kernel_choice(monkeypatch):
    """numpy only for contiguous float32 CPU tensors, and not with PADDLE_GRPO_NUMPY_KERNELS=0."""
    monkeypatch.delenv("PADDLE_GRPO_NUMPY_KERNELS", raising=False)
    assert numpy_kernels.enabled(paddle.zeros([2, 3], dtype="float32"))
    assert not numpy_kernels.enabled(paddle.zeros([2, 3], dtype="float64"))
    monkeypatch.setenv("PADDLE_GRPO_NUMPY_KERNELS", "0")
    assert not numpy_kernels.enabled(paddle.zeros([2, 3], dtype="float32"))
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert numpy_kernels.threads() == 3


@pytest.mark.parametrize("transpose_y", [False, True])
def test_weight_gradient_accumulates_in_place(kernels, monkeypatch, transpose_y):
    """dw += h^T dz (or dz^T h) over vocabulary blocks that do not divide V, into the same tensor."""
    from paddle_grpo.kernels import chunk_kernels

    monkeypatch.setattr(chunk_kernels, "_VOCAB_BLOCK", 7)
    rng = np.random.default_rng(5)
    h, dz = rng.standard_normal((6, 4)).astype(np.float32), rng.standard_normal((6, 31)).astype(np.float32)
    start = rng.standard_normal((31, 4) if transpose_y else (4, 31)).astype(np.float32)
    dw = paddle.to_tensor(start)
    ptr = dw.data_ptr()
    chunk_kernels.accumulate_weight_gradient(dw, paddle.to_tensor(h), paddle.to_tensor(dz), transpose_y)
    product = h.astype(np.float64).T @ dz
    want = start + (product.T if transpose_y else product)
    np.testing.assert_allclose(dw.numpy(), want, rtol=1e-5, atol=1e-5)
    assert dw.data_ptr() == ptr
