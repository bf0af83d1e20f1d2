"""Model helpers shared by every policy (paddle_grpo/policy/base.py), against independent references."""
import numpy as np
import paddle

from paddle_grpo.policy import freeze, mix_into, parameters_by_decay, position_ids_from_mask
from paddle_grpo.policy.causal import load_causal_lm


def test_position_ids_skip_left_padding():
    mask = paddle.to_tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 0, 0, 0, 1]])
    assert position_ids_from_mask(mask).numpy().tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 3, 4], [0, 0, 0, 0, 0]]


def test_frozen_reference_has_no_gradients(tiny_policy_dir):
    ref = load_causal_lm(tiny_policy_dir, trainable=False)
    assert not ref.training and all(p.stop_gradient for p in ref.parameters())


def test_freeze_stops_training_and_gradients_in_place(tiny_policy_dir):
    model = load_causal_lm(tiny_policy_dir)
    assert model.training and not any(p.stop_gradient for p in model.parameters())
    assert freeze(model) is model
    assert not model.training and all(p.stop_gradient for p in model.parameters())
    assert not any(layer.training for layer in model.sublayers())


def test_weight_decay_skips_biases_and_norms(tiny_policy_dir):
    model = load_causal_lm(tiny_policy_dir)
    decay = parameters_by_decay(model)
    names = {p.name: n for n, p in model.named_parameters()}
    assert all("norm" not in names[d] and "bias" not in names[d] for d in decay)
    assert any("q_proj.weight" in names[d] for d in decay)
    assert not any("norm" in n for n in (names[d] for d in decay))
    assert any("norm" in n for n in names.values())


def test_mix_into_is_the_tr_dpo_average(tiny_policy_dir):
    a, b = load_causal_lm(tiny_policy_dir), load_causal_lm(tiny_policy_dir)
    with paddle.no_grad():
        for p in a.parameters():
            p.set_value(p + 1.0)
    before = [p.numpy().copy() for p in b.parameters()]
    mix_into(b, a, 0.25)
    for r, pa, old in zip(b.parameters(), a.parameters(), before):
        # elementwise, 3 roundings of values ~2: 3 u 2 = 3.6e-7
        np.testing.assert_allclose(r.numpy(), 0.25 * pa.numpy() + 0.75 * old, rtol=1e-6, atol=1e-6)
