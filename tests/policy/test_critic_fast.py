"""The critic's values through the lean Qwen2 forward (policy/fast_qwen2.py `enabled_for_backbone`, used by
`Critic.values` for a plain float32 Qwen2 critic) against PaddleNLP's backbone forward (`PADDLE_GRPO_FAST=0`): the
values and every parameter's gradient, on grouped prompts (the lean path computes each shared prompt once).

Tolerances (tests/numerics.py, as tests/policy/test_fast_qwen2.py): the two paths sum in other orders through
`tiny_lm_tol`'s depth (2 layers; the longest sum is the intermediate size 128 of tiny_policy_dir's model), without
the log-softmax term (vocab 0: no LM head); the value is the head's 64-term dot product with the final hidden state,
so the hidden-state bound is scaled by sum|w| of the head plus that dot product's own rounding. Gradients: twice
that (the backward is as deep again), relative to each parameter's largest gradient.
"""
import numpy as np
import paddle
import pytest
from batch_helpers import grouped_batch
from numerics import f32_sum_tol, tiny_lm_tol

from paddle_grpo.policy import fast_qwen2, load_critic

pytestmark = pytest.mark.numerics


def both_paths(monkeypatch, fn):
    monkeypatch.setenv(fast_qwen2.ENV_SWITCH, "1")
    fast = fn()
    monkeypatch.setenv(fast_qwen2.ENV_SWITCH, "0")
    slow = fn()
    monkeypatch.delenv(fast_qwen2.ENV_SWITCH)
    return fast, slow


@pytest.fixture
def critic(tiny_policy_dir):
    critic = load_critic(tiny_policy_dir)  # a causal LM: its backbone and a zero head; give the head values
    with paddle.no_grad():
        critic.head.weight.set_value(paddle.to_tensor(
            np.random.default_rng(0).standard_normal(critic.head.weight.shape).astype("float32") * 0.1))
    return critic


def test_the_lean_path_is_chosen_for_a_plain_qwen2_critic(critic, monkeypatch):
    assert fast_qwen2.enabled_for_backbone(critic.model)
    assert not fast_qwen2.enabled_for(critic.model)  # no LM head: never the policy's path
    monkeypatch.setenv(fast_qwen2.ENV_SWITCH, "0")
    assert not fast_qwen2.enabled_for_backbone(critic.model)


def test_values_and_gradients_match_paddlenlps_backbone(critic, monkeypatch):
    vocab = critic.model.config.vocab_size
    batch = grouped_batch(vocab, P=3, G=4, L=7, T=6)
    mask = batch[3].numpy().astype(bool)
    weights = paddle.to_tensor(np.random.default_rng(1).standard_normal(mask.shape).astype("float32"))
    critic.model.train()

    def run():
        for p in critic.model.parameters():
            p.clear_gradient(False)
        values = critic.values(*batch)
        (values * weights * batch[3].astype("float32")).sum().backward()
        return values.numpy(), {n: p.grad.numpy().copy() for n, p in critic.model.named_parameters()}

    (v_fast, g_fast), (v_slow, g_slow) = both_paths(monkeypatch, run)
    w = float(np.abs(critic.head.weight.numpy()).sum())
    tol = tiny_lm_tol(128, 2, 0) * w + f32_sum_tol(64, w)  # final hidden states ~1 after the final norm
    assert v_fast.shape == mask.shape and np.abs(v_slow[mask]).max() > 0.01  # values are not trivially 0
    np.testing.assert_allclose(v_fast[mask], v_slow[mask], atol=tol)
    assert g_fast.keys() == g_slow.keys() and len(g_slow) == len(list(critic.model.parameters()))
    for name in g_slow:
        scale = np.abs(g_slow[name]).max()
        assert scale > 0, name
        np.testing.assert_allclose(g_fast[name], g_slow[name], atol=2 * tiny_lm_tol(128, 2, 0) * scale, err_msg=name)
