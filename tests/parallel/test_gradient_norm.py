"""parallel/gradients.global_grad_norm in one process: large gradients through numpy's dot product on CPU, small ones
through paddle's ops, against a float64 numpy reference."""
import numpy as np
import paddle
import pytest

from paddle_grpo.parallel import gradients

pytestmark = pytest.mark.numerics  # compares float results: CI reruns it on other CPU kernels


def _params(sizes, seed=0):
    rng = np.random.default_rng(seed)
    params = []
    for n in sizes:
        p = paddle.create_parameter([n], dtype="float32")
        p.grad = paddle.to_tensor(rng.standard_normal(n).astype(np.float32) * rng.uniform(0.1, 3))
        params.append(p)
    return params


@pytest.mark.parametrize("flag", ["1", "0"])
def test_global_norm_of_large_and_small_gradients(monkeypatch, flag):
    monkeypatch.setenv("PADDLE_GRPO_NUMPY_KERNELS", flag)
    params = _params([gradients.NUMPY_NORM_FROM + 7, 100, 3 * gradients.NUMPY_NORM_FROM, 1])
    want = np.sqrt(sum((p.grad.numpy().astype(np.float64) ** 2).sum() for p in params))
    # sums of squares (positive terms) of up to 3 * 2^20 elements: numpy sums pairwise, (log2 n + 1) u = 1.3e-6
    # relative at worst, halved by the square root; paddle's (flag 0) is Eigen's blocked tree reduction, compiled in
    # and the same on any x86 CPU (MKL does not run here)
    assert gradients.global_grad_norm(params, None, None) == pytest.approx(want, rel=1e-6)


def test_small_gradients_keep_paddles_float32_sum(monkeypatch):
    """Below NUMPY_NORM_FROM the norm is bit for bit what paddle's add_n of sum(square(g)) gives (the quickstart's
    documented numbers), and no numpy dot runs."""
    params = _params([1000, 37, 5])
    calls = []
    real_dot = np.dot
    monkeypatch.setattr(gradients.np, "dot", lambda *a: calls.append(1) or real_dot(*a))
    norm = gradients.global_grad_norm(params, None, None)
    expected = float(paddle.add_n([paddle.sum(paddle.square(p.grad)) for p in params]))
    assert norm == float(np.sqrt(expected)) and calls == []
