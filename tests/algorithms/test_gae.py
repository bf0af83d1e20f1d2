"""GAE (`ppo`), VAPO's decoupled / length-adaptive GAE (`vapo`) and PaddleNLP's PPO reward (`kl_token_rewards`),
against references written here: the definitional sum of GAE over each row's valid tokens (not a recursion), a
transcription of PaddleNLP's all-positions loop for right-padded masks, hand-computed cases, and per-token loops.

Tolerances. The estimators keep their state in float64 and round each output once to float32: |out - exact| <=
u |exact| (u = 2^-24) plus the float64 error. The references are float64 from the same float32 inputs, so they are
exact to ~1e-16 relative. The float64 error of either side: at most ~3 roundings per step (delta, the recursion,
the sum with V) over at most T steps, of values bounded by sum_t |delta_t| <= T * max|delta| (<= 32 * 8 here):
3 * 32 * 2^-53 * 256 ~ 3e-12; ATOL64 = 1e-11 covers it. RTOL32 = 2u covers the output rounding with margin.
"""
import numpy as np
import paddle
import pytest

from paddle_grpo.algorithms import (
    advantage_estimator_spec,
    gae_advantage,
    get_advantage_estimator,
    kl_token_rewards,
    scalar_to_token_level,
    vapo_advantage,
    vapo_policy_lambda,
)
from tests.numerics import EPS32

pytestmark = pytest.mark.numerics

RTOL32 = 2 * EPS32
ATOL64 = 1e-11


# ---- references ------------------------------------------------------------------------------------------------------

def gae_reference(rewards, values, mask, gamma, lam_per_row):
    """Definitional GAE over each row's valid positions p_0 < ... < p_{n-1}:
    A_k = sum_{j >= k} (gamma lam)^(j - k) delta_j, delta_j = r_j + gamma V_{j+1} - V_j, V_n = 0. Plain python."""
    bs, T = rewards.shape
    adv = np.zeros((bs, T))
    for i in range(bs):
        pos = [t for t in range(T) if mask[i, t]]
        n = len(pos)
        v = [float(values[i, p]) for p in pos] + [0.0]
        delta = [float(rewards[i, p]) + gamma * v[k + 1] - v[k] for k, p in enumerate(pos)]
        for k in range(n):
            adv[i, pos[k]] = sum((gamma * lam_per_row[i]) ** (j - k) * delta[j] for j in range(k, n))
    returns = np.where(mask, adv + np.where(mask, values, 0.0), 0.0)
    return adv, returns


def paddlenlp_style_gae(rewards, values, mask, gamma, lam):
    """PaddleNLP's compute_gae_advantage_return, transcribed to numpy: rewards and values multiplied by the mask,
    the recursion over ALL positions (next value 0 after the end). Its advantages are not masked."""
    values = values * mask
    rewards = rewards * mask
    T = rewards.shape[1]
    last = np.zeros(rewards.shape[0])
    out = np.zeros_like(rewards, dtype=np.float64)
    for t in reversed(range(T)):
        next_values = values[:, t + 1] if t < T - 1 else 0.0
        delta = rewards[:, t] + gamma * next_values - values[:, t]
        last = delta + gamma * lam * last
        out[:, t] = last
    return out, out + values


