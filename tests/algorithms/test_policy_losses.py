"""CISPO, GMPO, SAPO, Clip-Cov and KL-Cov (algorithms/policy_losses.py, covariance_losses.py) against numpy loops
of each paper's formula: the aggregated loss and its gradient with respect to the log-probs, tokens outside the
bounds, masked tokens with garbage, the covariance selections (Clip-Cov's random draw, KL-Cov's top-k and its
ties), and which losses are exactly 0 with zero advantages (docs/algorithms.md section 4).

Tolerances: the cases are float64, the references float64 loops, so results agree to a few float64 roundings
(u = 1.1e-16) per term over at most 40 terms of size <= 10: rtol 1e-10, atol 1e-12 are ~1e4 times looser than
that. The gradient references are the analytic derivatives of the same formulas in numpy, and one
finite-difference check per loss (central differences at h = 1e-6: error h^2 |f'''| / 6 ~ 1e-12 plus rounding
u |f| / h ~ 1e-10, hence rtol 1e-6, atol 1e-8; no ratio within 1e-3 of a bound). The float32 run of each loss
against the float64 reference: a token loss is <= 6 float32 roundings (u32 = 6e-8), sums of <= 40 terms of size
<= 10 give <= 40 * 10 * 6e-8 = 2.4e-5 absolute at worst: atol 3e-5.
"""
import math

import numpy as np
import paddle
import pytest

from paddle_grpo.algorithms import compute_policy_loss, policy_loss_spec

pytestmark = pytest.mark.numerics

EPS_LOW, EPS_HIGH = 0.2, 0.28


def case(seed, bs=5, T=7, spread=0.5):
    """Random log-probs around old ones, one advantage per row (outcome rewards) with one zero row, a ragged mask
    with one empty row, NaN garbage on the padding."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(2, T + 1, size=bs)
    lengths[0] = 0
    mask = (np.arange(T)[None, :] < lengths[:, None]).astype(np.float64)
    old = rng.uniform(-3.0, -0.2, size=(bs, T))
    lp = old + rng.normal(0.0, spread, size=(bs, T))
    A = np.repeat(rng.normal(0.0, 1.5, size=(bs, 1)), T, axis=1)
    A[1] = 0.0
    lp[mask == 0] = np.nan  # garbage a padded forward may leave there
    return lp, old, A, mask


def run(name, lp, old, A, mask, loss_agg_mode=None, dtype="float64", seed=None, **options):
    """(loss, gradient wrt lp, out dict) of compute_policy_loss by `name`; `seed`: paddle's seed right before."""
    x = paddle.to_tensor(lp.astype(dtype), stop_gradient=False)
    if seed is not None:
        paddle.seed(seed)
    out = compute_policy_loss(x, paddle.to_tensor(old.astype(dtype)), paddle.to_tensor(A.astype(dtype)),
                              paddle.to_tensor(mask), EPS_LOW, EPS_HIGH, policy_loss=name, loss_options=options,
                              loss_agg_mode=loss_agg_mode)
    out["pg_loss"].backward()
    return float(out["pg_loss"]), x.grad.numpy().astype(np.float64), out


def rows_tokens(mask):
    return [[t for t in range(mask.shape[1]) if mask[i, t]] for i in range(mask.shape[0])]


def token_mean(L, mask):
    """The loss token-mean over the valid tokens, and the weight of each token's loss in it."""
    n = mask.sum()
    return sum(L[i, t] for i, ts in enumerate(rows_tokens(mask)) for t in ts) / n, mask / n


def seq_mean_token_mean(L, mask):
    rows = [ts for ts in rows_tokens(mask) if ts]
    weight = np.zeros_like(mask)
    for i, ts in enumerate(rows_tokens(mask)):
        for t in ts:
            weight[i, t] = 1.0 / (len(rows) * len(ts))
    return sum(sum(L[i, t] for t in ts) / len(ts) for i, ts in enumerate(rows_tokens(mask)) if ts) / len(rows), weight


# ---- CISPO -----------------------------------------------------------------------------------------------------------

