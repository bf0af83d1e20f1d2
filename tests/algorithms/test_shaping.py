"""Reward shaping: combining reward functions, clipping, DAPO overlong penalty (ALGORITHMS.md section 1).

Tolerances: rtol=1e-6 (float32 of float64 references).
"""
import math

import numpy as np
import paddle
import pytest

from paddle_grpo.algorithms import clip_reward, combine_rewards, overlong_penalty


# ---- clip_reward -----------------------------------------------------------------------------------------------------

def test_clip_reward_numpy_and_paddle():
    rewards = [-7.5, -2.0, 0.0, 1.99, 3.0, 100.0]
    expected = np.array([-2.0, -2.0, 0.0, 1.99, 2.0, 2.0], dtype=np.float32)
    out = clip_reward(rewards, 2.0)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, expected)
    out = clip_reward(paddle.to_tensor(rewards).astype("bfloat16"), 2)
    assert out.dtype == paddle.float32
    np.testing.assert_allclose(out.numpy(), paddle.to_tensor(expected).astype("bfloat16").astype("float32").numpy())
    np.testing.assert_array_equal(clip_reward(rewards, None), np.array(rewards, dtype=np.float32))


@pytest.mark.parametrize("bad", [0.0, -1.0])
def test_clip_reward_rejects_nonpositive_range(bad):
    with pytest.raises(ValueError, match="clip_range_score"):
        clip_reward([1.0], bad)


# ---- overlong_penalty ------------------------------------------------------------------------------------------------

def ref_overlong(length, max_dec_len, buffer_len, factor):
    expected_len = max_dec_len - buffer_len
    if length <= expected_len:
        return 0.0
    return -(length - expected_len) / buffer_len * factor


@pytest.mark.parametrize("max_dec_len,buffer_len,factor", [(100, 20, 1.0), (64, 64, 0.5), (512, 128, 2.0)])
def test_overlong_penalty_matches_reference(max_dec_len, buffer_len, factor):
    lengths = np.array([1, max_dec_len - buffer_len - 1, max_dec_len - buffer_len, max_dec_len - buffer_len + 1,
                        max_dec_len - buffer_len // 2, max_dec_len - 1, max_dec_len])
    expected = [ref_overlong(int(n), max_dec_len, buffer_len, factor) for n in lengths]
    out = overlong_penalty(lengths, max_dec_len, buffer_len, factor)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, expected, rtol=1e-6, atol=1e-7)
    assert out[-1] == pytest.approx(-factor)  # full length: the whole penalty
    assert (out[lengths <= max_dec_len - buffer_len] == 0).all() and (out[lengths > max_dec_len - buffer_len] < 0).all()
    out_t = overlong_penalty(paddle.to_tensor(lengths), max_dec_len, buffer_len, factor)
    assert out_t.dtype == paddle.float32
    np.testing.assert_allclose(out_t.numpy(), expected, rtol=1e-6, atol=1e-7)


def test_overlong_penalty_argument_errors():
    with pytest.raises(ValueError, match="overlong_reward_buffer"):
        overlong_penalty([10], 100, 0, 1.0)
    with pytest.raises(ValueError, match="max_dec_len"):
        overlong_penalty([10], 100, 101, 1.0)


# ---- combine_rewards -------------------------------------------------------------------------------------------------

def test_combine_rewards_with_none_terms_and_weights():
    scores = {
        "accuracy": [1.0, 0.0, None, None, 1.0],
        "format": [0.5, None, None, 1.0, 0.0],
    }
    total, has_any, means = combine_rewards(scores, {"accuracy": 2.0, "format": 0.5})
    assert total.dtype == np.float32 and has_any.dtype == bool
    np.testing.assert_allclose(total, [2.25, 0.0, 0.0, 0.5, 2.0], rtol=1e-6)
    np.testing.assert_array_equal(has_any, [True, True, False, True, True])
    assert means == {"accuracy": pytest.approx(2 / 3), "format": pytest.approx(0.5)}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_combine_rewards_matches_loop_reference(seed):
    rng = np.random.default_rng(seed)
    n_fn, n = 3, 11
    raw = rng.normal(size=(n_fn, n))
    scores = [[None if rng.random() < 0.3 else float(raw[k, i]) for i in range(n)] for k in range(n_fn)]
    weights = list(rng.uniform(0.1, 2.0, size=n_fn))
    total, has_any, means = combine_rewards(scores, weights)
    for i in range(n):
        terms = [weights[k] * scores[k][i] for k in range(n_fn) if scores[k][i] is not None]
        assert has_any[i] == bool(terms)
        assert total[i] == pytest.approx(sum(terms), rel=1e-6, abs=1e-7)
    for k in range(n_fn):
        judged = [x for x in scores[k] if x is not None]
        assert means[f"reward_{k}"] == pytest.approx(sum(judged) / len(judged), rel=1e-9)


def test_combine_rewards_default_weights_and_function_that_judged_nothing():
    total, has_any, means = combine_rewards({"a": [1, 2], "b": [None, None]})
    np.testing.assert_array_equal(total, [1.0, 2.0])
    assert has_any.all()
    assert means == {"a": 1.5, "b": None}
    total, has_any, _ = combine_rewards([[True, False]])  # bools are scores too
    np.testing.assert_array_equal(total, [1.0, 0.0])


def test_combine_rewards_errors_are_specific():
    with pytest.raises(ValueError, match="different numbers"):
        combine_rewards({"a": [1.0, 2.0], "b": [1.0]})
    with pytest.raises(ValueError, match="do not match"):
        combine_rewards({"a": [1.0]}, {"b": 1.0})
    with pytest.raises(ValueError, match="2 reward_weights for 1"):
        combine_rewards({"a": [1.0]}, [1.0, 2.0])
    with pytest.raises(ValueError, match=r"'a' returned nan for sample 1"):
        combine_rewards({"a": [1.0, math.nan]})
    with pytest.raises(ValueError, match="at least one"):
        combine_rewards({})
