"""step/'s typed Batch and phase functions, against independent numpy references (no model needed).

The trainer-level tests (tests/test_trainer.py) run the phases end to end; these pin down each phase's own
contract: how groups are kept and padded, what the one gather returns, how rewards are shaped and where the
reward's KL goes for each estimator spec.
"""
import math

import numpy as np
import paddle
import pytest

from paddle_grpo import step
from paddle_grpo.algorithms import (RunningRewardNormalizer, get_advantage_estimator, register_advantage_estimator,
                                    unregister_advantage_estimator)
from paddle_grpo.config import config_from_dict
from paddle_grpo.parallel import ParallelContext
from paddle_grpo.rewards import RewardResult
from paddle_grpo.rollout import Rollout

pytestmark = pytest.mark.numerics  # compares float results: CI reruns it on other CPU kernels

PAD = 0


def make_batch(rng, n_prompts, G, L, T, first_index=0):
    """A batch of random rows: prompts left-padded to L, completions of random lengths right-padded to T."""
    n = n_prompts * G
    prompt_len = rng.integers(1, L + 1, size=n)
    lengths = rng.integers(1, T + 1, size=n)
    prompt_mask = (np.arange(L)[None, :] >= L - prompt_len[:, None]).astype(np.int64)
    completion_mask = (np.arange(T)[None, :] < lengths[:, None]).astype(np.int64)
    rollout = Rollout(prompt_ids=paddle.to_tensor(rng.integers(1, 50, size=(n, L)) * prompt_mask),
                      prompt_mask=paddle.to_tensor(prompt_mask),
                      completion_ids=paddle.to_tensor(rng.integers(1, 50, size=(n, T)) * completion_mask),
                      completion_mask=paddle.to_tensor(completion_mask), lengths=lengths,
                      truncated=lengths == T,
                      sample_logprobs=paddle.to_tensor((-rng.random((n, T)) * completion_mask).astype("float32")))
    scores = [None if rng.random() < 0.2 else float(rng.integers(0, 3)) for _ in range(n)]
    result = RewardResult(scores=scores, scores_by_function={"f": scores, "g": [1.0] * n}, errors=[None] * n)
    indices = list(range(first_index, first_index + n_prompts))
    return step.Batch.from_rollout(rollout, [f"text {first_index}-{i}" for i in range(n)], result, indices, G)


def rows_of(batch):
    """Each row as plain python: what the tensors hold without padding, and the per-row data."""
    p_ids, p_mask = batch.prompt_ids.numpy(), batch.prompt_mask.numpy()
    c_ids, c_mask, lp = batch.completion_ids.numpy(), batch.completion_mask.numpy(), batch.sample_logprobs.numpy()
    return [(p_ids[i][p_mask[i] == 1].tolist(), c_ids[i][c_mask[i] == 1].tolist(), lp[i][c_mask[i] == 1].tolist(),
             int(batch.lengths[i]), bool(batch.truncated[i]), batch.texts[i], float(batch.rewards[i]),
             bool(batch.valid[i]), batch.scores_by_function["f"][i], batch.prompt_index[i])
            for i in range(len(batch))]


def test_from_rollout_maps_none_to_invalid_rows_with_reward_zero():
    batch = make_batch(np.random.default_rng(0), 3, 4, 5, 6)
    scores = batch.scores_by_function["f"]
    assert batch.valid.tolist() == [s is not None for s in scores]
    assert batch.rewards.tolist() == [0.0 if s is None else s for s in scores]
    assert batch.prompt_index == [0] * 4 + [1] * 4 + [2] * 4


def test_informative_groups_are_those_whose_judged_rewards_vary():
    rng = np.random.default_rng(1)
    batch = make_batch(rng, 6, 3, 4, 4)
    expected = []
    for g in range(6):
        judged = [s for s in batch.scores_by_function["f"][g * 3:g * 3 + 3] if s is not None]
        expected.append(len(judged) > 1 and max(judged) != min(judged))
    assert batch.informative_groups(3).tolist() == expected


