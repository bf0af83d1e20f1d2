"""kernels/mlp.py: the blocked SwiGLU MLP (gu kept or recomputed) against autograd's path; and the lean Qwen2
forward's log-probs and gradients with it on and off.

Tolerances (tests/numerics.py): the blocks run other GEMM shapes, so other kernels. The unit cases multiply N(0, 1)
matrices: h @ w_gu sums K terms of products (sum|terms| ~0.8 K), swiglu, then @ w_down sums K / 2 terms of size ~2:
f32_sum_tol(6, 5) + f32_sum_tol(5, 10) = 9.6e-6 for [13, 6] (atol 1e-5), f32_sum_tol(4, 4) + f32_sum_tol(3, 6) = 4e-6
for [9, 4]. The model-level case runs the tiny Qwen2 below (hidden 32, intermediate 48, 2 layers, vocab 40):
MODEL_TOL, twice for gradients.
"""
import numpy as np
import paddle
import paddle.nn.functional as F
import pytest
from numerics import f32_sum_tol, tiny_lm_tol

from paddle_grpo.kernels import mlp
from paddle_grpo.policy import fast_decoder

pytestmark = pytest.mark.numerics  # compares float results: CI reruns it on other CPU kernels

MODEL_TOL = tiny_lm_tol(48, 2, 40)  # 1.2e-4


def _reference(h, w_gu, w_down):
    return paddle.matmul(F.swiglu(paddle.matmul(h, w_gu)), w_down)


@pytest.mark.parametrize("block", [1, 4, 13, 50])
@pytest.mark.parametrize("keep_gu", [True, False])
@pytest.mark.parametrize("frozen", ["none", "weights", "input"])
def test_blocked_mlp_equals_autograd(block, keep_gu, frozen):
    rng = np.random.default_rng(block)
    arrays = [rng.standard_normal(s).astype("float32") for s in ((13, 6), (6, 10), (5, 6))]
    weights = paddle.to_tensor(rng.standard_normal((13, 6)).astype("float32"))
    results = []
    for fn in (lambda *a: mlp.mlp(*a, block, keep_gu), _reference):
        h, w_gu, w_down = (paddle.to_tensor(a) for a in arrays)
        h.stop_gradient = frozen == "input"
        w_gu.stop_gradient = w_down.stop_gradient = frozen == "weights"
        out = fn(h, w_gu, w_down)
        (out * weights).sum().backward()
        results.append([out.numpy()] + [None if t.grad is None else t.grad.numpy() for t in (h, w_gu, w_down)])
    for got, want in zip(*results):
        assert (got is None) == (want is None)
        if want is not None:
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
            assert np.abs(want).max() > 0.1


def test_plan_by_size():
    assert mlp.mlp_plan(100, 4864) is None                                  # autograd's path
    assert mlp.mlp_plan(8 * 512, 4864) == (mlp.BLOCK_ELEMENTS // 9728, True)  # 8 x 512 tokens: gu kept
    assert mlp.mlp_plan(8 * 2048, 4864) == (431, False)                     # 8 x 2048: gu recomputed


def test_without_gradients_only_the_blocks_run():
    h, w_gu, w_down = paddle.randn([9, 4]), paddle.randn([4, 6]), paddle.randn([3, 4])
    with paddle.no_grad():
        out = mlp.mlp(h, w_gu, w_down, 2, True)
    np.testing.assert_allclose(out.numpy(), _reference(h, w_gu, w_down).numpy(), rtol=1e-5,
                               atol=f32_sum_tol(4, 4) + f32_sum_tol(3, 6))


@pytest.mark.parametrize("keep_gu_above, recompute_above", [(0, 1 << 40), (0, 0)])
def test_lean_forward_gradients_are_unchanged(monkeypatch, keep_gu_above, recompute_above):
    from paddlenlp.transformers import Qwen2Config, Qwen2ForCausalLM

    from paddle_grpo.policy.causal import completion_logprobs

    paddle.seed(3)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=40, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2))
    assert fast_decoder.enabled_for(model)
    rng = np.random.default_rng(1)
    pid, cid = (paddle.to_tensor(rng.integers(3, 40, (3, n))) for n in (4, 6))
    pm, cm = paddle.ones([3, 4], dtype="int64"), paddle.ones([3, 6], dtype="int64")
    calls = []
    real = mlp._MLP.apply
    monkeypatch.setattr(mlp._MLP, "apply", staticmethod(lambda *a: calls.append(a[-1]) or real(*a)))

    def run():
        model.clear_gradients()
        lp, _ = completion_logprobs(model, pid, pm, cid, cm)
        lp.sum().backward()
        return lp.numpy(), {n: p.grad.numpy().copy() for n, p in model.named_parameters() if p.grad is not None}

    lp_ref, g_ref = run()
    assert calls == []                                   # tiny: autograd's path
    monkeypatch.setattr(mlp, "KEEP_GU_ABOVE", keep_gu_above)
    monkeypatch.setattr(mlp, "RECOMPUTE_GU_ABOVE", recompute_above)
    monkeypatch.setattr(mlp, "BLOCK_ELEMENTS", 200)      # blocks of 2 rows
    lp, g = run()
    assert calls == [recompute_above > 0] * 2            # one per layer, keeping gu or not
    np.testing.assert_allclose(lp, lp_ref, rtol=1e-6, atol=MODEL_TOL)
    assert set(g) == set(g_ref)
    for name in g_ref:
        np.testing.assert_allclose(g[name], g_ref[name], rtol=1e-5, atol=2 * MODEL_TOL, err_msg=name)
