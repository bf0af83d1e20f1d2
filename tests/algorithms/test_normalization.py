"""Running reward normalisation (PaddleNLP's update: Chan's merge of unbiased batch variances) and advantage
whitening (docs/algorithms.md sections 1, 2).

Tolerances: statistics are stored in float32, so rtol=1e-6 against float64 numpy (atol=1e-7): the running update
is a handful of roundings per batch (Chan's merge: about 8 operations, 8 u = 4.8e-7); rtol=2e-6 against the float32
transcription of PaddleNLP's update (the same operations in another order: twice that). Whitened values rtol=1e-5,
atol=1e-6: a float32 mean and variance over at most 64 values (f32_sum_tol(64, 1) = 7.6e-6 relative at worst;
sqrt(64) u in practice) and a division. The kernels are paddle's and numpy's own elementwise and reduction loops,
the same on any x86 CPU (tests/numerics.py).
"""
import json

import numpy as np
import paddle
import pytest

from paddle_grpo.algorithms import RunningRewardNormalizer, normalize_advantage

pytestmark = pytest.mark.numerics  # compares float results: CI reruns it on other CPU kernels


def batches(seed, sizes):
    rng = np.random.default_rng(seed)
    return [rng.normal(rng.uniform(-3, 3), rng.uniform(0.1, 4), size=n).astype(np.float32) for n in sizes]


def paddlenlp_reward_normalization(state, rewards):
    """An independent float32 numpy transcription of PaddleNLP's `PPOTrainer.compute_reward_normalization`
    (paddlenlp/rl/trainer/ppo_trainer.py): batch mean, UNBIASED batch variance (paddle's `Tensor.var()`), Chan's
    merge, then `(R - mean) / (sqrt(var) + 1e-8)` with the updated statistics. PaddleNLP also rounds the mean
    and std to bfloat16 before that division; that rounding is a documented difference (docs/algorithms.md,
    "Differences from PaddleNLP") and is left out here. `state` is `(reward_mean, reward_var, sample_batch_num)`,
    PaddleNLP's initial one `(0.0, 1.0, 0)`."""
    reward_mean, reward_var, sample_batch_num = state
    batch = np.asarray(rewards, dtype=np.float32)
    batch_mean = batch.mean(dtype=np.float32)
    batch_var = batch.var(ddof=1, dtype=np.float32)
    current = batch.shape[0]
    delta = batch_mean - np.float32(reward_mean)
    total = sample_batch_num + current
    new_mean = reward_mean + delta * current / total
    m2 = reward_var * sample_batch_num + batch_var * current + np.square(delta) * (sample_batch_num * current / total)
    new_var = np.float32(m2 / total)
    normalized = (batch - np.float32(new_mean)) / (np.sqrt(new_var) + np.float32(1e-8))
    return (np.float32(new_mean), new_var, total), normalized


@pytest.mark.parametrize("seed,sizes", [(0, [5, 2, 17, 3, 64]), (1, [2, 2, 3, 2]), (2, [128, 7, 33, 4, 9, 250])])
def test_running_statistics_match_paddlenlp(seed, sizes):
    normalizer = RunningRewardNormalizer()
    state = (0.0, 1.0, 0)
    for k, batch in enumerate(batches(seed, sizes)):
        out = normalizer(paddle.to_tensor(batch) if k % 2 else batch.tolist())
        state, expected = paddlenlp_reward_normalization(state, batch)
        np.testing.assert_allclose(float(normalizer.mean), state[0], rtol=2e-6, atol=1e-6)
        np.testing.assert_allclose(float(normalizer.var), state[1], rtol=2e-6, atol=1e-6)
        assert normalizer.count == state[2]
        np.testing.assert_allclose(np.asarray(out), expected, rtol=1e-5, atol=1e-5)
    assert isinstance(normalizer.mean, np.float32) and isinstance(normalizer.var, np.float32)


def test_the_variance_is_paddlenlps_unbiased_one_not_the_population_one():
    # the first batch alone: the statistics are its mean and its UNBIASED variance (ddof=1)
    batch = np.array([1.0, 3.0, 4.0, 8.0])
    normalizer = RunningRewardNormalizer()
    out = normalizer(batch)
    assert float(normalizer.var) == pytest.approx(batch.var(ddof=1), rel=1e-6)
    np.testing.assert_allclose(out, (batch - batch.mean()) / (batch.std(ddof=1) + 1e-8), rtol=1e-6)
    assert not np.allclose(out, (batch - batch.mean()) / batch.std(), atol=0.1)  # the population version differs
    # two batches: Chan's merge of unbiased batch variances is not the variance of everything seen
    second = np.array([0.0, 2.0])
    normalizer.update(second)
    everything = np.concatenate([batch, second])
    assert float(normalizer.var) != pytest.approx(everything.var(), rel=1e-3)
    assert float(normalizer.var) != pytest.approx(everything.var(ddof=1), rel=1e-3)