def ref_cispo(lp, old, A, mask, eps_high=EPS_HIGH):
    """MiniMax-M1: J = 1 / sum|o_i| sum_i sum_t sg(r^_t) A_t log pi_t, r^_t = min(r_t, 1 + eps_high)."""
    L, dL = np.zeros_like(mask), np.zeros_like(mask)
    for i, ts in enumerate(rows_tokens(mask)):
        for t in ts:
            w = min(math.exp(lp[i, t] - old[i, t]), 1.0 + eps_high)
            L[i, t] = -w * A[i, t] * lp[i, t]
            dL[i, t] = -w * A[i, t]
    loss, weight = token_mean(L, mask)
    return loss, dL * weight


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_cispo_matches_the_paper(seed):
    lp, old, A, mask = case(seed)
    loss, grad, out = run("cispo", lp, old, A, mask)
    ref_loss, ref_grad = ref_cispo(lp, old, A, mask)
    assert loss == pytest.approx(ref_loss, rel=1e-10, abs=1e-12)
    np.testing.assert_allclose(grad, ref_grad, rtol=1e-10, atol=1e-12)
    assert (grad[mask == 0] == 0).all()
    capped = (np.exp(np.nan_to_num(lp) - old) > 1 + EPS_HIGH) & (mask > 0)
    assert float(out["clip_frac_high"]) == pytest.approx(capped.sum() / mask.sum(), rel=1e-12)


def test_cispo_keeps_the_gradient_where_ppo_clip_zeroes_it():
    # one token far above the bound (r = e^1 > 1.28) with A > 0, one far below (r = e^-1) with A < 0
    lp = np.array([[-1.0, -3.0, -0.5]])
    old = np.array([[-2.0, -2.0, -0.5]])
    A = np.array([[1.5, -2.0, 0.7]])
    mask = np.ones_like(A)
    _, cispo, _ = run("cispo", lp, old, A, mask)
    _, ppo, _ = run("vanilla", lp, old, A, mask)
    assert ppo[0, 0] == 0.0 and ppo[0, 1] == 0.0  # PPO-clip: outside the trust region, no gradient
    # CISPO: -min(r, 1 + eps_high) A / n with the weight capped above and the lower side untouched
    assert cispo[0, 0] == pytest.approx(-(1 + EPS_HIGH) * 1.5 / 3, rel=1e-12)
    assert cispo[0, 1] == pytest.approx(-math.exp(-1.0) * -2.0 / 3, rel=1e-12)
    assert cispo[0, 2] == pytest.approx(-0.7 / 3, rel=1e-12) == ppo[0, 2]  # r = 1: both are REINFORCE


# ---- GMPO ------------------------------------------------------------------------------------------------------------

def ref_gmpo(lp, old, A, mask, eps_low=EPS_LOW, eps_high=EPS_HIGH):
    """GMPO: J = 1/G sum_i sgn(A_i) prod_t |min(r_t A_i, clip(r_t, e^-eps_low, e^eps_high) A_i)|^(1/|o_i|),
    over the rows with a valid token; the gradient of log|.| per token is 1 where min's unclipped side is active."""
    rows = [(i, ts) for i, ts in enumerate(rows_tokens(mask)) if ts]
    loss, grad = 0.0, np.zeros_like(mask)
    for i, ts in rows:
        a = A[i, ts[0]]
        if a == 0:
            continue
        logs, active = [], []
        for t in ts:
            r = math.exp(lp[i, t] - old[i, t])
            clipped = min(max(r, math.exp(-eps_low)), math.exp(eps_high))
            v = min(r * a, clipped * a)
            logs.append(math.log(abs(v)))
            active.append(not clipped * a < r * a)  # min's clipped side strictly smaller: constant, no gradient
        value = math.copysign(math.exp(sum(logs) / len(ts)), a)
        loss -= value / len(rows)
        for t, on in zip(ts, active):
            grad[i, t] = -value / len(ts) / len(rows) if on else 0.0
    return loss, grad


@pytest.mark.parametrize("name", ["gmpo", "geo_mean"])
@pytest.mark.parametrize("seed", [0, 3])
def test_gmpo_matches_the_paper(name, seed):
    lp, old, A, mask = case(seed, spread=0.3)
    loss, grad, out = run(name, lp, old, A, mask)
    ref_loss, ref_grad = ref_gmpo(lp, old, A, mask)
    assert loss == pytest.approx(ref_loss, rel=1e-10, abs=1e-12)
    np.testing.assert_allclose(grad, ref_grad, rtol=1e-10, atol=1e-12)
    d = np.where(mask > 0, np.nan_to_num(lp) - old, 0.0)
    assert 0 < float(out["clip_frac_high"]) == pytest.approx(((d > EPS_HIGH) & (A > 0)).sum() / mask.sum())
    assert float(out["clip_frac_low"]) == pytest.approx(((d < -EPS_LOW) & (A < 0)).sum() / mask.sum())


