"""Rollout correction (docs/algorithms.md, "Rollout correction"): TIS / MIS importance weights of the sampler's
log-probs against the trainer's old ones, applied to the policy-gradient term of every policy loss.

- the maths (algorithms.rollout_correction) against a plain loop on hand-made log-probs: caps hit, band edges,
  padding holding garbage, token and sequence level, and the statistics;
- the loss (step.rl_loss, the function both update paths call) on a real tiny Qwen2's log-probs against a numpy
  reference of the corrected loss and of its gradient (the KL-loss term unweighted), GRPO's token ratio and GSPO's
  sequence ratio, with dual clip;
- `none` leaves loss, gradient and a real step.update bit-identical (the sampler's log-probs are not read), and a
  weight of exactly 1 changes no bit;
- a short synchronous run of the trainer with `tis` logs a ratio of 1 within the sampler-vs-trainer log-prob bound;
- config validation and the inert-key notes (dry run).

Tolerances (tests/numerics.py): the hand-made log-probs are multiples of 2^-10 below 16 in magnitude, so their
differences and row sums are exact in float32; what remains is float32 exp of an exact argument (a few ulp: the
weights are compared with rtol 16 u = 9.5e-7, and a wrong weight is off by far more) and the float32 sums of the
means. The loss: per token at most 10 float32 roundings (the ratio's subtraction and exp, clip, the products with A
and the weight, the weight's own subtraction and exp, the dual bound, the mask) and a sum of n terms, so
|loss - reference| <= (n + 10) u sum|terms| / denominator (Higham 4.2), doubled for two evaluations.
"""
import math

import numpy as np
import paddle
import pytest
from batch_helpers import loss_test_cfg, random_bias_qwen2
from numerics import EPS32, f32_sum_tol, tiny_lm_tol

from paddle_grpo import step
from paddle_grpo.algorithms import ROLLOUT_CORRECTIONS, UnknownNameError, rollout_correction
from paddle_grpo.config import ConfigError, config_from_dict, run_key_effect
from paddle_grpo.parallel import ParallelContext
from paddle_grpo.policy.causal import CausalPolicy, logprobs_from_completion_logits
from paddle_grpo.rewards import RewardResult
from paddle_grpo.rollout import Rollout

pytestmark = pytest.mark.numerics

GRID = 2.0 ** -10
W_RTOL = 16 * EPS32


# --------------------------------------------------------------------------------------------------- the maths

def loop_reference(old, sample, mask, mode, cap, lo, level):
    """The weights [bs, T] (0 on padding) and (ratio mean, ratio max, share capped or dropped), one token at a
    time in float64. `level`: "token" r_t; "sequence" the product of the row's r_t (Seq-TIS / Seq-MIS);
    "geometric" their geometric mean."""
    bs, T = old.shape
    weights, ratios, hits = np.zeros((bs, T)), [], 0
    for i in range(bs):
        valid = [t for t in range(T) if mask[i, t]]
        clamp = lambda d: min(max(d, -20.0), 20.0)  # noqa: E731
        log_product = sum(float(old[i, t]) - float(sample[i, t]) for t in valid)
        seq = {"sequence": math.exp(clamp(log_product)),
               "geometric": math.exp(clamp(log_product / max(len(valid), 1)))}.get(level)
        for t in valid:
            token = math.exp(clamp(float(old[i, t]) - float(sample[i, t])))
            ratios.append(token)
            r = token if level == "token" else seq
            if mode == "tis":
                weights[i, t] = min(r, cap)
                hits += r > cap
            elif mode == "mis":
                keep = lo <= r <= cap
                weights[i, t] = r if keep else 0.0
                hits += not keep
            else:
                weights[i, t] = 1.0
    n = max(len(ratios), 1)
    return weights, (sum(ratios) / n if ratios else 0.0, max(ratios, default=0.0), hits / n)


def diagnostics_reference(old, sample, mask, weights):
    """(kl, ess, ppl_ratio) in float64, one token at a time: k3 of KL(pi_s || pi_old) with docs/algorithms.md
    section 3's clamps (d to [-20, 20], the estimate to [-10, 10]); the normalised effective sample size
    (sum w)^2 / (n sum w^2) of the weights `weights` (per token, padding ignored); the trainer's perplexity over the
    sampler's, exp(mean(l^s - l^old))."""
    kl, w, w2, gap, n = 0.0, 0.0, 0.0, 0.0, 0
    for i, t in zip(*np.nonzero(mask)):
        d = float(old[i, t]) - float(sample[i, t])
        dc = min(max(d, -20.0), 20.0)
        kl += min(max(math.exp(dc) - dc - 1.0, -10.0), 10.0)
        w, w2, gap, n = w + weights[i, t], w2 + weights[i, t] ** 2, gap - d, n + 1
    n = max(n, 1)
    return kl / n, (w * w / (n * w2) if w2 > 0 else 0.0), math.exp(min(max(gap / n, -20.0), 20.0))