def test_a_batch_of_one_reward_counts_with_variance_zero():
    # PaddleNLP's unbiased variance of one value is NaN and would poison its statistics for good; here it is 0
    normalizer = RunningRewardNormalizer()
    normalizer.set_state_dict({"mean": 1.0, "var": 4.0, "count": 3.0})
    normalizer.update([5.0])
    delta = 5.0 - 1.0
    assert float(normalizer.mean) == pytest.approx(1.0 + delta / 4.0)
    assert float(normalizer.var) == pytest.approx((4.0 * 3.0 + 0.0 + delta ** 2 * 3.0 / 4.0) / 4.0)
    assert normalizer.count == 4.0 and np.isfinite(float(normalizer.var))


def test_update_follows_the_chan_formula_from_a_nontrivial_state():
    normalizer = RunningRewardNormalizer()
    normalizer.set_state_dict({"mean": 0.5, "var": 2.0, "count": 10.0})
    batch = np.array([1.0, 4.0, -2.0, 3.0])
    normalizer.update(batch)
    n, mu, var, n_b = 10.0, 0.5, 2.0, 4.0
    delta = batch.mean() - mu
    expected_mean = mu + delta * n_b / (n + n_b)
    expected_var = (var * n + batch.var(ddof=1) * n_b + delta ** 2 * n * n_b / (n + n_b)) / (n + n_b)
    np.testing.assert_allclose(float(normalizer.mean), expected_mean, rtol=1e-6)
    np.testing.assert_allclose(float(normalizer.var), expected_var, rtol=1e-6)
    assert normalizer.count == 14.0


def test_a_checkpoint_of_the_population_variance_version_loads_and_continues():
    # trainer_state.json's "normalizer" entry as the earlier version wrote it: the same three keys
    old_state = json.loads('{"mean": 0.8125, "var": 2.3671875, "count": 16.0}')
    resumed = RunningRewardNormalizer()
    resumed.set_state_dict(old_state)
    assert resumed.state_dict() == old_state
    batch = np.array([2.0, -1.0, 0.5], dtype=np.float32)
    out = resumed(batch)
    state, expected = paddlenlp_reward_normalization((0.8125, 2.3671875, 16), batch)
    np.testing.assert_allclose([float(resumed.mean), float(resumed.var)], state[:2], rtol=2e-6)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)


def test_initial_state_and_normalize():
    normalizer = RunningRewardNormalizer()
    assert normalizer.state_dict() == {"mean": 0.0, "var": 1.0, "count": 0.0}
    rewards = np.array([1.5, -2.0, 0.25], dtype=np.float32)
    np.testing.assert_allclose(normalizer.normalize(rewards), rewards / (1 + 1e-8), rtol=1e-7)
    normalizer.update([])  # an empty batch changes nothing
    assert normalizer.state_dict() == {"mean": 0.0, "var": 1.0, "count": 0.0}

    out = normalizer(paddle.to_tensor(rewards))  # update, then normalise with the updated statistics
    assert isinstance(out, paddle.Tensor) and out.dtype == paddle.float32
    expected = (rewards - rewards.astype(np.float64).mean()) / (rewards.astype(np.float64).std(ddof=1) + 1e-8)
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(normalizer.update_and_normalize(rewards[:1]),
                               (rewards[:1] - float(normalizer.mean)) / (np.sqrt(float(normalizer.var)) + 1e-8),
                               rtol=1e-6)


def test_low_precision_rewards():
    normalizer = RunningRewardNormalizer()
    out = normalizer(paddle.to_tensor([1.0, 3.0]).astype("bfloat16"))
    assert out.dtype == paddle.float32
    np.testing.assert_allclose(out.numpy(), [-0.5 ** 0.5, 0.5 ** 0.5], rtol=1e-6)  # unbiased variance 2


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
    # float32 keeps its relative precision at 1e-8 (normal numbers down to 1e-38): the bound above holds; the room
    # to 1e-4 is for std + eps, a sum of two terms of the same size, and the division by it
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
