"""Activation recompute (`recompute`, `recompute_granularity`, `recompute_use_reentrant`) on both forward paths.

Each case loads the same tiny Qwen2 twice with `load_causal_lm` (without and with recompute) and compares the loss
and every parameter gradient of one update-like backward (log-probs and entropy of grouped completions with ragged
lengths), on the lean path (fast_decoder.py) and on PaddleNLP's forward (PADDLE_GRPO_FAST=0). Recompute reruns the
same float32 ops on the same inputs, so the numbers are expected bitwise equal; the assertion allows float32
rounding (rtol 1e-6) so that a kernel choosing another summation order would not fail it. That recompute happened
is checked by counting calls of the recomputed pieces: each runs once in forward and once more in backward.
"""
import functools
from collections import Counter

import numpy as np
import paddle
import pytest
from batch_helpers import grouped_batch
from paddlenlp.transformers.qwen2 import modeling as qwen2_modeling

from paddle_grpo.parallel.recompute import checkpoint, needs_grad
from paddle_grpo.policy import fast_decoder
from paddle_grpo.policy import lora as L
from paddle_grpo.policy.causal import completion_logprobs, load_causal_lm

pytestmark = pytest.mark.numerics  # compares float results: CI reruns it on other CPU kernels

GRANULARITIES = ("full", "full_attn", "core_attn")


def loss_and_grads(model, batch):
    """An update-like loss (token log-probs weighted by a fixed advantage, plus an entropy bonus) and the gradient
    of every parameter that gets one."""
    model.train()
    lp, ent = completion_logprobs(model, *batch, with_entropy=True)
    mask = batch[3].astype("float32")
    adv = paddle.to_tensor(np.linspace(-1.0, 1.0, mask.shape[0]).astype("float32"))[:, None]
    loss = -(lp * adv * mask).sum() / mask.sum() - 0.01 * (ent * mask).sum() / mask.sum()
    loss.backward()
    return float(loss), {n: p.grad.numpy() for n, p in model.named_parameters() if p.grad is not None}


def counting(counts, key, fn):
    @functools.wraps(fn)  # keeps the signature: the re-entrant recompute binds arguments by it
    def wrapper(*args, **kwargs):
        counts[key] += 1
        return fn(*args, **kwargs)
    return wrapper


def count_pieces(monkeypatch, model, counts):
    """Count calls of the pieces each granularity recomputes, on the lean path and in PaddleNLP's layers."""
    for name in ("qkv", "attend", "mlp_block"):
        monkeypatch.setattr(fast_decoder.FastDecoder, name,
                            counting(counts, name, getattr(fast_decoder.FastDecoder, name)))
    for cls, key in ((qwen2_modeling.Qwen2DecoderLayer, "layer"), (qwen2_modeling.Qwen2Attention, "attention"),
                     (qwen2_modeling.Qwen2MLP, "mlp")):
        monkeypatch.setattr(cls, "forward", counting(counts, key, cls.forward))
    for layer in model.qwen2.layers:
        layer.self_attn.attn_func = counting(counts, "core", layer.self_attn.attn_func)


# How many times more often each piece runs with recompute than without (forward + rerun in backward).
FAST_RATIOS = {"full": dict(qkv=2, attend=2, mlp_block=2), "full_attn": dict(qkv=2, attend=2, mlp_block=1),
               "core_attn": dict(qkv=1, attend=2, mlp_block=1)}
PADDLENLP_RATIOS = {"full": dict(layer=2, attention=2, core=2, mlp=2),
                    "full_attn": dict(layer=1, attention=2, core=2, mlp=1),
                    "core_attn": dict(layer=1, attention=1, core=2, mlp=1)}


def assert_same(reference, result):
    (loss0, grads0), (loss1, grads1) = reference, result
    assert loss1 == pytest.approx(loss0, rel=1e-6)
    assert grads0.keys() == grads1.keys() and len(grads0) > 10
    for name in grads0:
        np.testing.assert_allclose(grads1[name], grads0[name], rtol=1e-6, atol=1e-9, err_msg=name)


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "paddlenlp"])
@pytest.mark.parametrize("granularity", GRANULARITIES)
@pytest.mark.parametrize("reentrant", [True, False], ids=["reentrant", "non_reentrant"])
def test_gradients_unchanged_and_recompute_happens(monkeypatch, tiny_policy_dir, fast, granularity, reentrant):
    monkeypatch.setenv(fast_decoder.ENV_SWITCH, "1" if fast else "0")
    plain = load_causal_lm(tiny_policy_dir)
    batch = grouped_batch(plain.config.vocab_size, P=2, G=3, L=6, T=7)
    counts0, counts1 = Counter(), Counter()
    with monkeypatch.context() as m:
        count_pieces(m, plain, counts0)
        reference = loss_and_grads(plain, batch)
    model = load_causal_lm(tiny_policy_dir, recompute=True, recompute_granularity=granularity,
                           recompute_use_reentrant=reentrant)
    assert fast_decoder.enabled_for(model) == fast  # recompute no longer switches the lean path off
    assert (model.config.recompute_granularity, model.config.recompute_use_reentrant) == (granularity, reentrant)
    with monkeypatch.context() as m:
        count_pieces(m, model, counts1)
        result = loss_and_grads(model, batch)
    assert_same(reference, result)
    ratios = (FAST_RATIOS if fast else PADDLENLP_RATIOS)[granularity]
    assert {k: counts1[k] / counts0[k] for k in ratios} == ratios
    assert min(counts0[k] for k in ratios) >= plain.config.num_hidden_layers


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "paddlenlp"])
def test_no_recompute_without_gradients(monkeypatch, tiny_policy_dir, fast):
    """Old/reference log-probs run under no_grad: nothing is recomputed (and nothing to rerun in a backward)."""
    monkeypatch.setenv(fast_decoder.ENV_SWITCH, "1" if fast else "0")
    model = load_causal_lm(tiny_policy_dir, recompute=True)
    batch = grouped_batch(model.config.vocab_size, P=2, G=3, L=6, T=7)
    calls = []
    for module in (fast_decoder, qwen2_modeling):  # would break the forward if called
        monkeypatch.setattr(module, "checkpoint" if module is fast_decoder else "recompute",
                            lambda *a, **k: calls.append(1))
    with paddle.no_grad():
        completion_logprobs(model, *batch)
    assert not calls