# Row 0: ratios around the band (0.75 -> 2.12 > 2 capped / dropped, -0.75 -> 0.47 < 0.5 dropped, +-0.6875 -> 1.99 /
# 0.50 kept, 0 -> exactly 1), then padding; row 1: a huge gap (25: the log-ratio clamp at 20) and a tiny ratio; row 2:
# no valid token (padding only); row 3 all valid, all on-policy.
D = np.array([[0.0, 0.75, -0.75, 0.6875, -0.6875, 0.25, 0.0, 0.0],
              [3.0, -5.0, 25.0, 0.125, -0.125, 0.0, 0.0, 0.0],
              [0.0] * 8,
              [0.0] * 8])
MASK = np.array([[1, 1, 1, 1, 1, 1, 0, 0],
                 [1, 1, 1, 1, 1, 0, 0, 0],
                 [0] * 8,
                 [1] * 8], dtype=np.int64)


def hand_made(seed=0):
    """(old, sample) float32 [4, 8] on the 2^-10 grid with old - sample = D on valid tokens; garbage in padding."""
    rng = np.random.default_rng(seed)
    old = -np.round(rng.uniform(0.0, 8.0, D.shape) / GRID) * GRID
    sample = old - D
    garbage = np.array([np.nan, np.inf, -np.inf, 1e30, -1e30])
    sample = np.where(MASK == 1, sample, garbage[rng.integers(0, 5, D.shape)])
    old = np.where(MASK == 1, old, garbage[rng.integers(0, 5, D.shape)])
    return old.astype(np.float32), sample.astype(np.float32)


@pytest.mark.parametrize("level", ["token", "sequence", "geometric"])
@pytest.mark.parametrize("mode, cap, lo", [("tis", 2.0, 0.5), ("mis", 2.0, 0.5), ("mis", 2.5, 0.0), ("none", 2.0, 0.5),
                                           ("clip", 2.0, 0.5)])
def test_weights_and_statistics_match_a_loop(mode, cap, lo, level):
    old, sample = hand_made()
    weights, stats = rollout_correction(paddle.to_tensor(old), paddle.to_tensor(sample), paddle.to_tensor(MASK),
                                        mode, cap, lo, level)
    ref_w, (ref_mean, ref_max, ref_hits) = loop_reference(old, sample, MASK, mode, cap, lo, level)
    if mode in ("none", "clip"):  # clip changes the loss's old log-probs (step.rl_loss), not its weights
        assert weights is None
    else:
        assert weights.stop_gradient
        w = weights.numpy()
        assert np.isfinite(w).all() and (w[MASK == 0] == 0).all()  # garbage in padding reaches nothing
        np.testing.assert_allclose(w, ref_w, rtol=W_RTOL, atol=0)
    n = int(MASK.sum())
    # The mean: n float32 roundings of ratios up to e^20 summed (f32_sum_tol over the sum of ratios) then / n.
    np.testing.assert_allclose(float(stats["ratio_mean"]), ref_mean, rtol=0,
                               atol=f32_sum_tol(n, ref_mean * n) / n + W_RTOL * ref_mean)
    np.testing.assert_allclose(float(stats["ratio_max"]), ref_max, rtol=W_RTOL)
    assert ref_max == pytest.approx(math.exp(20.0))  # the clamp, not exp(25)
    hit_key = {"tis": "capped_frac", "mis": "masked_frac"}.get(mode)
    for key in ("capped_frac", "masked_frac"):
        assert float(stats[key]) == pytest.approx(ref_hits if key == hit_key else 0.0, abs=EPS32)
    if mode in ("tis", "mis"):
        assert ref_hits > 0  # the hand-made ratios do hit the cap / leave the band (the check can fail)
    # The diagnostics: the ESS of the weights (tis / mis) or of the token ratios r_t (none / clip: the weight a
    # correction would apply).
    with np.errstate(invalid="ignore"):  # the garbage in padding (inf - inf), dropped by the where
        d = np.clip(np.where(MASK == 1, old.astype(np.float64) - sample, 0.0), -20, 20)
    ess_weights = ref_w if mode in ("tis", "mis") else np.exp(d)
    kl, ess, ppl_ratio = diagnostics_reference(old, sample, MASK, ess_weights)
    # k3 per token: exp (a few ulp of e^d) and two subtractions, 8 u (e^d + |d| + 1) absolute; then the mean of n
    # terms (f32_sum_tol over their sum, at most 10 each).
    kl_tol = (8 * EPS32 * (np.exp(d) + np.abs(d) + 1)[MASK == 1].sum() + f32_sum_tol(n, 10.0 * n)) / n
    assert abs(float(stats["kl"]) - kl) <= kl_tol, (float(stats["kl"]), kl, kl_tol)
    assert kl > 1.0  # the hand-made gaps are large (up to the clamps): a wrong estimator is far off
    # ESS = mean(w)^2 / mean(w^2): each mean of n positive float32 terms within (n + 4) u relative (the products
    # w * w one more rounding), the ratio and the square 3 more: 4 (n + 8) u relative.
    assert float(stats["ess"]) == pytest.approx(ess, rel=4 * (n + 8) * EPS32, abs=0)
    assert 0 < ess <= 1 and (ess < 0.5 if mode in ("none", "clip") else True)  # e^20 among ratios near 1: small
    # The perplexity ratio: the log-ratios are exact (the 2^-10 grid), their sum too; / n and exp: a few ulp.
    assert float(stats["ppl_ratio"]) == pytest.approx(ppl_ratio, rel=W_RTOL)
    assert ppl_ratio < 0.5  # the trainer finds the tokens more likely than the sampler did (sum of d = 23.25 > 0)