def random_case(seed, bs=9, T=12, holes=False, garbage=True):
    """float32 rewards / values; lengths include 0 (no valid token), 1 and T; with `holes`, masks are not
    right-padded (random positions inside the row are 0). With `garbage`, padding holds inf / NaN (never read)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, T + 1, size=bs)
    lengths[:3] = [0, 1, T][:bs]
    mask = np.arange(T)[None, :] < lengths[:, None]
    if holes:
        mask &= rng.random((bs, T)) > 0.3
    rewards = rng.normal(size=(bs, T)).astype(np.float32)
    values = rng.normal(size=(bs, T)).astype(np.float32)
    if garbage:
        rewards[~mask] = np.nan
        values[~mask] = np.where(rng.random(int((~mask).sum())) < 0.5, np.inf, np.nan)
    return rewards, values, mask


# ---- gae_advantage ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("seed,holes", [(0, False), (1, True), (2, True), (3, False)])
@pytest.mark.parametrize("gamma,lam", [(1.0, 0.95), (0.9, 0.8), (1.0, 1.0), (0.99, 0.0)])
def test_gae_matches_definitional_sum(seed, holes, gamma, lam):
    rewards, values, mask = random_case(seed, holes=holes)
    adv, ret = gae_advantage(paddle.to_tensor(rewards), paddle.to_tensor(mask.astype(np.float32)), None,
                             values=paddle.to_tensor(values), gamma=gamma, lam=lam)
    assert adv.dtype == ret.dtype == paddle.float32 and list(adv.shape) == list(rewards.shape)
    ref_adv, ref_ret = gae_reference(rewards.astype(np.float64), values.astype(np.float64), mask, gamma,
                                     [lam] * len(rewards))
    np.testing.assert_allclose(adv.numpy(), ref_adv, rtol=RTOL32, atol=ATOL64)
    np.testing.assert_allclose(ret.numpy(), ref_ret, rtol=RTOL32, atol=ATOL64)
    assert (adv.numpy()[~mask] == 0).all() and (ret.numpy()[~mask] == 0).all()


@pytest.mark.parametrize("gamma,lam", [(1.0, 0.95), (0.9, 0.7)])
def test_gae_equals_paddlenlp_on_right_padded_masks(gamma, lam):
    rewards, values, mask = random_case(4, bs=16, T=20, garbage=False)  # PaddleNLP multiplies padding by 0
    m = mask.astype(np.float64)
    ref_adv, ref_ret = paddlenlp_style_gae(rewards.astype(np.float64), values.astype(np.float64), m, gamma, lam)
    adv, ret = gae_advantage(rewards, mask, None, values=values, gamma=gamma, lam=lam)
    # PaddleNLP leaves padding unmasked (0 there for right padding: nothing follows the end); compare on the mask
    np.testing.assert_allclose(adv.numpy(), ref_adv * m, rtol=RTOL32, atol=ATOL64)
    np.testing.assert_allclose(ret.numpy(), ref_ret * m, rtol=RTOL32, atol=ATOL64)


def test_gae_hand_computed():
    # r = [0, 0, 1], V = [0.5, 0.6, 0.7], gamma 1, lam 0.95:
    # delta = [0.6 - 0.5, 0.7 - 0.6, 1 - 0.7] = [0.1, 0.1, 0.3]
    # A_2 = 0.3, A_1 = 0.1 + 0.95 * 0.3 = 0.385, A_0 = 0.1 + 0.95 * 0.385 = 0.46575; R = A + V
    # second row: length 1, r = 2, V = 0.5: A = 2 - 0.5 = 1.5, R = 2 (values in padding are garbage)
    rewards = np.array([[0, 0, 1, 0], [2, 0, 0, 0]], dtype=np.float64)
    values = np.array([[0.5, 0.6, 0.7, 9.0], [0.5, np.nan, np.inf, -np.inf]])
    mask = np.array([[1, 1, 1, 0], [1, 0, 0, 0]])
    adv, ret = gae_advantage(rewards, mask, None, values=values)
    assert adv.dtype == paddle.float64  # float64 in, float64 out
    # float64 all through, a few roundings of values <= 2: 1e-15
    np.testing.assert_allclose(adv.numpy(), [[0.46575, 0.385, 0.3, 0], [1.5, 0, 0, 0]], rtol=0, atol=1e-15)
    np.testing.assert_allclose(ret.numpy(), [[0.96575, 0.985, 1.0, 0], [2.0, 0, 0, 0]], rtol=0, atol=1e-15)


def test_gae_skips_holes_and_ignores_garbage():
    # A hole at position 1: the row is the 2-token sequence (positions 0, 2). gamma 0.5, lam 1:
    # delta_2 = 1 - 0.25 = 0.75, delta_0 = 0 + 0.5 * 0.25 - 1 = -0.875; A_2 = 0.75, A_0 = -0.875 + 0.5 * 0.75 = -0.5
    rewards = np.array([[0.0, np.nan, 1.0, np.inf]])
    values = np.array([[1.0, np.inf, 0.25, np.nan]])
    mask = np.array([[1, 0, 1, 0]])
    adv, ret = gae_advantage(rewards, mask, None, values=values, gamma=0.5, lam=1.0)
    np.testing.assert_allclose(adv.numpy(), [[-0.5, 0, 0.75, 0]], rtol=0, atol=1e-15)
    np.testing.assert_allclose(ret.numpy(), [[0.5, 0, 1.0, 0]], rtol=0, atol=1e-15)


def test_gae_refuses_bad_input():
    r, v, m = random_case(5)
    with pytest.raises(ValueError, match="needs values"):
        gae_advantage(r, m, None)
    with pytest.raises(ValueError, match="shape mismatch"):
        gae_advantage(r, m, None, values=v[:, :-1])
    with pytest.raises(ValueError, match="lam must be in"):
        gae_advantage(r, m, None, values=v, lam=1.5)
    with pytest.raises(ValueError, match="gamma must be in"):
        gae_advantage(r, m, None, values=v, gamma=-0.1)


def test_registered_as_ppo_without_whitening():
    spec = advantage_estimator_spec("ppo")
    assert spec.fn is gae_advantage and spec.needs_values and spec.kl_in_reward == "token_rewards"
    rewards, values, mask = random_case(6)
    adv, _ = get_advantage_estimator("ppo")(rewards, mask, np.arange(len(rewards)), values=values)
    ref, _ = gae_reference(rewards.astype(np.float64), values.astype(np.float64), mask, 1.0, [0.95] * len(rewards))
    np.testing.assert_allclose(adv.numpy(), ref, rtol=RTOL32, atol=ATOL64)  # not whitened: the raw GAE


# ---- vapo_advantage --------------------------------------------------------------------------------------------------

def test_vapo_policy_lambda_clamps_below_one_over_alpha():
    lengths = np.array([0, 1, 10, 19, 20, 21, 40, 1000])
    lam = vapo_policy_lambda(lengths, 0.05)
    # 1 - 1 / (0.05 l): l = 20 -> 0, l = 21 -> 1 - 20/21, l = 40 -> 0.5, l = 1000 -> 0.98; below 20 tokens: 0
    expected = [0, 0, 0, 0, 0, 1 - 20 / 21, 0.5, 0.98]
    np.testing.assert_allclose(lam, expected, rtol=0, atol=1e-15)  # float64, two roundings of values <= 1
    assert (lam >= 0).all()


@pytest.mark.parametrize("seed,holes", [(0, False), (1, True), (7, False)])
@pytest.mark.parametrize("alpha,lam_critic,gamma", [(0.05, 1.0, 1.0), (0.3, 0.9, 0.95)])
def test_vapo_matches_definitional_sums(seed, holes, alpha, lam_critic, gamma):
    rewards, values, mask = random_case(seed, bs=11, T=30, holes=holes)
    adv, ret = vapo_advantage(rewards, mask, None, values=values, gamma=gamma, lam_critic=lam_critic, alpha=alpha)
    lengths = mask.sum(-1)
    # the policy lambda written out here, not through vapo_policy_lambda
    lam_policy = [max(0.0, 1.0 - 1.0 / (alpha * n)) if n else 0.0 for n in lengths]
    r64, v64 = rewards.astype(np.float64), values.astype(np.float64)
    ref_adv, _ = gae_reference(r64, v64, mask, gamma, lam_policy)
    _, ref_ret = gae_reference(r64, v64, mask, gamma, [lam_critic] * len(rewards))
    np.testing.assert_allclose(adv.numpy(), ref_adv, rtol=RTOL32, atol=ATOL64)
    np.testing.assert_allclose(ret.numpy(), ref_ret, rtol=RTOL32, atol=ATOL64)


def test_vapo_returns_with_lam_critic_1_are_monte_carlo_returns():
    # gamma = lam = 1: the values telescope away, R_t = sum_{s >= t} r_s over valid tokens, whatever the critic says
    rewards, values, mask = random_case(8, bs=6, T=25, holes=True)
    _, ret = vapo_advantage(rewards, mask, None, values=values)
    r = np.where(mask, rewards.astype(np.float64), 0.0)
    mc = np.where(mask, np.cumsum(r[:, ::-1], axis=1)[:, ::-1], 0.0)
    # the float64 telescoping leaves ~T roundings of |V| + |R| <= 30: 25 * 3 * 2^-53 * 30 ~ 2.5e-13
    np.testing.assert_allclose(ret.numpy(), mc, rtol=RTOL32, atol=ATOL64)


def test_vapo_short_rows_get_one_step_td_advantages():
    # alpha 0.05: rows shorter than 20 tokens get lam_policy 0, so A_t = r_t + V_{t+1} - V_t exactly (gamma 1)
    rewards, values, mask = random_case(9, bs=5, T=19)
    adv, _ = vapo_advantage(rewards, mask, None, values=values)
    r = np.where(mask, rewards.astype(np.float64), 0.0)
    v = np.where(mask, values.astype(np.float64), 0.0)
    next_v = np.concatenate([v[:, 1:], np.zeros((len(v), 1))], axis=1)  # right-padded: 0 after the end
    np.testing.assert_allclose(adv.numpy(), np.where(mask, r + next_v - v, 0.0), rtol=RTOL32, atol=ATOL64)


def test_vapo_long_rows_equal_gae_with_their_lambda():
    # one row of 40 valid tokens: lam_policy = 1 - 1 / (0.05 * 40) = 0.5, so its advantage is ppo's with lam 0.5
    rewards, values, _ = random_case(10, bs=1, T=40, garbage=False)
    mask = np.ones((1, 40), dtype=bool)
    adv, _ = vapo_advantage(rewards, mask, None, values=values)
    ppo, _ = gae_advantage(rewards, mask, None, values=values, lam=0.5)
    np.testing.assert_array_equal(adv.numpy(), ppo.numpy())  # same code path, same process: bitwise


def test_vapo_refuses_bad_alpha():
    r, v, m = random_case(11)
    with pytest.raises(ValueError, match="vapo_alpha"):
        vapo_advantage(r, m, None, values=v, alpha=0.0)
    with pytest.raises(ValueError, match="lam_critic must be in"):
        vapo_advantage(r, m, None, values=v, lam_critic=2.0)


# ---- kl_token_rewards ------------------------------------------------------------------------------------------------

def kl_rewards_reference(scores, mask, old, ref, kl_coeff):
    """Per-token loop: -kl_coeff * (old - ref) on valid tokens (k1), the score added on the last valid one."""
    bs, T = mask.shape
    out = np.zeros((bs, T))
    for i in range(bs):
        valid = [t for t in range(T) if mask[i, t]]
        for t in valid:
            out[i, t] = -kl_coeff * (float(old[i, t]) - float(ref[i, t]))
        if valid:
            out[i, valid[-1]] += float(scores[i])
    return out


def paddlenlp_style_kl_rewards(scores, mask, old, ref, kl_coeff):
    """PaddleNLP's add_kl_divergence_regularization, transcribed: -kl_coeff (old - ref) on EVERY position, the
    score added at argmax(cumsum(mask)) (the last valid token)."""
    rewards = -kl_coeff * (old - ref)
    last = np.argmax(np.cumsum(mask.astype(np.int64), axis=-1), axis=-1)
    rewards[np.arange(len(scores)), last] += scores
    return rewards


@pytest.mark.parametrize("holes", [False, True])
def test_kl_token_rewards_match_loop(holes):
    rng = np.random.default_rng(12)
    _, _, mask = random_case(12, bs=10, T=15, holes=holes)
    scores = rng.uniform(-10, 10, size=10).astype(np.float32)
    old = rng.normal(-2, 1, size=mask.shape).astype(np.float32)
    ref = rng.normal(-2, 1, size=mask.shape).astype(np.float32)
    out = kl_token_rewards(scores, mask, old, ref, kl_coeff=0.05)
    expected = kl_rewards_reference(scores, mask, old, ref, 0.05)
    # float32: ref - old (1 rounding), times -kl_coeff (1), plus the score (1): <= 3 u of |kl term| + |score| <= 11
    np.testing.assert_allclose(out.numpy(), expected, rtol=0, atol=3 * EPS32 * 11)
    if not holes:  # PaddleNLP's formula, on the valid tokens (it leaves the KL on padding; GAE masks it there)
        pn = paddlenlp_style_kl_rewards(scores.astype(np.float64), mask, old.astype(np.float64),
                                        ref.astype(np.float64), 0.05)
        valid = mask.any(-1)  # PaddleNLP puts an empty row's score on position 0; such a row has no token here
        np.testing.assert_allclose(out.numpy()[valid], (pn * mask)[valid], rtol=0, atol=3 * EPS32 * 11)


def test_kl_token_rewards_without_kl_is_scalar_to_token_level():
    rng = np.random.default_rng(13)
    _, _, mask = random_case(13, holes=True)
    scores = rng.normal(size=len(mask)).astype(np.float32)
    base = scalar_to_token_level(paddle.to_tensor(scores), paddle.to_tensor(mask)).numpy()
    lp = rng.normal(size=mask.shape).astype(np.float32)
    for out in (kl_token_rewards(scores, mask, lp, lp + 1, kl_coeff=0.0), kl_token_rewards(scores, mask),
                kl_token_rewards(scores, mask, None, None, kl_coeff=0.1)):
        np.testing.assert_array_equal(out.numpy(), base)  # the same function in the same process: bitwise


def test_kl_token_rewards_other_estimator_and_garbage():
    # k3 = exp(d) - d - 1 with d = ref - old; padding holds -inf log-probs (must not leak)
    scores = np.array([1.0, -1.0])
    mask = np.array([[1, 1, 0], [1, 0, 0]])
    old = np.array([[-1.0, -2.0, -np.inf], [-0.5, -np.inf, -np.inf]])
    ref = np.array([[-1.5, -1.0, -np.inf], [-0.5, np.nan, np.inf]])
    out = kl_token_rewards(scores, mask, old, ref, kl_coeff=0.1, kl_estimator="k3").numpy()
    k3 = lambda d: np.exp(d) - d - 1  # noqa: E731
    expected = [[-0.1 * k3(-0.5), -0.1 * k3(1.0) + 1.0, 0], [-0.1 * k3(0.0) - 1.0, 0, 0]]
    np.testing.assert_allclose(out, expected, rtol=0, atol=1e-15)  # float64 in: a few roundings of values <= 2
