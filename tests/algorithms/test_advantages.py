"""Advantage estimators against plain-python loop references (docs/algorithms.md section 2).

Tolerances (tests/numerics.py): float32 outputs against float64 references. A group statistic is a float32 sum over
at most 5 members of scores ~N(0, 3), then a subtraction and a division: f32_sum_tol(5, 9, depth=3) = 1.6e-5 at
worst absolutely, ~sqrt(5) u in practice, so RTOL = ATOL = 1e-5. Whitened values (REINFORCE++) divide by a batch
std from a float32 mean and variance over up to 90 tokens: f32_sum_tol(90, 1, depth=2) = 2.1e-5 relative to the
returns' size, 1e-4 with the division. These are paddle's elementwise and reduction kernels, compiled in (the same on
any x86 CPU with AVX); MKL's kernels, which differ by CPU, do not run here.
"""
import math
from collections import defaultdict

import numpy as np
import paddle
import pytest

from paddle_grpo.algorithms import (
    UnknownNameError,
    advantage_estimator_spec,
    available_advantage_estimators,
    get_advantage_estimator,
    scalar_to_token_level,
)

pytestmark = pytest.mark.numerics  # compares float results: CI reruns it on other CPU kernels

RTOL, ATOL = 1e-5, 1e-5


# ---- random batches --------------------------------------------------------------------------------------------------

def ragged_lengths(rng, bs, T, empty_rows=0):
    lengths = rng.integers(1, T + 1, size=bs)
    lengths[rng.choice(bs, size=empty_rows, replace=False)] = 0
    return lengths


def mask_from_lengths(lengths, T):
    return (np.arange(T)[None, :] < np.asarray(lengths)[:, None]).astype(np.int64)


def grouped_ids(rng, sizes):
    """Non-contiguous, non-consecutive group ids with the given group sizes, shuffled."""
    labels = rng.choice(np.arange(1000), size=len(sizes), replace=False)
    ids = np.concatenate([[label] * s for label, s in zip(labels, sizes)])
    rng.shuffle(ids)
    return ids


def token_rewards_np(scores, lengths, T):
    out = np.zeros((len(scores), T))
    for i, (s, n) in enumerate(zip(scores, lengths)):
        if n > 0:
            out[i, n - 1] = s
    return out


def as_index(ids, kind):
    if kind == "list":
        return [int(x) for x in ids]
    if kind == "paddle":
        return paddle.to_tensor(ids.astype(np.int64))
    return ids


def random_case(seed, T=6, sizes=(3, 1, 4, 2, 5), empty_rows=1):
    rng = np.random.default_rng(seed)
    ids = grouped_ids(rng, sizes)
    bs = len(ids)
    lengths = ragged_lengths(rng, bs, T, empty_rows)
    scores = rng.normal(0.0, 3.0, size=bs).astype(np.float32).astype(np.float64)
    return rng, ids, lengths, scores


# ---- loop references ------------------------------------------------------------------------------------------------

def group_members(ids, lengths):
    members = defaultdict(list)
    for i, (g, n) in enumerate(zip(ids, lengths)):
        if n > 0:
            members[g].append(i)
    return members


def ref_grpo(scores, lengths, ids, T, norm_adv_by_std=True, eps=1e-6):
    members = group_members(ids, lengths)
    adv = np.zeros((len(scores), T))
    for i, n in enumerate(lengths):
        if n == 0:
            continue
        group = [scores[j] for j in members[ids[i]]]
        if len(group) == 1:
            mean, std = 0.0, 1.0
        else:
            mean = sum(group) / len(group)
            std = math.sqrt(sum((x - mean) ** 2 for x in group) / (len(group) - 1))
        a = (scores[i] - mean) / (std + eps) if norm_adv_by_std else scores[i] - mean
        adv[i, :n] = a
    return adv


def ref_rloo(scores, lengths, ids, T):
    members = group_members(ids, lengths)
    adv = np.zeros((len(scores), T))
    for i, n in enumerate(lengths):
        if n == 0:
            continue
        others = [scores[j] for j in members[ids[i]] if j != i]
        adv[i, :n] = scores[i] - sum(others) / len(others) if others else 0.0
    return adv