def test_a_sequence_is_the_product_of_its_ratios_and_geometric_their_mean():
    """The issue's example: four tokens at r = 1.35 (product 3.32, above a cap of 2): Seq-TIS caps the row at 2 and
    Seq-MIS drops it; at the geometric level (and per token) each weighs 1.35, inside the band."""
    d = math.log(1.35)
    old = paddle.to_tensor(np.full((1, 4), d, np.float32))
    sample, mask = paddle.zeros([1, 4]), paddle.ones([1, 4])
    expect = {("tis", "sequence"): 2.0, ("mis", "sequence"): 0.0, ("tis", "geometric"): 1.35,
              ("mis", "geometric"): 1.35, ("tis", "token"): 1.35, ("mis", "token"): 1.35}
    for (mode, level), value in expect.items():
        w, stats = rollout_correction(old, sample, mask, mode, 2.0, 0.5, level)
        np.testing.assert_allclose(w.numpy(), np.full((1, 4), value), rtol=W_RTOL, err_msg=f"{mode} {level}")
    # A product below the band: four tokens at r = 0.8 (0.41 < 0.5) drop the row in Seq-MIS, not per token.
    low = paddle.to_tensor(np.full((1, 4), math.log(0.8), np.float32))
    assert float(rollout_correction(low, sample, mask, "mis", 2.0, 0.5, "sequence")[1]["masked_frac"]) == 1.0
    assert float(rollout_correction(low, sample, mask, "mis", 2.0, 0.5, "token")[1]["masked_frac"]) == 0.0


def test_band_edges_are_inclusive_and_a_ratio_of_one_is_exact():
    """At ratio exactly 1 (log-ratio 0: exp is exact in any implementation): the cap and both MIS bounds keep it."""
    old, sample = hand_made()
    t, m = paddle.to_tensor(old), paddle.to_tensor(MASK)
    on_policy = paddle.to_tensor(np.where(MASK == 1, old, 0.0).astype(np.float32))
    w, stats = rollout_correction(on_policy, on_policy, m, "tis", cap=1.0)
    assert (w.numpy()[MASK == 1] == 1.0).all() and float(stats["capped_frac"]) == 0.0
    assert float(stats["ratio_mean"]) == 1.0 and float(stats["ratio_max"]) == 1.0
    for lo, cap in ((0.5, 1.0), (1.0, 2.0)):
        w, stats = rollout_correction(on_policy, on_policy, m, "mis", cap=cap, min_ratio=lo)
        assert (w.numpy()[MASK == 1] == 1.0).all() and float(stats["masked_frac"]) == 0.0
        # On-policy the diagnostics are exact: log-ratio 0 gives k3 0, equal weights an ESS of 1, a ratio of 1.
        assert (float(stats["kl"]), float(stats["ess"]), float(stats["ppl_ratio"])) == (0.0, 1.0, 1.0)
    # Just outside either edge (log-ratio 2^-10 away): capped / dropped.
    nudged = paddle.to_tensor(np.where(MASK == 1, old - GRID, 0.0).astype(np.float32))
    assert float(rollout_correction(on_policy, nudged, m, "tis", cap=1.0)[1]["capped_frac"]) == 1.0
    assert float(rollout_correction(on_policy, nudged, m, "mis", cap=1.0, min_ratio=0.5)[1]["masked_frac"]) == 1.0
    assert float(rollout_correction(nudged, on_policy, m, "mis", cap=2.0, min_ratio=1.0)[1]["masked_frac"]) == 1.0
    # Nothing valid: statistics 0, no division by zero.
    empty = paddle.zeros([2, 3], dtype="int64")
    w, stats = rollout_correction(t[:2, :3], t[:2, :3], empty, "mis")
    assert (w.numpy() == 0).all() and float(stats.pop("ppl_ratio")) == 1.0  # exp(0): no gap measured
    assert all(float(v) == 0.0 for v in stats.values())


