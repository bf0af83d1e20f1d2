"""rollout.single_turn._exp_and_logsumexp: the numpy kernels (CPU, vocabularies of at least NUMPY_FROM_VOCAB)
against the paddle ops and a float64 reference.

Tolerances: logsumexp over 4,099 positive terms exp(z - m) <= 1: numpy sums pairwise ((log2 n + 1) u = 8e-7 relative,
absolute in the log); paddle's reduction is Eigen's blocked tree, compiled in and so the same on any x86 CPU (MKL does
not run here), measured within 2e-7: atol 1e-5 plus rtol 1e-6 of lse ~20. exp(z - m) is elementwise: the shift is
exact or one rounding of |z - m| <= 40 (40 u = 2.4e-6 relative in e), exp itself a few ulp: rtol 1e-5."""
import numpy as np
import paddle
import pytest

from paddle_grpo.rollout import single_turn as rollout

pytestmark = pytest.mark.numerics  # compares float results: CI reruns it on other CPU kernels


@pytest.mark.parametrize("rows, threads", [(1, "2"), (8, "2"), (7, "3"), (8, "1")])
def test_numpy_and_paddle_decode_statistics_agree(monkeypatch, rows, threads):
    monkeypatch.setenv("OMP_NUM_THREADS", threads)
    rng = np.random.default_rng(rows)
    z = (rng.standard_normal((rows, rollout.NUMPY_FROM_VOCAB + 3)) * 5).astype(np.float32)
    z64 = z.astype(np.float64)
    m = z64.max(axis=1, keepdims=True)
    want_lse = (m + np.log(np.exp(z64 - m).sum(axis=1, keepdims=True)))[:, 0]
    results = {}
    for flag in ("1", "0"):
        monkeypatch.setenv("PADDLE_GRPO_NUMPY_KERNELS", flag)
        tensor = paddle.to_tensor(z)
        e, lse = rollout._exp_and_logsumexp(tensor)
        np.testing.assert_array_equal(tensor.numpy(), z)                 # the logits are not changed
        np.testing.assert_allclose(lse.numpy(), want_lse, rtol=1e-6, atol=1e-5)
        np.testing.assert_allclose(e.numpy(), np.exp(z64 - m), rtol=1e-5, atol=1e-7)
        results[flag] = e.numpy()
    np.testing.assert_allclose(results["1"], results["0"], rtol=1e-5, atol=1e-7)


def test_small_vocabularies_keep_the_paddle_ops(monkeypatch):
    """Below NUMPY_FROM_VOCAB the numpy kernels are not used (the tiny models' samples stay as they were)."""
    from paddle_grpo.kernels import numpy_kernels

    used = []
    monkeypatch.setattr(numpy_kernels, "parallel_ranges", lambda *a: used.append(1))
    rollout._exp_and_logsumexp(paddle.randn([4, 128]))
    assert used == []
    rollout._exp_and_logsumexp(paddle.randn([2, rollout.NUMPY_FROM_VOCAB]))  # the stub fills nothing: count only
    assert used == [1]