def test_gmpo_is_defined_with_the_sequence_mean():
    lp, old, A, mask = case(0)
    with pytest.raises(ValueError, match="seq-mean-token-mean"):
        run("gmpo", lp, old, A, mask, loss_agg_mode="token-mean")
    assert run("gmpo", lp, old, A, mask, loss_agg_mode="seq-mean-token-mean")[0] == run("gmpo", lp, old, A, mask)[0]


# ---- SAPO ------------------------------------------------------------------------------------------------------------

def ref_sapo(lp, old, A, mask, tau_pos=1.0, tau_neg=1.05):
    """SAPO: J = 1/G sum_i 1/|y_i| sum_t f(r_t; tau_t) A_t, f(r; tau) = sigmoid(tau (r - 1)) 4 / tau,
    tau_t = tau_pos where A_t > 0 else tau_neg; df/dlog r = 4 sigma (1 - sigma) r."""
    L, dL = np.zeros_like(mask), np.zeros_like(mask)
    for i, ts in enumerate(rows_tokens(mask)):
        for t in ts:
            r = math.exp(lp[i, t] - old[i, t])
            tau = tau_pos if A[i, t] > 0 else tau_neg
            s = 1.0 / (1.0 + math.exp(-tau * (r - 1.0)))
            L[i, t] = -s * 4.0 / tau * A[i, t]
            dL[i, t] = -4.0 * s * (1.0 - s) * r * A[i, t]
    loss, weight = seq_mean_token_mean(L, mask)
    return loss, dL * weight


@pytest.mark.parametrize("seed,taus", [(0, (1.0, 1.05)), (4, (0.5, 3.0))])
def test_sapo_matches_the_paper(seed, taus):
    lp, old, A, mask = case(seed, spread=1.0)
    options = dict(temperature_pos=taus[0], temperature_neg=taus[1])
    loss, grad, _ = run("sapo", lp, old, A, mask, **options)
    ref_loss, ref_grad = ref_sapo(lp, old, A, mask, *taus)
    assert loss == pytest.approx(ref_loss, rel=1e-10, abs=1e-12)
    np.testing.assert_allclose(grad, ref_grad, rtol=1e-10, atol=1e-12)


def test_sapo_is_reinforce_on_policy_and_fades_off_policy():
    lp = np.array([[-1.0, -1.0, -1.0]])
    old = np.array([[-1.0, -3.0, 1.0]])  # r = 1, e^2, e^-2
    A = np.array([[1.0, 1.0, -1.0]])
    _, grad, _ = run("sapo", lp, old, A, np.ones_like(A))
    assert grad[0, 0] == pytest.approx(-1.0 / 3, rel=1e-12)  # 4 sigma(0) (1 - sigma(0)) = 1: REINFORCE's
    assert 0 > grad[0, 1] > -1.0 / 3 * 0.5 and 0 < grad[0, 2] < 1.0 / 3  # smaller, never 0, sign kept


# ---- Clip-Cov --------------------------------------------------------------------------------------------------------

def covariances(lp, A, mask):
    valid = mask > 0
    lpv = np.where(valid, lp, 0.0)
    a_mean, l_mean = A[valid].mean(), lpv[valid].mean()
    return np.where(valid, (A - a_mean) * (lpv - l_mean), 0.0)


def ref_clip_cov(lp, old, A, mask, draws, ratio, lb, ub):
    """Cui et al., Clip-Cov, as verl: PPO clip; of the tokens not clipped by PPO with lb < Cov_t < ub,
    max(1, int(ratio n)) drawn uniformly (here: those with the smallest `draws`) get loss 0."""
    cov = covariances(lp, A, mask)
    L, dL, candidates = np.zeros_like(mask), np.zeros_like(mask), []
    for i, ts in enumerate(rows_tokens(mask)):
        for t in ts:
            r = math.exp(lp[i, t] - old[i, t])
            a = A[i, t]
            unclipped, clipped = -a * r, -a * min(max(r, 1 - EPS_LOW), 1 + EPS_HIGH)
            L[i, t] = max(unclipped, clipped)
            dL[i, t] = -a * r if not clipped > unclipped else 0.0
            if not clipped > unclipped and lb < cov[i, t] < ub:
                candidates.append((draws[i, t], i * mask.shape[1] + t, i, t))
    k = max(1, int(ratio * mask.sum()))
    dropped = np.zeros(mask.shape, dtype=bool)
    for _, _, i, t in sorted(candidates)[:k]:
        dropped[i, t] = True
    L[dropped], dL[dropped] = 0.0, 0.0
    loss, weight = token_mean(L, mask)
    return loss, dL * weight, dropped, len(candidates)