def test_bad_arguments_name_what_is_wrong():
    old = paddle.zeros([1, 2])
    with pytest.raises(UnknownNameError, match="unknown rollout_correction 'cap'; valid: clip, mis, none, tis"):
        rollout_correction(old, old, old, "cap")
    with pytest.raises(UnknownNameError, match="unknown rollout_correction_level 'row'; valid: geometric, sequence"):
        rollout_correction(old, old, old, "tis", level="row")
    with pytest.raises(ValueError, match="rollout_correction_min must be in"):
        rollout_correction(old, old, old, "mis", cap=2.0, min_ratio=3.0)
    with pytest.raises(ValueError, match="shape mismatch"):
        rollout_correction(old, paddle.zeros([1, 3]), old, "tis")
    assert ROLLOUT_CORRECTIONS == ("none", "tis", "mis", "clip")
    assert rollout_correction(old, old, old, "clip", cap=0.0)[0] is None  # clip reads no cap


# ----------------------------------------------------------------------------------- the loss on a real model

V, G, L, T = 96, 2, 5, 8
N = 4
# Completion layout: row 2 ends early (padding), row 3 holds a single token.
LOSS_MASK = (np.arange(T)[None] < np.array([8, 8, 5, 1])[:, None]).astype(np.int64)


def cfg_of(**values):
    return loss_test_cfg(G, N, T, L, **values)


@pytest.fixture(scope="module")
def model_logits():
    """A tiny random Qwen2's logits [N, T, V] predicting random completions [N, T] after prompts of L tokens."""
    model = random_bias_qwen2(V, seed=1)
    rng = np.random.default_rng(1)
    ids = paddle.to_tensor(rng.integers(3, V, size=(N, L + T)))
    logits = model(input_ids=ids, return_dict=True).logits
    return logits[:, L - 1:-1], ids[:, L:]


def loss_inputs(lp_np, seed=0):
    """(old, sample, ref, advantages) float32 [N, T] around the real log-probs: old off-policy by up to +-0.3 (the
    PPO clip and the dual clip active), the sampler's ratios spread over, below and above the band [0.5, 2]."""
    rng = np.random.default_rng(seed)
    old = (lp_np + rng.uniform(-0.3, 0.3, lp_np.shape)).astype(np.float32)
    d = rng.choice([-1.5, -0.9, -0.3, 0.0, 0.2, 0.5, 0.9, 1.4], size=lp_np.shape)  # away from log 0.5 and log 2
    sample = (old - d).astype(np.float32)
    ref = (lp_np + rng.uniform(-0.5, 0.5, lp_np.shape)).astype(np.float32)
    adv = np.repeat(rng.normal(size=(N, 1)), T, axis=1).astype(np.float32)  # outcome advantages, per row
    return old, sample, ref, adv


def reference_loss(cfg, lp, old, sample, ref, adv, mask):
    """(loss, d loss / d lp [N, T], sum of |terms|) in float64 for the token level, per docs/algorithms.md."""
    lp, old, sample, ref, adv = (np.asarray(x, np.float64) for x in (lp, old, sample, ref, adv))
    m = mask.astype(bool)
    w, _ = loop_reference(old, sample, mask, cfg.rollout_correction, cfg.rollout_correction_cap,
                          cfg.rollout_correction_min, cfg.correction_level)
    if cfg.rollout_correction == "clip":  # PPO's ratio against the sampler, no weight
        old = sample
    rho = np.exp(np.clip(lp - old, -20, 20))
    if cfg.importance_sampling_level == "sequence":
        rho = np.repeat((np.exp((np.where(m, lp - old, 0)).sum(1) / np.maximum(m.sum(1), 1)))[:, None], T, 1)
    lo, hi = 1 - cfg.eps_low, 1 + cfg.eps_high
    unclipped, clipped = -adv * rho, -adv * np.clip(rho, lo, hi)
    pg = np.maximum(unclipped, clipped)
    unclipped_active = unclipped >= clipped
    if cfg.clip_ratio_c is not None:
        dual = (adv < 0) & (-cfg.clip_ratio_c * adv < pg)
        pg = np.where(dual, -cfg.clip_ratio_c * adv, pg)
        unclipped_active &= ~dual
    pg = w * pg
    k = ref - lp
    kl = np.exp(k) - k - 1
    terms = np.where(m, cfg.pg_loss_coeff * pg + cfg.kl_loss_coeff * kl, 0.0)
    if cfg.loss_agg_mode == "token-mean":
        per_token = np.full(mask.shape, 1.0 / m.sum())
    else:  # seq-mean-token-mean
        per_token = np.repeat((1.0 / np.maximum(m.sum(1), 1))[:, None], T, 1) / (m.sum(1) > 0).sum()
    loss = (terms * per_token).sum()
    # Token level: d(-A w rho)/d lp = -A w rho where the unclipped branch is active; k3: 1 - exp(ref - lp).
    grad = per_token * np.where(m, cfg.pg_loss_coeff * np.where(unclipped_active, -adv * w * rho, 0.0)
                                + cfg.kl_loss_coeff * (1 - np.exp(k)), 0.0)
    return loss, grad, float((np.abs(terms) * per_token).sum())


