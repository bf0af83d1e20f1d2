"""Reward shaping: clipping, DAPO overlong penalty (docs/algorithms.md section 1).

Tolerances: rtol=1e-6, atol=1e-7 (float32 of float64 references): clipping and the overlong penalty are at most
3 elementwise roundings (3 u = 1.8e-7 relative), no sums; paddle's elementwise kernels are the same on any x86 CPU.
"""
import numpy as np
import paddle
import pytest

from paddle_grpo.algorithms import clip_reward, overlong_penalty

pytestmark = pytest.mark.numerics  # compares float results: CI reruns it on other CPU kernels


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