@pytest.mark.parametrize("seed,ratio,lb,ub", [(0, 0.2, 0.05, 2.0), (5, 0.1, -0.5, 0.3), (6, 1e-4, 0.0, 5.0)])
def test_clip_cov_matches_the_paper(seed, ratio, lb, ub):
    lp, old, A, mask = case(seed)
    options = dict(clip_cov_ratio=ratio, clip_cov_lb=lb, clip_cov_ub=ub)
    loss, grad, _ = run("clip_cov", lp, old, A, mask, seed=11, **options)
    paddle.seed(11)  # the same draw the loss takes: one paddle.rand([bs, T])
    draws = paddle.rand(list(lp.shape), dtype="float32").numpy().astype(np.float64)
    ref_loss, ref_grad, dropped, n_candidates = ref_clip_cov(lp, old, A, mask, draws, ratio, lb, ub)
    assert dropped.sum() == min(max(1, int(ratio * mask.sum())), n_candidates) > 0
    assert loss == pytest.approx(ref_loss, rel=1e-10, abs=1e-12)
    np.testing.assert_allclose(grad, ref_grad, rtol=1e-10, atol=1e-12)
    # the dropped tokens with an advantage had a gradient under plain PPO clip; now none, the others' is PPO's
    _, ppo, _ = run("vanilla", lp, old, A, mask)
    assert (ppo[dropped & (A != 0)] != 0).all() and (grad[dropped] == 0).all()
    assert (grad[~dropped] == ppo[~dropped]).all()


def test_clip_cov_draw_follows_the_seed():
    lp, old, A, mask = case(0)
    options = dict(clip_cov_ratio=0.1, clip_cov_lb=-1.0, clip_cov_ub=1.0)
    a = run("clip_cov", lp, old, A, mask, seed=1, **options)[1]
    assert (run("clip_cov", lp, old, A, mask, seed=1, **options)[1] == a).all()
    assert any((run("clip_cov", lp, old, A, mask, seed=s, **options)[1] != a).any() for s in (2, 3, 4))


# ---- KL-Cov ----------------------------------------------------------------------------------------------------------

def ref_kl_cov(lp, old, A, mask, ratio, coef):
    """Cui et al., KL-Cov: L_t = -A_t r_t, plus coef |log r_t| on the max(1, int(ratio n)) tokens of largest
    Cov_t (ties: the first in row-major order)."""
    cov = covariances(lp, A, mask)
    order = sorted(((-cov[i, t], i * mask.shape[1] + t, i, t) for i, ts in enumerate(rows_tokens(mask))
                    for t in ts))
    k = max(1, int(ratio * mask.sum()))
    chosen = np.zeros(mask.shape, dtype=bool)
    for _, _, i, t in order[:k]:
        chosen[i, t] = True
    L, dL = np.zeros_like(mask), np.zeros_like(mask)
    for i, ts in enumerate(rows_tokens(mask)):
        for t in ts:
            d = lp[i, t] - old[i, t]
            L[i, t] = -A[i, t] * math.exp(d) + (coef * abs(d) if chosen[i, t] else 0.0)
            dL[i, t] = -A[i, t] * math.exp(d) + (coef * math.copysign(1.0, d) if chosen[i, t] else 0.0)
    loss, weight = token_mean(L, mask)
    return loss, dL * weight, chosen


@pytest.mark.parametrize("seed,ratio,coef", [(0, 0.2, 1.0), (7, 0.01, 0.5), (8, 0.5, 2.0)])
def test_kl_cov_matches_the_paper(seed, ratio, coef):
    lp, old, A, mask = case(seed)
    loss, grad, _ = run("kl_cov", lp, old, A, mask, kl_cov_ratio=ratio, ppo_kl_coef=coef)
    ref_loss, ref_grad, chosen = ref_kl_cov(lp, old, A, mask, ratio, coef)
    assert chosen.sum() == max(1, int(ratio * mask.sum()))
    assert loss == pytest.approx(ref_loss, rel=1e-10, abs=1e-12)
    np.testing.assert_allclose(grad, ref_grad, rtol=1e-10, atol=1e-12)