@pytest.mark.parametrize("mode", ["tis", "mis", "clip"])
@pytest.mark.parametrize("level, agg, correction_level", [
    ("token", "token-mean", None), ("token", "seq-mean-token-mean", None), ("sequence", "token-mean", None),
    ("token", "token-mean", "sequence"), ("token", "seq-mean-token-mean", "geometric")])
def test_corrected_loss_and_gradient_match_numpy(model_logits, mode, level, agg, correction_level):
    """`level` is the loss's ratio (GSPO's with "sequence"); `correction_level` the correction's (unset: geometric
    for GSPO, else token; "sequence": Seq-TIS / Seq-MIS on a token-level loss). The weights are detached: the
    gradient of a token-level loss is the weight times the uncorrected token's, which the reference computes."""
    if mode == "clip" and correction_level is not None:
        pytest.skip("clip applies no weight: the level has no effect (the dry run says so)")
    logits, completion = model_logits
    cfg = cfg_of(rollout_correction=mode, importance_sampling_level=level, loss_agg_mode=agg, kl_loss_coeff=0.3,
                 clip_ratio_c=3.0, pg_loss_coeff=1.0, rollout_correction_level=correction_level)
    assert cfg.correction_level == correction_level or (correction_level is None and cfg.correction_level == (
        "geometric" if level == "sequence" else "token"))
    lp, ent = logprobs_from_completion_logits(logits, completion, cfg.temperature, "detached")
    old, sample, ref, adv = loss_inputs(lp.numpy())
    mask = paddle.to_tensor(LOSS_MASK)
    from paddle_grpo.algorithms import global_denominators
    agg_counts = {**global_denominators(mask, agg), "max_dec_len": T}
    loss, sums = step.rl_loss(cfg, lp, ent, paddle.to_tensor(old), paddle.to_tensor(adv), mask,
                              paddle.to_tensor(ref), agg_counts, None, paddle.to_tensor(sample))
    ref_loss, ref_grad, magnitude = reference_loss(cfg, lp.numpy(), old, sample, ref, adv, LOSS_MASK)
    n = int(LOSS_MASK.sum())
    tol = 2 * (n + 10) * EPS32 * magnitude
    assert abs(float(loss) - ref_loss) <= tol, (float(loss), ref_loss, tol)
    # The correction changed the loss (so the comparison can fail): the uncorrected loss is far away.
    plain = step.rl_loss(cfg_of(importance_sampling_level=level, loss_agg_mode=agg, kl_loss_coeff=0.3,
                                clip_ratio_c=3.0), lp, ent, paddle.to_tensor(old), paddle.to_tensor(adv), mask,
                         paddle.to_tensor(ref), agg_counts, None, paddle.to_tensor(sample))[0]
    assert abs(float(plain) - float(loss)) > 100 * tol
    if level == "token":  # (GSPO's sequence ratio has a gradient through the row's mean; its loss is checked)
        (grad,) = paddle.grad(loss, [lp])
        # Per token a product of ~6 float32 roundings, divided by the count: 10 u relative of each term.
        np.testing.assert_allclose(grad.numpy(), ref_grad, rtol=0, atol=10 * EPS32 * np.abs(ref_grad).max())
    # The statistics in LossSums' layout: token-weighted sums, then the maximum, then the token count.
    means = step.LossSums(sums).means()
    ref_w, (r_mean, r_max, hits) = loop_reference(old, sample, LOSS_MASK, mode, 2.0, 0.5, cfg.correction_level)
    assert means["rollout_correction/ratio_mean"] == pytest.approx(r_mean, rel=1e-6)
    assert means["rollout_correction/ratio_max"] == pytest.approx(r_max, rel=1e-6)
    # The diagnostics through LossSums (token means of w, w^2, the log gap, then the ESS and the ratio of them).
    ess_weights = ref_w if mode != "clip" else np.exp(np.where(LOSS_MASK == 1, old - sample, 0.0))
    kl, ess, ppl_ratio = diagnostics_reference(old, sample, LOSS_MASK, ess_weights)
    assert means["rollout_correction/kl"] == pytest.approx(kl, rel=1e-5)
    assert means["rollout_correction/ess"] == pytest.approx(ess, rel=1e-5) and 0 < ess <= 1
    assert means["rollout_correction/ppl_ratio"] == pytest.approx(ppl_ratio, rel=1e-5)
    if mode == "clip":  # the PPO clip statistics are now against the sampler: some tokens clipped each side
        assert means["rollout_correction/capped_frac"] == 0 and means["rollout_correction/masked_frac"] == 0
        if level == "sequence":  # (GSPO's clip shares count rows' ratios; the loss check above covers it)
            return
        # The clip shares counted against the sampler's log-probs (not `old`), one token at a time in float64.
        m = LOSS_MASK.astype(bool)
        rho = np.exp(lp.numpy().astype(np.float64) - sample)
        low = ((adv < 0) & (rho < 1 - cfg.eps_low))[m].mean()
        high = ((adv > 0) & (rho > 1 + cfg.eps_high))[m].mean()
        assert high > 0  # the check can fail: some tokens are beyond the band
        # No log-ratio within 1e-4 of a band edge, so float32 rounding (the log-ratio is a difference of values of
        # magnitude <= 10, a few ulp: < 1e-5) cannot move a token across it on another CPU's kernels.
        for edge in (1 - cfg.eps_low, 1 + cfg.eps_high):
            assert np.abs(np.log(rho) - np.log(edge))[m].min() > 1e-4
        assert means["train/clip_frac_low"] == pytest.approx(low, abs=1e-6)
        assert means["train/clip_frac_high"] == pytest.approx(high, abs=1e-6)
        return
    key = "rollout_correction/capped_frac" if mode == "tis" else "rollout_correction/masked_frac"
    assert means[key] == pytest.approx(hits, abs=1e-6) and hits > 0