def test_groups_then_concat_keep_rows_in_order_and_pad_prompts_left_completions_right():
    rng = np.random.default_rng(2)
    a, b = make_batch(rng, 3, 2, 4, 5), make_batch(rng, 2, 2, 7, 3, first_index=10)
    parts = [a.groups([2, 0], 2), b.groups([1], 2)]
    merged = step.Batch.concat(parts, PAD)
    assert merged.prompt_ids.shape == [6, 7] and merged.completion_ids.shape == [6, 5]
    assert rows_of(merged) == rows_of(a)[4:6] + rows_of(a)[0:2] + rows_of(b)[2:4]
    p_mask, c_mask = merged.prompt_mask.numpy(), merged.completion_mask.numpy()
    assert (np.diff(p_mask, axis=1) >= 0).all() and p_mask[:, -1].all()  # left-padded: real tokens end each row
    assert (np.diff(c_mask, axis=1) <= 0).all()                           # right-padded
    assert (merged.completion_ids.numpy()[c_mask == 0] == PAD).all()
    assert (merged.sample_logprobs.numpy()[c_mask == 0] == 0).all()


def test_sample_rows_report_the_unshaped_reward_and_each_function():
    batch = make_batch(np.random.default_rng(3), 2, 2, 3, 3)
    records = [{"src": f"prompt {i}"} for i in range(2)]
    rows = batch.sample_rows(records, k=3)
    assert [r["prompt"] for r in rows] == ["prompt 0", "prompt 0", "prompt 1"]
    for i, r in enumerate(rows):
        assert r["reward"] == (batch.scores_by_function["f"][i])
        assert r["scores"] == {"f": batch.scores_by_function["f"][i], "g": 1.0}
        assert r["completion"] == batch.texts[i] and r["length"] == batch.lengths[i]


def test_gather_in_one_process_is_this_ranks_rows():
    batch = make_batch(np.random.default_rng(4), 2, 3, 3, 4)
    old, ref = batch.sample_logprobs, batch.sample_logprobs * 0.5
    rows = step.gather(ParallelContext(), batch, old, ref)
    assert rows.offset == 0 and rows.scores_by_function == [batch.scores_by_function]
    np.testing.assert_array_equal(rows.mask, batch.completion_mask.numpy())
    np.testing.assert_array_equal(rows.rewards, batch.rewards)
    np.testing.assert_array_equal(rows.old, old.numpy())
    np.testing.assert_array_equal(rows.ref, ref.numpy())
    assert step.gather(ParallelContext(), batch, None, None).old is None


def global_rows(rewards, valid, mask, old=None, ref=None, by_function=None):
    n = len(rewards)
    return step.GlobalRows(rewards=np.asarray(rewards, dtype=np.float64), valid=np.asarray(valid),
                           lengths=mask.sum(1), truncated=np.zeros(n, dtype=bool),
                           scores_by_function=[by_function or {"f": list(rewards)}], mask=mask, old=old, ref=ref,
                           offset=0)


def cfg_of(**values):
    base = dict(actor_model_name_or_path="unused", use_rm_server=False, reward_funcs="kk", train_datasets="unused",
                rollout_n=2, global_batch_size=2, max_dec_len=4, min_dec_len=1, max_prompt_len=16,
                max_length=20, kl_coeff=0.0)
    return config_from_dict({**base, **values})


def test_shape_rewards_clips_then_adds_the_overlong_penalty_then_normalises():
    rewards = [12.0, -3.0, 1.0, 4.0]
    valid = np.array([True, True, False, True])
    mask = np.array([[1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0]])
    cfg = cfg_of(clip_range_score=10.0, enable_overlong_reward_buffer=True, overlong_reward_buffer=2,
                 overlong_penalty_factor=1.0, normalize_reward=True)
    normalizer = RunningRewardNormalizer()
    shaped, metrics = step.shape_rewards(global_rows(rewards, valid, mask), cfg, normalizer)
    # by hand: clip to [-10, 10]; lengths 4, 1, 2, 3 past max_dec_len - buffer = 2 cost (L - 2) / 2
    expected = np.array([10.0, -3.0, 1.0, 4.0]) + np.array([-1.0, 0.0, 0.0, -0.5])
    judged = expected[valid]
    # PaddleNLP's normaliser: the first batch's mean and UNBIASED variance
    expected = np.where(valid, (expected - judged.mean()) / (judged.std(ddof=1) + 1e-8), 0.0)
    # float32 clip, penalty and normalisation of 3 values ~10 (mean, unbiased std, division): ~10 roundings, 10 u
    # relative = 6e-7 (tests/algorithms/test_normalization.py); the raw reward statistics are float64
    np.testing.assert_allclose(shaped, expected, rtol=1e-5, atol=1e-6)
    assert metrics.reward == pytest.approx(np.mean([12.0, -3.0, 4.0]))
    assert metrics.reward_std == pytest.approx(np.std([12.0, -3.0, 4.0], ddof=1))
    assert metrics.none_frac == 0.25 and metrics.by_function == {}