def ref_kl(old, ref, estimator):
    d = min(max(ref - old, -20.0), 20.0)
    k = {"k1": -d, "k2": d * d / 2, "k3": math.exp(d) - d - 1}[estimator]
    return min(max(k, -10.0), 10.0)


def ref_reinforce_pp(scores, lengths, T, gamma=1.0, kl_coeff=0.0, old=None, ref=None, kl_estimator="k1"):
    bs = len(scores)
    returns = np.zeros((bs, T))
    for i in range(bs):
        r = [0.0] * T
        for t in range(lengths[i]):
            r[t] = -kl_coeff * ref_kl(old[i, t], ref[i, t], kl_estimator) if kl_coeff else 0.0
        if lengths[i] > 0:
            r[lengths[i] - 1] += scores[i]
        for t in range(lengths[i]):
            returns[i, t] = sum(gamma ** (s - t) * r[s] for s in range(t, T))
    valid = [returns[i, t] for i in range(bs) for t in range(lengths[i])]
    mu = sum(valid) / len(valid)
    var = sum((x - mu) ** 2 for x in valid) / (len(valid) - 1)
    adv = np.zeros((bs, T))
    for i in range(bs):
        for t in range(lengths[i]):
            adv[i, t] = (returns[i, t] - mu) / math.sqrt(var + 1e-8)
    return adv, returns


def ref_baseline_scores(scores, lengths, ids):
    members = group_members(ids, lengths)
    out = np.zeros(len(scores))
    for i, n in enumerate(lengths):
        if n == 0:
            continue
        group = [scores[j] for j in members[ids[i]]]
        out[i] = scores[i] - (sum(group) / len(group) if len(group) > 1 else 0.0)
    return out


def run(name, scores, lengths, ids, T, dtype="float32", index_kind="numpy", **options):
    rewards = paddle.to_tensor(token_rewards_np(scores, lengths, T)).astype(dtype)
    mask = paddle.to_tensor(mask_from_lengths(lengths, T))
    adv, ret = get_advantage_estimator(name)(rewards, mask, as_index(ids, index_kind), **options)
    return adv, ret


# ---- GRPO / Dr.GRPO --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("seed,index_kind", [(0, "list"), (1, "numpy"), (2, "paddle"), (3, "list")])
@pytest.mark.parametrize("norm_adv_by_std", [True, False])
def test_grpo_matches_loop_reference(seed, index_kind, norm_adv_by_std):
    T = 5 + seed
    _, ids, lengths, scores = random_case(seed, T=T, sizes=(3, 1, 4, 2, 5, 1)[: 4 + seed % 3], empty_rows=1)
    adv, ret = run("grpo", scores, lengths, ids, T, index_kind=index_kind, norm_adv_by_std=norm_adv_by_std)
    assert adv.dtype == paddle.float32 and list(adv.shape) == [len(ids), T]
    expected = ref_grpo(scores, lengths, ids, T, norm_adv_by_std)
    np.testing.assert_allclose(adv.numpy(), expected, rtol=RTOL, atol=ATOL)
    np.testing.assert_array_equal(ret.numpy(), adv.numpy())