def test_none_reads_no_sampler_log_prob_and_a_weight_of_one_changes_no_bit(model_logits):
    logits, completion = model_logits
    mask = paddle.to_tensor(LOSS_MASK)
    agg = {"num_global_tokens": int(LOSS_MASK.sum()), "num_global_seqs": N, "max_dec_len": T}

    def run(cfg, old_of, sample_of):
        lp, ent = logprobs_from_completion_logits(logits, completion, cfg.temperature, "detached")
        old, sample, ref, adv = loss_inputs(lp.numpy())
        loss, sums = step.rl_loss(cfg, lp, ent, old_of(lp, old), paddle.to_tensor(adv), mask, paddle.to_tensor(ref),
                                  dict(agg), None, sample_of(lp, old, sample))
        (grad,) = paddle.grad(loss, [lp])
        return float(loss), grad.numpy(), sums

    none, garbage = cfg_of(kl_loss_coeff=0.3), np.full((N, T), np.nan, np.float32)
    off_policy = lambda lp, old: paddle.to_tensor(old)  # noqa: E731
    base = run(none, off_policy, lambda lp, old, sample: None)  # the loss without any sampler log-probs
    for sample_of in (lambda lp, old, sample: paddle.to_tensor(sample),
                      lambda lp, old, sample: paddle.to_tensor(garbage)):
        loss, grad, sums = run(none, off_policy, sample_of)
        assert loss == base[0] and np.array_equal(grad, base[1])
        assert np.array_equal(sums[:8], base[2][:8]) and sums[-1] == base[2][-1]  # all but the ratio's statistics
    # TIS with the sampler's log-probs equal to the old ones (on-policy: the detached current ones): weights of
    # exactly 1, and the loss and gradient of `none`, bit for bit.
    on_policy = lambda lp, old: lp.detach()  # noqa: E731
    tis = run(cfg_of(kl_loss_coeff=0.3, rollout_correction="tis"), on_policy, lambda lp, old, sample: lp.detach())
    plain = run(none, on_policy, lambda lp, old, sample: None)
    assert tis[0] == plain[0] and np.array_equal(tis[1], plain[1])
    assert step.LossSums(tis[2]).means()["rollout_correction/ratio_mean"] == 1.0