def test_frozen_models_get_no_recompute_settings(tiny_policy_dir):
    """The reference / rollout-only models are loaded frozen: recompute and its settings stay PaddleNLP's defaults."""
    frozen = load_causal_lm(tiny_policy_dir, trainable=False, recompute=True, recompute_granularity="core_attn",
                            recompute_use_reentrant=False)
    assert not frozen.config.recompute and not frozen.qwen2.enable_recompute
    assert frozen.config.recompute_granularity == "full" and fast_decoder.recompute_granularity(frozen) is None
    with pytest.raises(ValueError, match="recompute_granularity"):
        load_causal_lm(tiny_policy_dir, recompute=True, recompute_granularity="attn")


def test_no_recompute_layers_are_honoured(monkeypatch, tiny_policy_dir):
    """PaddleNLP's `no_recompute_layers` keeps listed layers' activations; the lean path does the same."""
    monkeypatch.setenv(fast_decoder.ENV_SWITCH, "1")
    model = load_causal_lm(tiny_policy_dir, recompute=True, config_overrides={"no_recompute_layers": [0]})
    batch = grouped_batch(model.config.vocab_size, P=2, G=3, L=6, T=7)
    counts = Counter()
    count_pieces(monkeypatch, model, counts)
    loss_and_grads(model, batch)
    n = model.config.num_hidden_layers
    assert counts["mlp_block"] == n + (n - 1)


@pytest.mark.parametrize("granularity", GRANULARITIES)
def test_lora_adapter_gradients_unchanged(monkeypatch, tiny_policy_dir, granularity):
    """LoRA (PaddleNLP's forward: the wrapper is not the lean path's model) with recompute: the adapters' gradients
    equal those without recompute, and the first layer is recomputed too (lora.py makes the frozen embedding's
    output require a gradient, else PaddleNLP would skip recomputing it)."""
    batch = None
    results, counts = [], []
    for recompute in (False, True):
        paddle.seed(0)
        model = L.apply_lora(load_causal_lm(tiny_policy_dir, recompute=recompute, recompute_granularity=granularity),
                             rank=4, alpha=8, dropout=0.0, target_modules=[".*q_proj", ".*v_proj", ".*down_proj"])
        with paddle.no_grad():  # non-zero B matrices, so that every adapter gets a gradient through the others
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.set_value(paddle.randn(p.shape) * 0.1)
        batch = batch or grouped_batch(model.config.vocab_size, P=2, G=3, L=6, T=7)
        counted = Counter()
        with monkeypatch.context() as m:
            count_pieces(m, model.model, counted)
            results.append(loss_and_grads(model, batch))
        counts.append(counted)
    assert_same(*results)
    assert all("lora" in name for name in results[0][1])
    key = {"full": "layer", "full_attn": "attention", "core_attn": "core"}[granularity]
    assert counts[1][key] == 2 * counts[0][key] > 0  # every layer, the first included


def test_checkpoint_wrapper_matches_plain_call():
    """parallel/recompute.checkpoint: same value and gradients as calling the function, for tensors passed as
    arguments (weights included), in both implementations; `needs_grad` follows paddle's grad mode."""
    rng = np.random.default_rng(1)
    x0, w0 = rng.standard_normal((5, 4)).astype("float32"), rng.standard_normal((4, 3)).astype("float32")

    def fn(x, w):
        return paddle.tanh(paddle.matmul(x, w)) * x[:, :3]

    results = []
    for how in ("plain", True, False):
        x, w = paddle.to_tensor(x0, stop_gradient=False), paddle.to_tensor(w0, stop_gradient=False)
        out = fn(x, w) if how == "plain" else checkpoint(fn, x, w, use_reentrant=how)
        (out * out).sum().backward()
        results.append((out.numpy(), x.grad.numpy(), w.grad.numpy()))
    for other in results[1:]:
        for a, b in zip(results[0], other):
            np.testing.assert_allclose(b, a, rtol=1e-6)
    x = paddle.to_tensor(x0, stop_gradient=False)
    assert needs_grad(x, 3) and not needs_grad(paddle.to_tensor(x0), None)
    with paddle.no_grad():
        assert not needs_grad(x)


def test_load_policy_passes_the_settings_through(tiny_policy_dir):
    """trainer.py -> load_policy -> Policy.load -> load_causal_lm: the config keys reach the model."""
    from paddle_grpo.policy.load import load_policy

    policy = load_policy(tiny_policy_dir, recompute=True, recompute_granularity="full_attn",
                         recompute_use_reentrant=False)
    c = policy.model.config
    assert (c.recompute, c.recompute_granularity, c.recompute_use_reentrant) == (True, "full_attn", False)
    assert all(layer.enable_recompute for layer in policy.model.qwen2.layers)
    assert fast_decoder.recompute_granularity(policy.model) == "full_attn"
