"""policy/mlp.py: swiglu(gu) @ w_down with the activation recomputed in backward, against autograd's path; and the
lean Qwen2 forward's gradients with it on and off."""
import numpy as np
import paddle
import paddle.nn.functional as F
import pytest

from paddle_grpo.policy import fast_qwen2, mlp


@pytest.mark.parametrize("frozen_weight", [False, True])
def test_swiglu_down_equals_autograd(frozen_weight):
    rng = np.random.default_rng(0)
    gu_np, w_np = rng.standard_normal((13, 10)).astype("float32"), rng.standard_normal((5, 3)).astype("float32")
    weights = paddle.to_tensor(rng.standard_normal((13, 3)).astype("float32"))
    results = []
    for fn in (mlp.swiglu_down, lambda gu, w: paddle.matmul(F.swiglu(gu), w)):
        gu = paddle.to_tensor(gu_np, stop_gradient=False)
        w = paddle.to_tensor(w_np, stop_gradient=frozen_weight)
        out = fn(gu, w)
        (out * weights).sum().backward()
        results.append((out.numpy(), gu.grad.numpy(), None if frozen_weight else w.grad.numpy()))
    (out, dgu, dw), (ref_out, ref_dgu, ref_dw) = results
    np.testing.assert_allclose(out, ref_out, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(dgu, ref_dgu, rtol=1e-5, atol=1e-6)
    assert np.abs(ref_dgu).max() > 0.1
    if not frozen_weight:
        np.testing.assert_allclose(dw, ref_dw, rtol=1e-5, atol=1e-6)


def test_lean_forward_gradients_are_unchanged_by_the_recomputed_activation(monkeypatch):
    from paddlenlp.transformers import Qwen2Config, Qwen2ForCausalLM

    from paddle_grpo.policy.causal import completion_logprobs

    paddle.seed(3)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=40, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2))
    assert fast_qwen2.enabled_for(model)
    rng = np.random.default_rng(1)
    pid, cid = (paddle.to_tensor(rng.integers(3, 40, (3, n))) for n in (4, 6))
    pm, cm = paddle.ones([3, 4], dtype="int64"), paddle.ones([3, 6], dtype="int64")
    calls = []
    real = mlp._SwigluDown.apply
    monkeypatch.setattr(mlp._SwigluDown, "apply", staticmethod(lambda *a: calls.append(1) or real(*a)))

    def run():
        model.clear_gradients()
        lp, _ = completion_logprobs(model, pid, pm, cid, cm)
        lp.sum().backward()
        return lp.numpy(), {n: p.grad.numpy().copy() for n, p in model.named_parameters() if p.grad is not None}

    lp_ref, g_ref = run()
    assert calls == []                                   # tiny: autograd's path
    monkeypatch.setattr(fast_qwen2, "SAVE_ACTIVATION_ABOVE", 0)
    lp, g = run()
    assert len(calls) == 2                               # one per layer
    np.testing.assert_allclose(lp, lp_ref, rtol=1e-6, atol=1e-6)
    assert set(g) == set(g_ref)
    for name in g_ref:
        np.testing.assert_allclose(g[name], g_ref[name], rtol=1e-5, atol=1e-6, err_msg=name)
