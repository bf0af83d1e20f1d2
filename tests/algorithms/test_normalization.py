"""Running reward normalisation (Chan's update) and advantage whitening (docs/algorithms.md sections 1, 2).

Tolerances: statistics are stored in float32, so rtol=1e-6 against float64 numpy (atol=1e-7); whitened values
rtol=1e-5, atol=1e-6.
"""
import json

import numpy as np
import paddle
import pytest

from paddle_grpo.algorithms import RunningRewardNormalizer, normalize_advantage


def batches(seed, sizes):
    rng = np.random.default_rng(seed)
    return [rng.normal(rng.uniform(-3, 3), rng.uniform(0.1, 4), size=n).astype(np.float32) for n in sizes]


@pytest.mark.parametrize("seed,sizes", [(0, [5, 1, 17, 3, 64]), (1, [1, 1, 1, 2]), (2, [128, 7, 33, 1, 9, 250])])
def test_running_statistics_equal_those_of_all_data_seen(seed, sizes):
    normalizer = RunningRewardNormalizer()
    seen = []
    for k, batch in enumerate(batches(seed, sizes)):
        normalizer.update(paddle.to_tensor(batch) if k % 2 else batch.tolist())
        seen.append(batch.astype(np.float64))
        everything = np.concatenate(seen)
        np.testing.assert_allclose(float(normalizer.mean), everything.mean(), rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(float(normalizer.var), everything.var(), rtol=1e-6, atol=1e-7)  # population
        assert normalizer.count == everything.size
    assert isinstance(normalizer.mean, np.float32) and isinstance(normalizer.var, np.float32)


def test_update_follows_the_chan_formula_from_a_nontrivial_state():
    normalizer = RunningRewardNormalizer()
    normalizer.set_state_dict({"mean": 0.5, "var": 2.0, "count": 10.0})
    batch = np.array([1.0, 4.0, -2.0, 3.0])
    normalizer.update(batch)
    n, mu, var, n_b = 10.0, 0.5, 2.0, 4.0
    delta = batch.mean() - mu
    expected_mean = mu + delta * n_b / (n + n_b)
    expected_var = (var * n + batch.var() * n_b + delta ** 2 * n * n_b / (n + n_b)) / (n + n_b)
    np.testing.assert_allclose(float(normalizer.mean), expected_mean, rtol=1e-6)
    np.testing.assert_allclose(float(normalizer.var), expected_var, rtol=1e-6)
    assert normalizer.count == 14.0


def test_initial_state_and_normalize():
    normalizer = RunningRewardNormalizer()
    assert normalizer.state_dict() == {"mean": 0.0, "var": 1.0, "count": 0.0}
    rewards = np.array([1.5, -2.0, 0.25], dtype=np.float32)
    np.testing.assert_allclose(normalizer.normalize(rewards), rewards / (1 + 1e-8), rtol=1e-7)
    normalizer.update([])  # an empty batch changes nothing
    assert normalizer.state_dict() == {"mean": 0.0, "var": 1.0, "count": 0.0}

    out = normalizer(paddle.to_tensor(rewards))  # update, then normalise with the updated statistics
    assert isinstance(out, paddle.Tensor) and out.dtype == paddle.float32
    expected = (rewards - rewards.astype(np.float64).mean()) / (rewards.astype(np.float64).std() + 1e-8)
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(normalizer.update_and_normalize(rewards[:1]),
                               (rewards[:1] - float(normalizer.mean)) / (np.sqrt(float(normalizer.var)) + 1e-8),
                               rtol=1e-6)


def test_low_precision_rewards():
    normalizer = RunningRewardNormalizer()
    out = normalizer(paddle.to_tensor([1.0, 3.0]).astype("bfloat16"))
    assert out.dtype == paddle.float32
    np.testing.assert_allclose(out.numpy(), [-1.0, 1.0], rtol=1e-6)


def test_state_dict_round_trip_resumes_identically():
    data = batches(3, [6, 2, 11, 5, 9])
    original = RunningRewardNormalizer()
    for batch in data[:3]:
        original.update(batch)
    state = json.loads(json.dumps(original.state_dict()))  # a JSON checkpoint
    assert all(type(v) is float for v in state.values())
    resumed = RunningRewardNormalizer()
    resumed.set_state_dict(state)
    for batch in data[3:]:
        a, b = original(batch), resumed(batch)
        np.testing.assert_array_equal(a, b)
    assert original.state_dict() == resumed.state_dict()


# ---- normalize_advantage ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("seed,shape", [(0, (4, 6)), (1, (7, 3)), (2, (2, 9))])
def test_normalize_advantage_matches_numpy(seed, shape):
    rng = np.random.default_rng(seed)
    A = rng.normal(1.0, 2.0, size=shape).astype(np.float32)
    lengths = rng.integers(0, shape[1] + 1, size=shape[0])
    lengths[0] = shape[1]
    mask = np.arange(shape[1])[None, :] < lengths[:, None]
    valid = A[mask].astype(np.float64)
    expected = np.where(mask, (A - valid.mean()) / (valid.std(ddof=1) + 1e-8), 0.0)
    out = normalize_advantage(paddle.to_tensor(A), paddle.to_tensor(mask.astype(np.int32)))
    assert out.dtype == paddle.float32
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-5, atol=1e-6)


def test_normalize_advantage_epsilon_is_added_to_the_std():
    # a std of the order of the 1e-8 epsilon tells std + eps from sqrt(var + eps)
    A = np.array([[0.0, 1e-8, 3e-8], [2e-8, 0.0, 0.0]], dtype=np.float32)
    mask = np.array([[1, 1, 1], [1, 0, 0]], dtype=np.float32)
    valid = A[mask > 0].astype(np.float64)
    expected = np.where(mask > 0, (A - valid.mean()) / (valid.std(ddof=1) + 1e-8), 0.0)
    out = normalize_advantage(paddle.to_tensor(A), paddle.to_tensor(mask))
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-4, atol=1e-6)


def test_normalize_advantage_degenerate_batches_have_no_nan():
    A = paddle.to_tensor([[3.0, np.nan], [np.inf, 2.0]])
    assert (normalize_advantage(A, paddle.zeros([2, 2])).numpy() == 0).all()
    one = normalize_advantage(A, paddle.to_tensor([[1, 0], [0, 0]])).numpy()
    assert (one == 0).all()



@pytest.mark.parametrize("value", [0.7, 1.0 / 3.0, 123.456, -9.99])
@pytest.mark.parametrize("shape", [(2, 3), (5, 13), (3, 700)])
def test_normalize_advantage_of_equal_values_is_exactly_zero(value, shape):
    # a plain float32 mean of equal values is often an ulp off, which whitening would turn into O(1) noise
    mask = np.ones(shape, dtype=np.int32)
    mask[0, -1] = 0
    out = normalize_advantage(paddle.full(list(shape), value), paddle.to_tensor(mask)).numpy()
    assert (out == 0).all()
