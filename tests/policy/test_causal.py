"""Causal policies (paddle_grpo/policy/causal.py): loading and completion log-probs, against independent references."""
import numpy as np
import paddle
import pytest
from numerics import tiny_lm_tol

from paddle_grpo.policy import load_tokenizer
from paddle_grpo.policy.causal import completion_logprobs, load_causal_lm

pytestmark = pytest.mark.numerics  # compares float results: CI reruns it on other CPU kernels

LP_TOL = tiny_lm_tol(128, 2, 320)  # 3.4e-4: conftest's tiny policy


def test_completion_logprobs_equal_unpadded_full_forward(tiny_policy_dir):
    """Each row separately, without padding, through the ordinary forward; numpy log-softmax at temperature."""
    model, tok = load_causal_lm(tiny_policy_dir), load_tokenizer(tiny_policy_dir)
    model.eval()
    rng = np.random.default_rng(0)
    V = len(tok)
    prompts = [rng.integers(3, V, size=n).tolist() for n in (5, 9, 2)]
    completions = [rng.integers(3, V, size=n).tolist() for n in (4, 1, 6)]
    L, T = max(map(len, prompts)), max(map(len, completions))
    pid = np.array([[0] * (L - len(p)) + p for p in prompts])
    pm = np.array([[0] * (L - len(p)) + [1] * len(p) for p in prompts])
    cid = np.array([c + [0] * (T - len(c)) for c in completions])
    cm = np.array([[1] * len(c) + [0] * (T - len(c)) for c in completions])
    temp = 0.7
    with paddle.no_grad():
        lp, ent = completion_logprobs(model, paddle.to_tensor(pid), paddle.to_tensor(pm), paddle.to_tensor(cid),
                                      paddle.to_tensor(cm), temperature=temp, with_entropy=True)
    for i, (p, c) in enumerate(zip(prompts, completions)):
        with paddle.no_grad():
            logits = model(paddle.to_tensor([p + c]), return_dict=True).logits[0].numpy().astype(np.float64)
        z = logits[len(p) - 1:len(p) + len(c) - 1] / temp
        logsm = z - z.max(-1, keepdims=True) - np.log(np.exp(z - z.max(-1, keepdims=True)).sum(-1, keepdims=True))
        expected = logsm[np.arange(len(c)), c]
        # batched, padded completion_logprobs against one unpadded forward per row: other GEMM shapes and paths,
        # so within tests/numerics.py's bound for the tiny policy (hidden 64, intermediate 128, vocab 320)
        np.testing.assert_allclose(lp.numpy()[i, :len(c)], expected, atol=LP_TOL)
        probs = np.exp(logsm)
        np.testing.assert_allclose(ent.numpy()[i, :len(c)], -(probs * logsm).sum(-1), atol=LP_TOL)


def test_load_refuses_a_missing_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="actor_model_name_or_path: '.*nope' is not a local model directory"):
        load_causal_lm(str(tmp_path / "nope"))


def test_detached_entropy_equals_entropy_without_a_graph(tiny_policy_dir):
    model = load_causal_lm(tiny_policy_dir)
    model.train()
    ids = paddle.to_tensor(np.random.default_rng(0).integers(3, 100, size=(4, 9)))
    mask = paddle.ones([4, 9], dtype="int64")
    args = (ids[:, :5], mask[:, :5], ids[:, 5:], mask[:, 5:])
    lp, ent = completion_logprobs(model, *args, temperature=0.8, with_entropy=True)
    lp_d, ent_d = completion_logprobs(model, *args, temperature=0.8, with_entropy="detached")
    assert not ent.stop_gradient and ent_d.stop_gradient and not lp_d.stop_gradient
    # the same kernels on the same inputs in one process (only autograd's recording differs): rounding-free in
    # practice; 1e-6 leaves room for ~16 roundings of entropies of size ~5
    np.testing.assert_allclose(ent_d.numpy(), ent.numpy(), rtol=1e-6, atol=1e-6)