def test_reward_metrics_name_each_function_only_when_there_are_several():
    mask = np.ones((2, 2), dtype=np.int64)
    by_function = {"a": [1.0, None], "b": [0.0, 2.0]}
    _, metrics = step.shape_rewards(global_rows([1.0, 2.0], [True, True], mask, by_function=by_function),
                                    cfg_of(), None)
    assert metrics.as_dict()["train/reward/a"] == 1.0 and metrics.as_dict()["train/reward/b"] == 1.0


def kl_inputs(rng, n, T):
    mask = (np.arange(T)[None, :] < rng.integers(1, T + 1, size=n)[:, None]).astype(np.int64)
    old = (-rng.random((n, T))).astype(np.float32)
    ref = (-rng.random((n, T))).astype(np.float32)
    return mask, old, ref


def test_group_estimators_take_the_reward_kl_per_sequence_with_use_kl_in_reward():
    rng = np.random.default_rng(5)
    mask, old, ref = kl_inputs(rng, 4, 5)
    rewards = np.array([1.0, 0.0, 0.5, 0.5], dtype=np.float32)
    valid = np.array([True, True, True, False])
    cfg = cfg_of(rl_algorithm="grpo", kl_coeff=0.1, kl_estimator="k1", use_kl_in_reward=True)
    assert cfg.reward_kl_coeff == 0.1 and cfg.needs_reference_model
    adv, metrics = step.compute_advantages(global_rows(rewards, valid, mask, old, ref), rewards, cfg)
    # reference: R - 0.1 * sum_t (old - ref) over valid tokens, then GRPO's group z-score (unbiased std)
    m = mask * valid[:, None]
    seq = rewards - 0.1 * ((old - ref) * m).sum(1)
    expected = np.zeros_like(old)
    for g in range(2):
        rows = [r for r in (2 * g, 2 * g + 1) if valid[r]]
        scores = seq[rows]  # a group with one judged member has mean 0 and std 1 (docs/algorithms.md section 2)
        z = (scores - scores.mean()) / (scores.std(ddof=1) + 1e-6) if len(rows) > 1 else scores / (1 + 1e-6)
        for r, v in zip(rows, z):
            expected[r] = v * m[r]
    # 0.1 times float32 sums over <= 8 tokens of log-prob differences ~2: 0.1 f32_sum_tol(8, 16) = 1.5e-6 absolute
    # (tests/numerics.py), then the group z-score (a mean, a std, a division: a few u relative): atol 1e-5, rtol 1e-4
    np.testing.assert_allclose(adv, expected, rtol=1e-4, atol=1e-5)
    assert metrics.frac_reward_zero_std == 0.5  # the second group's shaped rewards agree


@pytest.mark.parametrize("algorithm", ["grpo", "reinforce_plus_plus_baseline"])
def test_a_group_of_one_sample_is_not_counted_as_zero_std(algorithm):
    # rollout_n 1 (issue 41 item 4.5): every group is one sample, whose std is 0, yet grpo gives it R / (1 + 1e-6)
    # and reinforce_plus_plus_baseline the whitened reward: a nonzero advantage, so the share of zero-std groups
    # (no learning signal) is 0 by hand, not 1.
    mask = np.ones((4, 3), dtype=np.int64)
    rewards = np.array([1.0, 0.0, 0.5, 1.0], dtype=np.float32)
    adv, metrics = step.compute_advantages(global_rows(rewards, [True] * 4, mask), rewards,
                                           cfg_of(rl_algorithm=algorithm, rollout_n=1, global_batch_size=4))
    assert metrics.frac_reward_zero_std == 0.0
    assert metrics.std > 0.1 and np.abs(adv).max() > 0.5  # the advantages the metric must agree with


def test_frac_reward_zero_std_with_groups_of_two_is_unchanged():
    # 3 groups of 2: (1, 1) and (0.5, 0.5) agree, (0, 1) does not: 2/3 by hand
    mask = np.ones((6, 2), dtype=np.int64)
    rewards = np.array([1.0, 1.0, 0.0, 1.0, 0.5, 0.5], dtype=np.float32)
    _, metrics = step.compute_advantages(global_rows(rewards, [True] * 6, mask), rewards,
                                         cfg_of(rollout_n=2, global_batch_size=3))
    assert metrics.frac_reward_zero_std == 2 / 3


