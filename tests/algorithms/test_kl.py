"""KL estimators k1/k2/k3 against a per-element python reference (docs/algorithms.md section 3).

Tolerances: rtol=1e-5, atol=1e-6 (float32 against a float64 reference): each estimator is elementwise, at most
4 roundings (difference, exp, subtraction, clamp) of log-probs of size ~5, so 4 u = 2.4e-7 relative and
4 u 5 = 1.2e-6 absolute where exp(ref - lp) ~ 1 cancels; no sums. Float64 gradients: rtol=1e-9 (a few float64
roundings, u64 = 1.1e-16). Elementwise kernels are paddle's own, the same on any x86 CPU (tests/numerics.py).
"""
import math

import numpy as np
import paddle
import pytest

from paddle_grpo.algorithms import KL_ESTIMATORS, UnknownNameError, kl_penalty

pytestmark = pytest.mark.numerics  # compares float results: CI reruns it on other CPU kernels


def ref_kl(logprob, ref_logprob, estimator):
    out = np.zeros(logprob.shape)
    for idx in np.ndindex(*logprob.shape):
        d = min(max(float(ref_logprob[idx]) - float(logprob[idx]), -20.0), 20.0)
        k = {"k1": -d, "k2": 0.5 * d * d, "k3": math.exp(d) - d - 1.0}[estimator]
        out[idx] = min(max(k, -10.0), 10.0)
    return out


def ref_grad(logprob, ref_logprob, estimator):
    """d k / d logprob; 0 where either clamp is active."""
    out = np.zeros(logprob.shape)
    for idx in np.ndindex(*logprob.shape):
        d = float(ref_logprob[idx]) - float(logprob[idx])
        k = {"k1": -d, "k2": 0.5 * d * d, "k3": math.exp(min(max(d, -20), 20)) - d - 1.0}[estimator]
        if abs(d) >= 20 or abs(k) >= 10:
            continue
        dk_dd = {"k1": -1.0, "k2": d, "k3": math.exp(d) - 1.0}[estimator]
        out[idx] = -dk_dd
    return out


def random_logprobs(seed, shape):
    rng = np.random.default_rng(seed)
    lp = rng.normal(-2.0, 1.0, size=shape)
    ref = lp + rng.normal(0.0, 1.5, size=shape)
    return lp.astype(np.float32), ref.astype(np.float32)


@pytest.mark.parametrize("estimator", KL_ESTIMATORS)
@pytest.mark.parametrize("seed,shape", [(0, (3, 5)), (1, (4, 7)), (2, (1, 9))])
def test_matches_reference(estimator, seed, shape):
    lp, ref = random_logprobs(seed, shape)
    out = kl_penalty(paddle.to_tensor(lp), paddle.to_tensor(ref), estimator)
    assert out.dtype == paddle.float32 and list(out.shape) == list(shape)
    np.testing.assert_allclose(out.numpy(), ref_kl(lp, ref, estimator), rtol=1e-5, atol=1e-6)


def test_default_is_k3_and_k3_is_nonnegative():
    lp, ref = random_logprobs(3, (4, 6))
    out = kl_penalty(paddle.to_tensor(lp), paddle.to_tensor(ref))
    np.testing.assert_allclose(out.numpy(), ref_kl(lp, ref, "k3"), rtol=1e-5, atol=1e-6)
    assert (out.numpy() >= 0).all()


@pytest.mark.parametrize("estimator", KL_ESTIMATORS)
def test_extreme_differences_are_clamped(estimator):
    lp = np.array([[0.0, 0.0, 0.0, -1000.0, 0.0, -np.inf, 0.0]], dtype=np.float32)
    ref = np.array([[1000.0, -1000.0, 25.0, 0.0, -3.0, 0.0, -np.inf]], dtype=np.float32)
    out = kl_penalty(paddle.to_tensor(lp), paddle.to_tensor(ref), estimator).numpy()
    assert np.isfinite(out).all()  # d = +-inf: exp(inf) - inf would be NaN without the clamp on d
    np.testing.assert_allclose(out, ref_kl(lp, ref, estimator), rtol=1e-5, atol=1e-6)
    assert out.max() <= 10.0 and out.min() >= -10.0


@pytest.mark.parametrize("estimator", KL_ESTIMATORS)
def test_gradient_wrt_logprob(estimator):
    lp, ref = random_logprobs(4, (3, 4))
    lp[0, 0], ref[0, 0] = 0.0, 30.0  # clamped: zero gradient
    lp[1, 1], ref[1, 1] = -5.0, -5.5  # small difference: active
    lp64, ref64 = lp.astype(np.float64), ref.astype(np.float64)
    x = paddle.to_tensor(lp64, stop_gradient=False)
    out = kl_penalty(x, paddle.to_tensor(ref64), estimator)
    assert out.dtype == paddle.float64  # float64 is never demoted
    out.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), ref_grad(lp64, ref64, estimator), rtol=1e-9, atol=1e-12)
    assert x.grad.numpy()[0, 0] == 0.0


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_low_precision_input_gives_float32(dtype):
    lp = paddle.to_tensor([[-1.0, -2.5]]).astype(dtype)
    ref = paddle.to_tensor([[-1.5, -0.5]]).astype(dtype)
    out = kl_penalty(lp, ref, "k3")
    assert out.dtype == paddle.float32
    np.testing.assert_allclose(out.numpy(), ref_kl(np.array([[-1.0, -2.5]]), np.array([[-1.5, -0.5]]), "k3"),
                               rtol=1e-6)


def test_unknown_estimator_lists_valid_names():
    with pytest.raises(UnknownNameError) as info:
        kl_penalty(paddle.zeros([1, 1]), paddle.zeros([1, 1]), "low_var_kl")
    for name in KL_ESTIMATORS:
        assert name in str(info.value)