def update_batch(sample_logprobs):
    """N rows of random prompts and completions (LOSS_MASK), judged, with the given sampler log-probs."""
    rng = np.random.default_rng(2)
    rollout = Rollout(prompt_ids=paddle.to_tensor(rng.integers(3, V, size=(N, L))),
                      prompt_mask=paddle.ones([N, L], dtype="int64"),
                      completion_ids=paddle.to_tensor(rng.integers(3, V, size=(N, T)) * LOSS_MASK),
                      completion_mask=paddle.to_tensor(LOSS_MASK), lengths=LOSS_MASK.sum(1),
                      truncated=np.array([True, True, False, False]),
                      sample_logprobs=paddle.to_tensor(sample_logprobs))
    scores = [1.0, 0.0, 0.5, 0.0]
    return step.Batch.from_rollout(rollout, ["t"] * N, RewardResult(scores, {"f": scores}, [None] * N),
                                   list(range(N // G)), G)


def run_update(cfg, sample_logprobs):
    """One real step.update (AdamW, micro-batches of 2 rows, on-policy) of a fresh tiny model; (metrics, params)."""
    model = random_bias_qwen2(V, seed=3)
    batch = update_batch(sample_logprobs)
    adv = paddle.to_tensor(np.repeat(np.array([[1.0], [-1.0], [0.5], [-0.5]], np.float32), T, 1))
    scheduler = paddle.optimizer.lr.LambdaDecay(1e-2, lambda s: 1.0)
    learner = step.Learner(CausalPolicy(model), None, paddle.optimizer.AdamW(learning_rate=scheduler,
                                                                             parameters=model.parameters()), scheduler)
    inputs = step.UpdateInputs(batch, adv, batch.completion_mask, None, None)
    metrics = step.update(ParallelContext(), learner, inputs, cfg, cfg.batch_geometry(1), 0).as_dict()
    return metrics, {k: v.numpy().copy() for k, v in model.state_dict().items()}


def test_a_real_update_with_none_ignores_the_sampler_and_tis_weights_it():
    rng = np.random.default_rng(4)
    sample = (-rng.uniform(3.0, 8.0, (N, T)) * LOSS_MASK).astype(np.float32)
    m0, p0 = run_update(cfg_of(), sample)
    m1, p1 = run_update(cfg_of(), np.where(LOSS_MASK == 1, sample - 3.0, np.nan).astype(np.float32))
    assert all(np.array_equal(p0[k], p1[k]) for k in p0)
    differ = {k for k in m0 if m0[k] != m1[k] and k.startswith("rollout_correction/")}
    assert {k: m0[k] for k in m0 if k not in differ} == {k: m1[k] for k in m1 if k not in differ}
    assert differ == {f"rollout_correction/{k}" for k in ("ratio_mean", "ratio_max", "kl", "ess", "ppl_ratio")}
    assert "rollout_correction/capped_frac" not in m0 and "rollout_correction/masked_frac" not in m0
    # The same batch with tis: the sampler's log-probs are spread around the model's (~log 1/96 = -4.6), some
    # tokens are capped, others weighted by their ratio, and the update differs. (Had every token been capped,
    # every gradient would be exactly twice its uncorrected value, and Adam, invariant to the gradient's scale up
    # to its epsilon, would take the same steps bit for bit.)
    m2, p2 = run_update(cfg_of(rollout_correction="tis"), sample)
    assert 0.1 < m2["rollout_correction/capped_frac"] < 0.9 and m2["rollout_correction/ratio_max"] > 2.0
    assert any(not np.array_equal(p0[k], p2[k]) for k in p0)
    assert m2["rollout_correction/ratio_mean"] == m0["rollout_correction/ratio_mean"]  # same forward, same ratios


# ------------------------------------------------------------------------------------------- end to end

REWARD = """
def length_reward(prompts, completions, **kwargs):
    return [0.1 * len(c) for c in completions]
"""


@pytest.mark.e2e
@pytest.mark.parametrize("mini, mode, extra", [
    (-1, "tis", {}),
    (2, "tis", {}),
    (2, "mis", {"rl_algorithm": "reinforce_plus_plus", "kl_coeff": 0.01, "importance_sampling_level": "sequence"}),
    (-1, "mis", {"rl_algorithm": "ppo", "critic_model_name_or_path": "<the policy>"}),
], ids=["grpo_on_policy", "grpo_off_policy", "rpp_gspo_off_policy", "ppo_on_policy"])
def test_a_synchronous_run_logs_a_ratio_of_one(tmp_path, tiny_policy_dir, mini, mode, extra):
    """The sampler (the decode steps with a KV cache) and the trainer (a teacher-forced forward; off-policy the
    recomputed old log-probs) compute the same log-probs up to float32 rounding: tests/rollout/test_rollout.py's
    bound for the tiny policy (hidden 64, intermediate 128, 2 layers, vocab 320), so every ratio is within
    exp(+-LP_TOL) of 1, none is capped or dropped, and the mean and max are too. GRPO on- and off-policy, REINFORCE++
    with GSPO's sequence ratio, PPO (its policy side; the critic is the policy's backbone)."""
    import json

    from paddle_grpo.trainer import Trainer
    from resume_helpers import read_metrics

    lp_tol = tiny_lm_tol(128, 2, 320)
    rows = [{"src": f"<|im_start|>user\nWho is {n}?<|im_end|>\n<|im_start|>assistant\n", "tgt": n}
            for n in ("Ann", "Bob", "Cid", "Dan")]
    (tmp_path / "train.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    (tmp_path / "rewards.py").write_text(REWARD)
    out = tmp_path / "out"
    values = dict(
        actor_model_name_or_path=tiny_policy_dir, use_rm_server=False,
        reward_funcs=f"{tmp_path / 'rewards.py'}:length_reward", train_datasets=str(tmp_path / "train.jsonl"),
        output_dir=str(out), logging_dir=str(out / "vdl"), max_prompt_len=32, max_dec_len=8, min_dec_len=1,
        max_length=40, global_batch_size=4, global_mini_batch_size=mini, rollout_n=4, per_device_train_batch_size=8,
        per_device_logprob_batch_size=16, learning_rate=2e-3, max_steps=2, kl_coeff=0.0, save_strategy="no",
        disable_tqdm=True, seed=7, temperature=0.9, rollout_correction=mode)
    values.update({k: (tiny_policy_dir if v == "<the policy>" else v) for k, v in extra.items()})
    cfg = config_from_dict(values)
    Trainer(cfg).train()
    metrics = read_metrics(cfg.output_dir)
    assert [r["step"] for r in metrics] == [1, 2]
    for row in metrics:
        assert row["train/optimizer_steps"] in ((1, 2) if mini == -1 else (2, 4))
        assert math.exp(-lp_tol) <= row["rollout_correction/ratio_mean"] <= math.exp(lp_tol), row
        assert math.exp(-lp_tol) <= row["rollout_correction/ratio_max"] <= math.exp(lp_tol), row
        kept, other = ("capped_frac", "masked_frac") if mode == "tis" else ("masked_frac", "capped_frac")
        assert row[f"rollout_correction/{kept}"] == 0.0 and f"rollout_correction/{other}" not in row


# --------------------------------------------------------------------------------------------------- config

@pytest.mark.parametrize("values, key, message", [
    ({"rollout_correction": "tis", "rollout_correction_cap": 1.0}, "rollout_correction_cap", "must be greater than 1"),
    ({"rollout_correction": "mis", "rollout_correction_cap": 0.5}, "rollout_correction_cap", "must be greater than 1"),
    ({"rollout_correction": "mis", "rollout_correction_min": 1.0}, "rollout_correction_min", r"must be in \[0, 1\)"),
    ({"rollout_correction": "mis", "rollout_correction_min": -0.1}, "rollout_correction_min", r"must be in \[0, 1\)"),
    ({"rollout_correction": "icepop"}, "rollout_correction", "must be one of 'none', 'tis', 'mis', 'clip'"),
])
def test_config_errors_name_the_key(values, key, message):
    with pytest.raises(ConfigError, match=rf"key '{key}' = .*{message}"):
        config_from_dict(values)


def test_bounds_a_mode_does_not_read_are_inert_not_errors():
    cfg = config_from_dict({"rollout_correction": "tis", "rollout_correction_min": 3.0})
    assert not run_key_effect(cfg, "rollout_correction_min", "cpu").active
    assert run_key_effect(cfg, "rollout_correction_cap", "cpu").active
    cfg = config_from_dict({"rollout_correction_cap": 0.5})  # none: neither bound is read
    assert "rollout_correction is 'none'" in run_key_effect(cfg, "rollout_correction_cap", "gpu").note
    cfg = config_from_dict({"rollout_correction": "mis", "rollout_correction_min": 0.0})
    assert run_key_effect(cfg, "rollout_correction_min", "cpu").active
    cfg = config_from_dict({"rollout_correction": "clip", "rollout_correction_cap": 0.5})  # the clip range rules
    for key in ("rollout_correction_cap", "rollout_correction_min"):
        assert "clip_range_ratio" in run_key_effect(cfg, key, "cpu").note


def test_dry_run_shows_the_keys_and_the_inert_bound(tmp_path, tiny_policy_dir, capsys):
    from dry_run_helpers import base_args, run_rl_main

    argv = [*base_args(tmp_path, tiny_policy_dir), "--rollout_correction", "tis", "--rollout_correction_cap", "3",
            "--rollout_correction_min", "0.2", "--dry_run"]
    status, out, _ = run_rl_main(argv, capsys)
    assert status == 0, out
    changed = out.split("checks:")[0]
    assert "rollout_correction: tis" in changed and "rollout_correction_cap: 3.0" in changed
    inert = out.split("keys set here that have no effect")[1].split("processes:")[0]
    assert "rollout_correction_min" in inert and "only caps the ratio from above" in inert
    assert "rollout_correction_cap" not in inert
