"""Rotary parameters as transformers 4 and 5 write them (policy/rope.py), without transformers itself.

The models have sharp attention (q/k weights of std 1): with the usual 0.02 their logits hardly depend on positions
and a wrong theta or scaling would pass unseen (shared/PLATFORM.md, "Random test models hide rope"). Each test first
shows that the setting it checks moves the logits by about their own size. Comparisons with transformers' own
logits are in test_rope_peer.py.
"""
import json

import numpy as np
import paddle
import pytest

from rope_helpers import edit_config, sharp_llama, transformers5_layout
from paddle_grpo.policy import load_policy, rope
from paddle_grpo.policy.causal import completion_logprobs, decoder_path

IDS = np.array([[3, 5, 7, 9, 11, 13, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28]], dtype="int64")


def logits(directory):
    policy = load_policy(directory, trainable=False)
    with paddle.no_grad():
        return policy.model(paddle.to_tensor(IDS), return_dict=True).logits.numpy(), policy.model


def test_parameters_read_both_layouts():
    assert rope.parameters({"rope_theta": 1e6}) == {"rope_type": "default", "rope_theta": 1e6}
    assert rope.parameters({"rope_parameters": {"rope_type": "default", "rope_theta": 5e5}})["rope_theta"] == 5e5
    old = rope.parameters({"rope_theta": 1e4, "rope_scaling": {"type": "linear", "factor": 4.0}})
    assert old == {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e4}
    assert rope.parameters({})["rope_theta"] == 10000.0  # transformers' default theta for Llama and Qwen2


def test_rope_theta_inside_rope_parameters_is_read(tmp_path):
    """A Llama with theta 1e5 in transformers 5's layout loads with the logits of the same model in transformers 4's
    layout (same numbers, same kernels: equal), and not with those of theta 10000 (what PaddleNLP alone reads)."""
    v4 = sharp_llama(tmp_path / "v4", rope_theta=1e5)
    default = sharp_llama(tmp_path / "default", rope_theta=10000.0)
    v5 = sharp_llama(tmp_path / "v5", rope_theta=1e5)
    edit_config(v5, lambda c: transformers5_layout(c, {"rope_type": "default", "rope_theta": 1e5}))
    ours, model = logits(v5)
    theirs, _ = logits(v4)
    plain, _ = logits(default)
    scale = np.abs(theirs).max()
    assert np.abs(theirs - plain).max() > 0.1 * scale  # the theta shows in these logits
    assert model.config.rope_theta == 1e5
    np.testing.assert_array_equal(ours, theirs)


def test_a_saved_checkpoint_carries_the_theta(tmp_path):
    v5 = sharp_llama(tmp_path / "v5", rope_theta=1e5)
    edit_config(v5, lambda c: transformers5_layout(c, {"rope_type": "default", "rope_theta": 1e5}))
    load_policy(v5, trainable=False).save(str(tmp_path / "saved"))
    with open(tmp_path / "saved" / "config.json", encoding="utf-8") as f:
        assert json.load(f)["rope_theta"] == 1e5


@pytest.mark.parametrize("layout", ["rope_parameters", "rope_scaling"])
def test_an_unknown_scaling_is_refused_naming_the_key(tmp_path, layout):
    directory = sharp_llama(tmp_path / "m")
    params = {"rope_type": "longrope", "short_factor": [1.0] * 8, "long_factor": [2.0] * 8}
    if layout == "rope_parameters":
        edit_config(directory, lambda c: transformers5_layout(c, {**params, "rope_theta": 1e4}))
    else:
        edit_config(directory, lambda c: c.update(rope_scaling={"type": "longrope", **params}))
    with pytest.raises(rope.RopeError, match=f"config.json {layout}.rope_type is 'longrope'"):
        load_policy(directory, trainable=False)


def test_linear_scaling_tables_and_paths(tmp_path):
    """Linear x4: the installed tables are plain RoPE at position / 4 (numpy, from the formula); the fast path and
    PaddleNLP's forward both use them (equal within float32 rounding), and they differ from the unscaled model."""
    directory = sharp_llama(tmp_path / "m", rope_theta=1e5)
    edit_config(directory, lambda c: c.update(rope_scaling={"rope_type": "linear", "factor": 4.0}))
    scaled, model = logits(directory)
    assert decoder_path(model) == "decoder: fast path (llama)"
    rotary = model.llama.layers[1].self_attn.rotary_emb
    d = 16
    freq = 1.0 / 1e5 ** (np.arange(0, d, 2) / d)
    angles = np.arange(64)[:, None] / 4.0 * freq[None]
    np.testing.assert_allclose(rotary.cos_cached.numpy()[0, :, 0], np.cos(np.concatenate([angles, angles], 1)),
                               atol=64 * 2e-7)  # float32 angles up to 16 rad: 16 * 2^-24 * a few roundings
    edit_config(directory, lambda c: c.pop("rope_scaling"))
    plain, _ = logits(directory)
    scale = np.abs(scaled).max()
    assert np.abs(scaled - plain).max() > 0.1 * scale
    # The fast path's log-probs against PaddleNLP's forward on the same tables: per layer ~9 chained float32 sums of
    # at most 128 terms adding up to ~the logits' scale + 1 (numerics.f32_sum_tol's bound, 2 layers + head)
    from numerics import f32_sum_tol

    ids = paddle.to_tensor(IDS)
    ones = paddle.ones([1, 10], dtype="int64")
    with paddle.no_grad():
        fast, _ = completion_logprobs(model, ids[:, :10], ones, ids[:, 10:], ones)
        full = paddle.nn.functional.log_softmax(model(ids, return_dict=True).logits[:, 9:-1], -1)
    reference = np.take_along_axis(full.numpy(), IDS[:, 10:, None], 2)[..., 0]
    assert np.abs(fast.numpy() - reference).max() < 2 * f32_sum_tol(128, scale + 1, depth=9 * 2 + 2)


def test_dynamic_beyond_max_positions_is_refused(tmp_path):
    directory = sharp_llama(tmp_path / "m", max_position_embeddings=16)
    edit_config(directory, lambda c: transformers5_layout(c, {"rope_type": "dynamic", "factor": 2.0,
                                                              "rope_theta": 1e4}))
    policy = load_policy(directory, trainable=False)
    ones = paddle.ones([1, 10], dtype="int64")
    ids = paddle.to_tensor(IDS)
    with paddle.no_grad():  # 16 positions: plain RoPE, as transformers computes dynamic NTK there
        completion_logprobs(policy.model, ids[:, :8], ones[:, :8], ids[:, 8:16], ones[:, :8])
        with pytest.raises(rope.RopeError, match="rope_type 'dynamic'"):
            completion_logprobs(policy.model, ids[:, :10], ones, ids[:, 10:], ones)


def test_a_model_built_without_the_tables_is_stopped(tmp_path):
    """PaddleNLP's own from_pretrained ignores linear scaling: such a model is refused before any forward."""
    from paddlenlp.transformers import AutoModelForCausalLM

    directory = sharp_llama(tmp_path / "m")
    edit_config(directory, lambda c: c.update(rope_scaling={"rope_type": "linear", "factor": 4.0}))
    model = AutoModelForCausalLM.from_pretrained(directory)
    ones = paddle.ones([1, 10], dtype="int64")
    with pytest.raises(rope.RopeError, match="rope scaling"):
        completion_logprobs(model, paddle.to_tensor(IDS[:, :10]), ones, paddle.to_tensor(IDS[:, 10:]), ones)