@pytest.mark.parametrize("algorithm", ["grpo", "rloo"])
def test_group_estimators_ignore_kl_coeff_without_use_kl_in_reward(algorithm):
    # PaddleNLP's GRPO keeps the reference KL out of the reward (kl_coeff has no effect): the advantages are those
    # of the plain rewards even when the rows carry log-probs, and no reference model is needed for kl_coeff alone
    rng = np.random.default_rng(8)
    mask, old, ref = kl_inputs(rng, 4, 5)
    rewards = np.array([1.0, 0.0, 0.25, 0.5], dtype=np.float32)
    cfg = cfg_of(rl_algorithm=algorithm, kl_coeff=0.5)
    assert cfg.reward_kl_coeff == 0.0 and not cfg.needs_reference_model
    assert cfg_of(rl_algorithm=algorithm, kl_coeff=0.5, kl_loss_coeff=0.01).needs_reference_model
    with_lp, _ = step.compute_advantages(global_rows(rewards, [True] * 4, mask, old, ref), rewards, cfg)
    plain, _ = step.compute_advantages(global_rows(rewards, [True] * 4, mask), rewards, cfg)
    np.testing.assert_array_equal(with_lp, plain)
    # reference: the estimator on the rewards alone
    token_rewards = np.zeros(mask.shape, dtype=np.float32)
    token_rewards[np.arange(4), mask.sum(1) - 1] = rewards
    expected, _ = get_advantage_estimator(algorithm)(paddle.to_tensor(token_rewards),
                                                     paddle.to_tensor(mask.astype("float32")), [0, 0, 1, 1])
    np.testing.assert_allclose(with_lp, expected.numpy(), rtol=1e-6)  # the same estimator on the same rows
    # with use_kl_in_reward the same rows give different advantages
    on, _ = step.compute_advantages(global_rows(rewards, [True] * 4, mask, old, ref), rewards,
                                    cfg_of(rl_algorithm=algorithm, kl_coeff=0.5, use_kl_in_reward=True))
    assert not np.allclose(on, plain)


def test_reinforce_plus_plus_keeps_kl_coeff_in_the_reward_whatever_use_kl_in_reward_says():
    rng = np.random.default_rng(9)
    mask, old, ref = kl_inputs(rng, 4, 5)
    rewards = rng.random(4).astype(np.float32)
    rows = global_rows(rewards, [True] * 4, mask, old, ref)
    off = cfg_of(rl_algorithm="reinforce_plus_plus", kl_coeff=0.05)
    on = cfg_of(rl_algorithm="reinforce_plus_plus", kl_coeff=0.05, use_kl_in_reward=True)
    assert off.reward_kl_coeff == on.reward_kl_coeff == 0.05 and off.needs_reference_model
    np.testing.assert_array_equal(step.compute_advantages(rows, rewards, off)[0],
                                  step.compute_advantages(rows, rewards, on)[0])


def test_token_level_estimators_receive_the_log_probs_and_kl_options():
    rng = np.random.default_rng(6)
    mask, old, ref = kl_inputs(rng, 4, 5)
    rewards = rng.random(4).astype(np.float32)
    cfg = cfg_of(rl_algorithm="reinforce_plus_plus", kl_coeff=0.05, kl_estimator="k2")
    adv, _ = step.compute_advantages(global_rows(rewards, [True] * 4, mask, old, ref), rewards, cfg)
    mask_t = paddle.to_tensor(mask.astype("float32"))
    token_rewards = paddle.to_tensor(np.zeros_like(old))
    last = mask.sum(1) - 1
    token_rewards = token_rewards.numpy()
    token_rewards[np.arange(4), last] = rewards
    expected, _ = get_advantage_estimator("reinforce_plus_plus")(
        paddle.to_tensor(token_rewards), mask_t, np.arange(4), kl_coeff=0.05, old_log_probs=paddle.to_tensor(old),
        ref_log_probs=paddle.to_tensor(ref), kl_estimator="k2")
    np.testing.assert_allclose(adv, expected.numpy(), rtol=1e-6)  # the same estimator and kernels, one process
    # and the KL changed the result: without it the advantages differ
    plain, _ = step.compute_advantages(global_rows(rewards, [True] * 4, mask), rewards, cfg)
    assert not np.allclose(adv, plain)