def test_grpo_epsilon_option():
    scores = np.array([1.0, 2.0, 4.0])
    adv, _ = run("grpo", scores, [2, 2, 2], [7, 7, 7], 2, epsilon=0.5)
    np.testing.assert_allclose(adv.numpy(), ref_grpo(scores, [2, 2, 2], [7, 7, 7], 2, eps=0.5), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("name", ["grpo", "rloo", "reinforce_plus_plus_baseline"])
@pytest.mark.parametrize("value", [0.1, 1.0 / 3.0, -7.3, 1e4 + 0.1])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_all_equal_group_gives_exactly_zero(name, value, dtype):
    # A plain float mean of equal values is not always that value again (0.1 + 0.1 + 0.1 != 0.3 in float64);
    # the advantages must still be exactly 0.
    ids = [5, 9, 5, 9, 5, 5, 5, 5, 5]
    scores = np.array([value, 1.0, value, 2.0, value, value, value, value, value], dtype=dtype).astype(float)
    lengths = [3, 2, 4, 1, 3, 3, 2, 1, 4]
    opts = {"norm_adv_by_std": False} if name == "grpo" and value < 0 else {}
    adv, ret = run(name, scores, lengths, ids, 4, dtype=dtype, **opts)
    adv, ret = adv.numpy(), ret.numpy()
    assert np.isfinite(adv).all() and np.isfinite(ret).all()
    rows = [i for i, g in enumerate(ids) if g == 5]
    if name == "reinforce_plus_plus_baseline":
        # the baseline-subtracted reward of every equal member is exactly 0, so its returns are exactly 0
        assert (ret[rows] == 0).all()
    else:
        assert (adv[rows] == 0).all()


@pytest.mark.parametrize("value", [0.1, 1.0 / 3.0, 77.7])
def test_reinforce_pp_equal_returns_whiten_to_exactly_zero(value):
    lengths = [5, 5, 5, 5, 5, 5, 5]
    adv, ret = run("reinforce_plus_plus", np.full(7, value), lengths, list(range(7)), 5)
    np.testing.assert_allclose(ret.numpy(), np.full((7, 5), value), rtol=1e-6)
    assert (adv.numpy() == 0).all()


def test_grpo_group_of_size_one_has_mean_0_std_1():
    scores = np.array([2.5, -1.0, 3.0])
    adv, _ = run("grpo", scores, [3, 2, 1], [0, 1, 1], 3)
    np.testing.assert_allclose(adv.numpy()[0], [2.5 / (1 + 1e-6)] * 3, rtol=1e-6)
    adv, _ = run("grpo", scores, [3, 2, 1], [0, 1, 1], 3, norm_adv_by_std=False)
    np.testing.assert_allclose(adv.numpy()[0], [2.5] * 3, rtol=1e-6)
    np.testing.assert_allclose(adv.numpy()[1:], [[-2, -2, 0], [2, 0, 0]], rtol=1e-6)


def test_rows_without_valid_tokens_take_no_part_in_group_statistics():
    # Row 1 is fully masked (e.g. no reward function could judge it): it gets 0 and the group is {0, 2}.
    scores = np.array([1.0, 100.0, 3.0])
    adv, _ = run("grpo", scores, [2, 0, 2], [4, 4, 4], 2, norm_adv_by_std=False)
    np.testing.assert_allclose(adv.numpy(), [[-1, -1], [0, 0], [1, 1]], rtol=1e-6)
    adv, _ = run("rloo", scores, [2, 0, 2], [4, 4, 4], 2)
    np.testing.assert_allclose(adv.numpy(), [[-2, -2], [0, 0], [2, 2]], rtol=1e-6)


def test_fully_masked_batch_is_all_zero_without_nan():
    for name in available_advantage_estimators():
        # critic estimators: values in padding are garbage by contract (inf / NaN must not leak)
        values = {"values": paddle.to_tensor([[np.inf, np.nan, 1.0]] * 2)} \
            if advantage_estimator_spec(name).needs_values else {}
        adv, ret = run(name, np.array([1.0, 2.0]), [0, 0], [0, 0], 3, **values)
        assert (adv.numpy() == 0).all() and (ret.numpy() == 0).all(), name


def test_reward_in_padding_is_ignored():
    rewards = paddle.to_tensor([[0.0, 1.0, 50.0], [0.0, 3.0, 0.0]])  # 50 sits on a masked position
    mask = paddle.to_tensor([[1, 1, 0], [1, 1, 0]])
    adv, _ = get_advantage_estimator("grpo")(rewards, mask, [0, 0], norm_adv_by_std=False)
    np.testing.assert_allclose(adv.numpy(), [[-1, -1, 0], [1, 1, 0]], rtol=1e-6)


# ---- RLOO ------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", [0, 1, 2])
def test_rloo_matches_loop_reference(seed):
    _, ids, lengths, scores = random_case(seed + 10, T=7, sizes=(2, 5, 1, 3), empty_rows=1)
    adv, ret = run("rloo", scores, lengths, ids, 7, index_kind=["list", "numpy", "paddle"][seed])
    np.testing.assert_allclose(adv.numpy(), ref_rloo(scores, lengths, ids, 7), rtol=RTOL, atol=ATOL)
    np.testing.assert_array_equal(ret.numpy(), adv.numpy())


def test_rloo_group_of_one_is_zero():
    adv, _ = run("rloo", np.array([5.0, 1.0, 2.0]), [2, 2, 2], ["a", "b", "b"], 2)
    np.testing.assert_allclose(adv.numpy(), [[0, 0], [-1, -1], [1, 1]], rtol=1e-6)


# ---- REINFORCE++ -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_reinforce_pp_matches_loop_reference(seed, gamma):
    T = 6
    _, ids, lengths, scores = random_case(seed + 20, T=T, sizes=(4, 3, 5), empty_rows=1)
    adv, ret = run("reinforce_plus_plus", scores, lengths, ids, T, gamma=gamma)
    exp_adv, exp_ret = ref_reinforce_pp(scores, lengths, T, gamma)
    np.testing.assert_allclose(ret.numpy(), exp_ret, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(adv.numpy(), exp_adv, rtol=1e-4, atol=ATOL)


@pytest.mark.parametrize("kl_estimator", ["k1", "k2", "k3"])
def test_reinforce_pp_with_kl_in_reward(kl_estimator):
    T = 5
    rng, ids, lengths, scores = random_case(30, T=T, sizes=(3, 4), empty_rows=1)
    old = rng.normal(-1.0, 0.5, size=(len(ids), T))
    ref = old + rng.normal(0.0, 0.7, size=old.shape)
    ref[0, 0] = old[0, 0] + 50.0  # exercises both clamps
    old_t, ref_t = paddle.to_tensor(old.astype(np.float32)), paddle.to_tensor(ref.astype(np.float32))
    adv, ret = run("reinforce_plus_plus", scores, lengths, ids, T, gamma=0.95, kl_coeff=0.3,
                   old_log_probs=old_t, ref_log_probs=ref_t, kl_estimator=kl_estimator)
    exp_adv, exp_ret = ref_reinforce_pp(scores, lengths, T, 0.95, 0.3, old_t.numpy().astype(float),
                                        ref_t.numpy().astype(float), kl_estimator)
    np.testing.assert_allclose(ret.numpy(), exp_ret, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(adv.numpy(), exp_adv, rtol=1e-4, atol=ATOL)


def test_reinforce_pp_discount_skips_masked_positions_inside_a_row():
    # A multi-turn row: actions, a tool turn (masked: context, not actions), actions. The discount counts actions
    # only, as GAE's does. Row 0 by hand, gamma 0.5, reward 1 on the last action (position 4):
    # G_4 = 1, G_3 = 0.5, G_0 = 0.5 * G_3 = 0.25 (counting positions would give 0.5^4 = 0.0625).
    mask = np.array([[1, 0, 0, 1, 1, 0], [1, 1, 0, 1, 0, 0], [1, 1, 1, 1, 1, 1]], dtype=np.int64)
    rng = np.random.default_rng(7)
    rewards = rng.normal(size=mask.shape).astype(np.float32) * mask
    rewards[0] = [0, 0, 0, 0, 1, 0]
    _, ret = get_advantage_estimator("reinforce_plus_plus")(paddle.to_tensor(rewards), paddle.to_tensor(mask), None,
                                                            gamma=0.5)
    np.testing.assert_allclose(ret.numpy()[0], [0.25, 0, 0, 0.5, 1.0, 0], rtol=RTOL, atol=ATOL)
    # Every row against a second implementation: GAE with lam 1 and zero values is the discounted return over the
    # row's valid tokens (gae.py's float64 numpy recursion). Sums of <= 6 terms of size <= 3: within RTOL / ATOL.
    gae_ret, _ = get_advantage_estimator("ppo")(paddle.to_tensor(rewards), paddle.to_tensor(mask), None,
                                                values=paddle.zeros(mask.shape), gamma=0.5, lam=1.0)
    np.testing.assert_allclose(ret.numpy(), gae_ret.numpy(), rtol=RTOL, atol=ATOL)


def test_reinforce_pp_whitening_epsilon_is_inside_the_sqrt():
    # returns with a variance of the order of the 1e-8 epsilon tell sqrt(var + eps) from sqrt(var) + eps
    scores = np.array([0.0, 1e-4, 2e-4, 0.5e-4], dtype=np.float32).astype(float)
    lengths = [2, 3, 1, 2]
    adv, _ = run("reinforce_plus_plus", scores, lengths, [0, 1, 2, 3], 3)
    exp_adv, _ = ref_reinforce_pp(scores, lengths, 3)
    np.testing.assert_allclose(adv.numpy(), exp_adv, rtol=1e-4, atol=1e-6)


def test_reinforce_pp_default_kl_estimator_is_k1():
    old = paddle.to_tensor([[-1.0, -2.0]])
    ref = paddle.to_tensor([[-1.5, -1.0]])
    rewards, mask = paddle.to_tensor([[0.0, 1.0]]), paddle.to_tensor([[1, 1]])
    _, ret = get_advantage_estimator("reinforce_plus_plus")(rewards, mask, None, kl_coeff=1.0, old_log_probs=old,
                                                            ref_log_probs=ref)
    # k1 = l_old - l_ref: r = [-(0.5), -(-1) + 1] = [-0.5, 2]
    np.testing.assert_allclose(ret.numpy(), [[1.5, 2.0]], rtol=1e-6)


def test_reinforce_pp_kl_argument_errors():
    with pytest.raises(ValueError, match="old_log_probs"):
        run("reinforce_plus_plus", np.array([1.0, 2.0]), [1, 2], [0, 0], 2, kl_coeff=0.1)
    with pytest.raises(UnknownNameError, match="k3"):
        run("reinforce_plus_plus_baseline", np.array([1.0, 2.0]), [1, 2], [0, 0], 2, kl_estimator="kl")


@pytest.mark.parametrize("seed", [0, 1])
def test_reinforce_pp_baseline_matches_loop_reference(seed):
    T = 5
    _, ids, lengths, scores = random_case(seed + 40, T=T, sizes=(3, 1, 4, 2), empty_rows=1)
    adv, ret = run("reinforce_plus_plus_baseline", scores, lengths, ids, T, gamma=0.8)
    exp_adv, exp_ret = ref_reinforce_pp(ref_baseline_scores(scores, lengths, ids), lengths, T, 0.8)
    np.testing.assert_allclose(ret.numpy(), exp_ret, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(adv.numpy(), exp_adv, rtol=1e-4, atol=ATOL)


# ---- dtype, helpers, registry ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_low_precision_input_gives_float32(name, dtype):
    scores = np.array([1.0, 2.0, 0.5, 4.0])  # exactly representable in bf16 / fp16
    adv, ret = run(name, scores, [2, 3, 1, 3], [0, 0, 1, 1], 3, dtype=dtype)
    ref_adv, ref_ret = run(name, scores, [2, 3, 1, 3], [0, 0, 1, 1], 3, dtype="float32")
    assert adv.dtype == paddle.float32 and ret.dtype == paddle.float32
    np.testing.assert_array_equal(adv.numpy(), ref_adv.numpy())
    np.testing.assert_array_equal(ret.numpy(), ref_ret.numpy())


def test_scalar_to_token_level_places_reward_on_last_valid_token():
    mask = paddle.to_tensor([[1, 1, 1, 0], [1, 0, 1, 0], [0, 0, 0, 0], [1, 1, 1, 1]])
    out = scalar_to_token_level(paddle.to_tensor([1.0, 2.0, 3.0, 4.0]), mask)
    expected = np.zeros((4, 4))
    for i, row in enumerate(mask.numpy()):
        valid = np.flatnonzero(row)
        if len(valid):
            expected[i, valid[-1]] = i + 1
    np.testing.assert_array_equal(out.numpy(), expected)
    assert out.dtype == paddle.float32


def test_index_length_mismatch_is_an_error():
    with pytest.raises(ValueError, match="index"):
        run("grpo", np.array([1.0, 2.0]), [1, 1], [0, 0, 0], 2)


def test_unknown_option_is_an_error():
    with pytest.raises(TypeError):
        run("grpo", np.array([1.0, 2.0]), [1, 1], [0, 0], 2, kl_coeff=0.1)


def test_unknown_estimator_lists_valid_names():
    with pytest.raises(UnknownNameError) as info:
        get_advantage_estimator("gae")
    assert isinstance(info.value, ValueError) and isinstance(info.value, KeyError)
    for name in ("grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline"):
        assert name in str(info.value)
    assert "'gae'" in str(info.value)