def test_kl_cov_ties_take_the_first_tokens():
    # every token of row 0 has the same covariance (same log-prob, same advantage), the largest of the batch; the
    # masked token (0, 3) is not a candidate
    lp = np.array([[-0.2, -0.2, -0.2, -0.2], [-2.0, -2.1, -1.9, -2.0]])  # Cov 1.18 on row 0, <= 0.75 on row 1
    old = lp - 0.1  # log r = 0.1 everywhere: the penalty's gradient is +coef on the chosen tokens
    A = np.array([[1.0] * 4, [-1.0] * 4])
    mask = np.array([[1, 1, 1, 0], [1, 1, 1, 1]], dtype=np.float64)
    _, grad, _ = run("kl_cov", lp, old, A, mask, kl_cov_ratio=0.3, ppo_kl_coef=1.0)  # int(0.3 * 7) = 2 tokens
    _, plain, _ = run("kl_cov", lp, old, A, mask, kl_cov_ratio=1e-9, ppo_kl_coef=0.0)
    penalised = np.isclose(grad - plain, 1.0 / 7, rtol=1e-12)
    assert penalised.tolist() == [[True, True, False, False], [False, False, False, False]]


# ---- all of them -----------------------------------------------------------------------------------------------------

NEW = ["cispo", "gmpo", "sapo", "clip_cov", "kl_cov"]


# Not CISPO: its weight is a stop-gradient, so its gradient is by design not the derivative of its value.
@pytest.mark.parametrize("name", ["gmpo", "sapo", "clip_cov", "kl_cov"])
def test_gradient_matches_finite_differences(name):
    lp, old, A, mask = case(9, bs=3, T=4, spread=0.25)
    options = {"clip_cov": dict(clip_cov_ratio=0.2, clip_cov_lb=0.01, clip_cov_ub=3.0),
               "kl_cov": dict(kl_cov_ratio=0.3)}.get(name, {})
    _, grad, _ = run(name, lp, old, A, mask, seed=0, **options)

    def value(x):
        return run(name, x, old, A, mask, seed=0, **options)[0]

    h, numeric = 1e-6, np.zeros_like(lp)
    for idx in zip(*np.nonzero(mask)):
        plus, minus = lp.copy(), lp.copy()
        plus[idx] += h
        minus[idx] -= h
        numeric[idx] = (value(plus) - value(minus)) / (2 * h)
    np.testing.assert_allclose(grad, numeric, rtol=1e-6, atol=1e-8)
    assert np.abs(grad).sum() > 0


@pytest.mark.parametrize("name", NEW)
def test_float32_inputs_match_the_float64_loss(name):
    lp, old, A, mask = case(10)
    options = {"clip_cov": dict(clip_cov_ratio=0.2, clip_cov_lb=0.05, clip_cov_ub=2.0)}.get(name, {})
    loss64, grad64, _ = run(name, lp, old, A, mask, seed=3, **options)
    loss32, grad32, out = run(name, lp, old, A, mask, dtype="float32", seed=3, **options)
    assert out["pg_loss"].dtype == paddle.float32
    assert loss32 == pytest.approx(loss64, abs=3e-5)
    np.testing.assert_allclose(grad32, grad64, atol=3e-5)


@pytest.mark.parametrize("name", NEW)
def test_zero_advantages_give_zero_loss_and_gradient_exactly_when_advantage_weighted(name):
    lp, old, _, mask = case(12)
    A = np.zeros_like(mask)
    loss, grad, _ = run(name, lp, old, A, mask, seed=0)
    if policy_loss_spec(name).advantage_weighted:
        assert loss == 0.0 and (grad == 0).all()
    else:  # KL-Cov: the penalty on the selected tokens is not a multiple of the advantage
        assert (grad != 0).any()


def test_masked_tokens_take_no_part():
    lp, old, A, mask = case(13)
    for name in NEW:
        garbage = lp.copy()
        garbage[mask == 0] = np.inf
        a = run(name, lp, old, A, mask, seed=0)
        b = run(name, garbage, old, A, mask, seed=0)
        assert a[0] == b[0] and (a[1] == b[1]).all() and (a[1][mask == 0] == 0).all(), name
        assert math.isfinite(a[0]), name