def test_a_registered_estimator_gets_what_its_spec_asks_for():
    calls = []

    @register_advantage_estimator("test_step_spy", kl_in_reward="token", config_options=("norm_adv_by_std",))
    def spy(token_level_rewards, response_mask, index, **options):
        calls.append(options)
        return token_level_rewards, token_level_rewards

    try:
        rng = np.random.default_rng(7)
        mask, old, ref = kl_inputs(rng, 2, 3)
        rewards = np.array([1.0, 2.0], dtype=np.float32)
        cfg = cfg_of(rl_algorithm="test_step_spy", kl_coeff=0.2, norm_adv_by_std=False)
        step.compute_advantages(global_rows(rewards, [True, True], mask, old, ref), rewards, cfg)
        step.compute_advantages(global_rows(rewards, [True, True], mask), rewards, cfg)
    finally:
        unregister_advantage_estimator("test_step_spy")
    assert sorted(calls[0]) == ["kl_coeff", "kl_estimator", "norm_adv_by_std", "old_log_probs", "ref_log_probs"]
    assert calls[0]["kl_coeff"] == 0.2 and calls[0]["norm_adv_by_std"] is False
    np.testing.assert_array_equal(calls[0]["ref_log_probs"].numpy(), ref)
    assert calls[1] == {"norm_adv_by_std": False}  # no KL term without the log-probs


def test_loss_sums_means_divide_the_token_weighted_statistics_by_the_tokens():
    # shares (3), token-weighted sums (entropy, 4 clip / approx-KL, 7 rollout correction), the maximum, 4 tokens
    sums = step.LossSums(np.array([0.5, 0.1, 0.3, 2.0, 0.4, 0.2, 0.0, 1.0, 4.4, 0.8, 0.0, 0.4, 4.8, 6.4, -0.4, 1.5,
                                   4.0]))
    means = sums.means()
    ess, ppl = means.pop("rollout_correction/ess"), means.pop("rollout_correction/ppl_ratio")
    assert means == {"train/policy_loss": 0.5, "train/kl_loss": 0.1, "train/positive_lm_loss": 0.3,
                     "train/entropy": 0.5,
                     "train/clip_frac_low": 0.1, "train/clip_frac_high": 0.05, "train/clip_frac_dual": 0.0,
                     "train/approx_kl_old": 0.25, "rollout_correction/ratio_mean": 1.1,
                     "rollout_correction/capped_frac": 0.2, "rollout_correction/masked_frac": 0.0,
                     "rollout_correction/kl": 0.1, "rollout_correction/ratio_max": 1.5}
    # The ESS of the whole mini-batch from the token means of w (1.2) and w^2 (1.6), not a mean of ESS values; the
    # perplexity ratio exp of the mean gap (-0.1). A few float64 roundings: 1e-15 relative.
    assert ess == pytest.approx(1.2 ** 2 / 1.6, rel=1e-15) and ppl == pytest.approx(math.exp(-0.1), rel=1e-15)
    empty = step.LossSums().means()
    assert empty["train/entropy"] == 0.0 and empty["rollout_correction/ess"] == 0.0  # no division by zero
    assert empty["rollout_correction/ppl_ratio"] == 1.0


def test_loss_sums_add_sums_and_keeps_the_largest_maximum():
    n = len(step.LossSums().values)
    assert n == 17  # 3 shares + 12 token means + 1 maximum + the token count
    a = step.LossSums(np.arange(n, dtype=np.float64))
    b = np.arange(n, dtype=np.float64)[::-1].copy()
    a.add(b)
    expected = np.full(n, n - 1.0)
    expected[-2] = n - 2.0  # the maximum of 15 (a's) and 1 (b's), not their sum
    np.testing.assert_array_equal(a.values, expected)
    assert step.LossSums(a.values.copy()).reduced(ParallelContext()).values.tolist() == expected.tolist()


def test_update_metrics_average_finite_mini_batches_and_drop_kl_loss_without_it():
    per_mini = [{"train/policy_loss": 1.0, "train/kl_loss": 0.0, "train/positive_lm_loss": 0.5, "train/grad_norm": 2.0},
                {"train/policy_loss": 3.0, "train/kl_loss": 0.0, "train/positive_lm_loss": 1.5,
                 "train/grad_norm": float("nan")}]
    out = step.UpdateMetrics(per_mini, nonfinite_updates=1, optimizer_steps=2, with_kl_loss=False).as_dict()
    assert out == {"train/policy_loss": 2.0, "train/grad_norm": 2.0, "train/nonfinite_updates": 1.0,
                   "train/optimizer_steps": 2.0}
    with_positive = step.UpdateMetrics(per_mini, 1, 2, with_kl_loss=False, with_positive_lm_loss=True).as_dict()
    assert with_positive["train/positive_lm_loss"] == 1.0
