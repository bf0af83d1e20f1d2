"""Policy losses, aggregation and logit helpers against loop / numpy references (docs/algorithms.md sections 4, 5).

Tolerances: float32 results vs float64 references rtol=1e-5, atol=1e-6 unless stated: token losses are a few
elementwise roundings (ratio = exp(lp - old), clip, product with the advantage: 4 u = 2.4e-7 relative), and the
aggregations sum at most 64 tokens of size ~2: f32_sum_tol(64, 2) = 1.5e-5 absolute at worst for sums of size ~10,
and errors of random sign add up to about sqrt(64) u, well under rtol=1e-5. Float64 finite differences rtol=1e-6,
atol=1e-8: central differences at h = 1e-6 are off by h^2 (third derivative) / 6 ~ 1e-12 and by rounding
u64 |loss| / h ~ 1e-10. Log-softmax and entropy over at most 13 classes: after the max shift a sum of at most 13
positive terms, relative error <= 13 u, so 2 * 13 u = 1.6e-6 absolute in its log between two evaluations, plus the
shift's rounding (u |z| <= 1e-6 for logits up to 15): within atol 1e-5. Paddle's elementwise and reduction kernels are
compiled in, the same on any x86 CPU (tests/numerics.py).
"""
import math

import numpy as np
import paddle
import pytest

from paddle_grpo.algorithms import (
    LOSS_AGG_MODES,
    UnknownNameError,
    aggregate_loss,
    compute_policy_loss,
    entropy_from_logits,
    get_policy_loss,
    global_denominators,
    kl_penalty,
    logprobs_from_logits,
)

pytestmark = pytest.mark.numerics  # compares float results: CI reruns it on other CPU kernels

MAX_DEC_LEN = 9


def ragged_mask(rng, bs, T, empty_rows=1):
    lengths = rng.integers(1, T + 1, size=bs)
    lengths[rng.choice(bs, size=empty_rows, replace=False)] = 0
    return (np.arange(T)[None, :] < lengths[:, None]).astype(np.float32)


# ---- references ------------------------------------------------------------------------------------------------------

def ref_aggregate(L, m, mode, max_dec_len=MAX_DEC_LEN):
    bs, T = L.shape
    if mode == "token-mean":
        num = sum(L[i, t] for i in range(bs) for t in range(T) if m[i, t])
        den = sum(1 for i in range(bs) for t in range(T) if m[i, t])
        return num / den
    seq_sums = [sum(L[i, t] for t in range(T) if m[i, t]) for i in range(bs)]
    seq_lens = [sum(1 for t in range(T) if m[i, t]) for i in range(bs)]
    if mode == "seq-mean-token-mean":
        means = [s / n for s, n in zip(seq_sums, seq_lens) if n > 0]
        return sum(means) / len(means)
    if mode == "seq-mean-token-sum":
        return sum(seq_sums) / bs
    return sum(seq_sums) / (bs * max_dec_len)


def ref_token_losses(lp, old, A, m, eps_low, eps_high, c=None, level="token"):
    bs, T = lp.shape
    out = np.zeros((bs, T))
    for i in range(bs):
        valid = [t for t in range(T) if m[i, t]]
        if level == "sequence" and valid:
            seq = sum(lp[i, t] - old[i, t] for t in valid) / len(valid)
            seq_ratio = math.exp(min(max(seq, -20.0), 20.0))
        for t in valid:
            ratio = seq_ratio if level == "sequence" else math.exp(min(max(lp[i, t] - old[i, t], -20.0), 20.0))
            a = A[i, t]
            loss = max(-a * ratio, -a * min(max(ratio, 1 - eps_low), 1 + eps_high))
            if c is not None and a < 0:
                loss = min(loss, -c * a)
            out[i, t] = loss
    return out


def random_policy_case(seed, bs=5, T=6, spread=0.4, dtype=np.float32):
    rng = np.random.default_rng(seed)
    mask = ragged_mask(rng, bs, T)
    old = rng.normal(-1.5, 0.5, size=(bs, T))
    lp = old + rng.normal(0.0, spread, size=(bs, T))
    A = rng.normal(0.0, 1.0, size=(bs, T))
    return [x.astype(dtype) for x in (lp, old, A)] + [mask]


def tensors(*arrays):
    return [paddle.to_tensor(a) for a in arrays]


# ---- aggregate_loss --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@pytest.mark.parametrize("seed,shape", [(0, (4, 5)), (1, (6, 3)), (2, (3, 8))])
def test_aggregate_matches_loop_reference(mode, seed, shape):
    rng = np.random.default_rng(seed)
    L = rng.normal(size=shape).astype(np.float32)
    m = ragged_mask(rng, *shape)
    out = aggregate_loss(paddle.to_tensor(L), paddle.to_tensor(m), mode, max_dec_len=MAX_DEC_LEN)
    assert out.shape == [] and out.dtype == paddle.float32
    np.testing.assert_allclose(float(out), ref_aggregate(L.astype(float), m, mode), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_aggregate_ignores_garbage_in_padding_and_empty_batch_is_zero(mode):
    L = np.array([[1.0, 2.0, np.inf], [np.nan, -np.inf, 3.0]], dtype=np.float32)
    m = np.array([[1, 1, 0], [0, 0, 1]], dtype=np.float32)
    out = float(aggregate_loss(paddle.to_tensor(L), paddle.to_tensor(m), mode, max_dec_len=MAX_DEC_LEN))
    np.testing.assert_allclose(out, ref_aggregate(np.nan_to_num(L, posinf=0, neginf=0), m, mode), rtol=1e-6)
    empty = aggregate_loss(paddle.to_tensor(L), paddle.zeros([2, 3]), mode, max_dec_len=MAX_DEC_LEN)
    assert float(empty) == 0.0


@pytest.mark.parametrize("mode", [m for m in LOSS_AGG_MODES if m != "seq-mean-token-sum-norm"])
def test_max_dec_len_is_ignored_by_the_other_modes(mode):
    rng = np.random.default_rng(3)
    L, m = paddle.to_tensor(rng.normal(size=(4, 5))), paddle.to_tensor((rng.random((4, 5)) < 0.7).astype(np.float64))
    assert float(aggregate_loss(L, m, mode, max_dec_len=MAX_DEC_LEN)) == float(aggregate_loss(L, m, mode))


def test_aggregate_errors():
    with pytest.raises(ValueError, match="max_dec_len"):
        aggregate_loss(paddle.ones([2, 2]), paddle.ones([2, 2]), "seq-mean-token-sum-norm")
    with pytest.raises(UnknownNameError) as info:
        aggregate_loss(paddle.ones([2, 2]), paddle.ones([2, 2]), "sum")
    for mode in LOSS_AGG_MODES:
        assert mode in str(info.value)
    with pytest.raises(UnknownNameError):
        global_denominators(paddle.ones([2, 2]), "token_mean")


def test_global_denominators_counts():
    m = paddle.to_tensor([[1, 1, 0], [0, 0, 0], [1, 0, 0]])
    assert global_denominators(m, "token-mean") == {"num_global_tokens": 3, "num_global_seqs": 3}
    assert global_denominators(m, "seq-mean-token-mean") == {"num_global_tokens": 3, "num_global_seqs": 2}
    assert global_denominators(m, "seq-mean-token-sum-norm")["num_global_seqs"] == 3


# ---- split invariance ------------------------------------------------------------------------------------------------

# rank -> micro-batches (rows); deliberately uneven, and row 5 has no valid token.
SPLIT = [[[0, 1, 2], [3]], [[4, 5], [6, 7]]]


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_split_across_micro_batches_and_ranks_matches_whole_batch(mode, level):
    """Loss and gradient of the whole batch == sum over 2 ranks x 2 micro-batches with global denominators, both
    for per-token log-prob leaves and for a parameter shared by all tokens (accumulated by repeated backward)."""
    rng = np.random.default_rng(7)
    bs, T, d = 8, 6, 3
    mask = (np.arange(T)[None, :] < np.array([6, 2, 5, 1, 3, 0, 4, 6])[:, None]).astype(np.float32)
    base = rng.normal(-1.5, 0.3, size=(bs, T)).astype(np.float32)
    feats = rng.normal(size=(bs, T, d)).astype(np.float32)
    w0 = rng.normal(0.0, 0.3, size=d).astype(np.float32)
    old = base + rng.normal(0.0, 0.3, size=(bs, T)).astype(np.float32)  # some tokens clipped
    ref = base + rng.normal(0.0, 0.3, size=(bs, T)).astype(np.float32)
    A = rng.normal(size=(bs, T)).astype(np.float32)

    def loss_on(w, rows, **denominators):
        lp = paddle.to_tensor(base[rows]) + paddle.matmul(paddle.to_tensor(feats[rows]), w)
        pg = compute_policy_loss(lp, paddle.to_tensor(old[rows]), paddle.to_tensor(A[rows]),
                                 paddle.to_tensor(mask[rows]), 0.2, 0.28, 3.0, level, mode,
                                 max_dec_len=MAX_DEC_LEN, **denominators)["pg_loss"]
        kl = aggregate_loss(kl_penalty(lp, paddle.to_tensor(ref[rows])), paddle.to_tensor(mask[rows]), mode,
                            max_dec_len=MAX_DEC_LEN, **denominators)
        return pg + 0.1 * kl

    w_whole = paddle.to_tensor(w0, stop_gradient=False)
    whole = loss_on(w_whole, list(range(bs)))
    whole.backward()

    denominators = {"num_global_tokens": 0, "num_global_seqs": 0}
    for micro_batches in SPLIT:
        for rows in micro_batches:
            for key, value in global_denominators(mask[rows], mode).items():
                denominators[key] += value
    total, grad = 0.0, np.zeros(d)
    for micro_batches in SPLIT:  # one parameter copy per rank; gradients accumulate over its micro-batches
        w_rank = paddle.to_tensor(w0, stop_gradient=False)
        for rows in micro_batches:
            share = loss_on(w_rank, rows, **denominators)
            share.backward()
            total += float(share)
        grad += w_rank.grad.numpy()  # the all-reduce (SUM)
    # the same float32 sums over the tokens in another order (micro-batches, ranks): see the module's tolerances
    np.testing.assert_allclose(total, float(whole), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(grad, w_whole.grad.numpy(), rtol=1e-5, atol=1e-7)

    # per-token gradients: every token's gradient is the same whichever micro-batch it is in
    lp_whole = paddle.to_tensor(base, stop_gradient=False)
    compute_policy_loss(lp_whole, old, A, mask, 0.2, 0.28, 3.0, level, mode,
                        max_dec_len=MAX_DEC_LEN)["pg_loss"].backward()
    for micro_batches in SPLIT:
        for rows in micro_batches:
            lp_part = paddle.to_tensor(base[rows], stop_gradient=False)
            compute_policy_loss(lp_part, old[rows], A[rows], mask[rows], 0.2, 0.28, 3.0, level, mode,
                                max_dec_len=MAX_DEC_LEN, **denominators)["pg_loss"].backward()
            np.testing.assert_allclose(lp_part.grad.numpy(), lp_whole.grad.numpy()[rows], rtol=1e-5, atol=1e-8)


def test_split_without_global_denominators_differs():
    """Guards the test above: averaging per-micro-batch token-means is NOT the whole-batch token-mean."""
    L = np.array([[1.0, 1.0, 1.0], [4.0, 0.0, 0.0]], dtype=np.float32)
    m = np.array([[1, 1, 1], [1, 0, 0]], dtype=np.float32)
    whole = float(aggregate_loss(paddle.to_tensor(L), paddle.to_tensor(m)))
    naive = np.mean([float(aggregate_loss(paddle.to_tensor(L[i:i + 1]), paddle.to_tensor(m[i:i + 1])))
                     for i in range(2)])
    shares = sum(float(aggregate_loss(paddle.to_tensor(L[i:i + 1]), paddle.to_tensor(m[i:i + 1]),
                                      num_global_tokens=4)) for i in range(2))
    assert whole == pytest.approx(7 / 4) and naive == pytest.approx(5 / 2) and shares == pytest.approx(7 / 4)


# ---- compute_policy_loss values --------------------------------------------------------------------------------------

@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("clip_ratio_c", [None, 3.0])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_policy_loss_matches_loop_reference(level, clip_ratio_c, seed):
    lp, old, A, mask = random_policy_case(seed, bs=4 + seed, T=5 + seed, spread=0.5 if level == "token" else 1.2)
    out = compute_policy_loss(*tensors(lp, old, A, mask), clip_ratio_low=0.2, clip_ratio_high=0.28,
                              clip_ratio_c=clip_ratio_c, importance_sampling_level=level)
    expected = ref_token_losses(lp, old, A, mask, 0.2, 0.28, clip_ratio_c, level)
    np.testing.assert_allclose(out["pg_losses"].numpy(), expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(float(out["pg_loss"]), expected.sum() / mask.sum(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(float(out["approx_kl_old"]), ((old - lp) * mask).sum() / mask.sum(), rtol=1e-5,
                               atol=1e-6)


def test_clip_fractions_hand_computed():
    # (A, rho) per token, eps_low = eps_high = 0.2, c = 3:
    #  (+1, 1.5) high | (-1, 0.5) low | (-1, 4.0) dual | (+1, 0.5) none | (-1, 1.1) none | (+1, 1.1) none | masked
    #  (-1, 2.0) none (dual bound 3 > L^clip 2) | (0, 5.0) none
    A = np.array([[1, -1, -1, 1, -1, 1, 1], [-1, 0, 0, 0, 0, 0, 0]], dtype=np.float32)
    rho = np.array([[1.5, 0.5, 4.0, 0.5, 1.1, 1.1, 2.0], [2.0, 5.0, 1, 1, 1, 1, 1]])
    mask = np.array([[1, 1, 1, 1, 1, 1, 0], [1, 1, 0, 0, 0, 0, 0]], dtype=np.float32)
    old = np.full(A.shape, -2.0, dtype=np.float32)
    lp = (old + np.log(rho)).astype(np.float32)
    out = compute_policy_loss(*tensors(lp, old, A, mask), clip_ratio_c=3.0)
    assert float(out["clip_frac_low"]) == pytest.approx(1 / 8)
    assert float(out["clip_frac_high"]) == pytest.approx(1 / 8)
    assert float(out["clip_frac_dual"]) == pytest.approx(1 / 8)
    np.testing.assert_allclose(out["pg_losses"].numpy(),
                               [[-1.2, 0.8, 3.0, -0.5, 1.1, -1.1, 0.0], [2.0, 0, 0, 0, 0, 0, 0]], rtol=1e-6)
    assert float(out["pg_loss"]) == pytest.approx((-1.2 + 0.8 + 3.0 - 0.5 + 1.1 - 1.1 + 2.0) / 8, rel=1e-6)
    no_dual = compute_policy_loss(*tensors(lp, old, A, mask))
    assert float(no_dual["clip_frac_dual"]) == 0.0
    assert no_dual["pg_losses"].numpy()[0, 2] == pytest.approx(4.0, rel=1e-6)
    asymmetric = compute_policy_loss(*tensors(lp, old, A, mask), clip_ratio_low=0.6, clip_ratio_high=0.05)
    # low: rho < 0.4 -> none; high: rho > 1.05 with A > 0 -> 1.5 and 1.1
    assert float(asymmetric["clip_frac_low"]) == 0.0
    assert float(asymmetric["clip_frac_high"]) == pytest.approx(2 / 8)


def test_gspo_clips_whole_sequences():
    # sequence 0: mean log-ratio log(1.5) with A > 0 -> every token clipped high; sequence 1: ratio 1, unclipped
    old = np.full((2, 3), -1.0, dtype=np.float32)
    lp = old + np.array([[0.2, math.log(1.5) * 3 - 0.5, 0.3], [0.5, -0.5, 9.0]], dtype=np.float32)
    mask = np.array([[1, 1, 1], [1, 1, 0]], dtype=np.float32)
    A = np.array([[1.0, 1.0, 1.0], [2.0, 2.0, 2.0]], dtype=np.float32)
    out = compute_policy_loss(*tensors(lp, old, A, mask), importance_sampling_level="sequence")
    np.testing.assert_allclose(out["pg_losses"].numpy(), [[-1.2, -1.2, -1.2], [-2.0, -2.0, 0.0]], rtol=1e-5)
    assert float(out["clip_frac_high"]) == pytest.approx(3 / 5)


# ---- gradients -------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_detached_old_log_prob_gives_reinforce_gradient(mode):
    """old = l.detach() (seed 004): ratio exactly 1, gradient = -A * d agg / d L, i.e. REINFORCE."""
    lp_np, _, A, mask = random_policy_case(3, bs=4, T=5)
    lp = paddle.to_tensor(lp_np, stop_gradient=False)
    out = compute_policy_loss(lp, lp.detach(), paddle.to_tensor(A), paddle.to_tensor(mask), clip_ratio_c=3.0,
                              loss_agg_mode=mode, max_dec_len=MAX_DEC_LEN)
    out["pg_loss"].backward()
    lengths = mask.sum(1)
    weight = {  # d agg / d L_{i,t} on valid tokens
        "token-mean": np.full(4, 1 / mask.sum()),
        "seq-mean-token-mean": np.where(lengths > 0, 1 / np.maximum(lengths, 1) / (lengths > 0).sum(), 0),
        "seq-mean-token-sum": np.full(4, 1 / 4),
        "seq-mean-token-sum-norm": np.full(4, 1 / (4 * MAX_DEC_LEN)),
    }[mode]
    np.testing.assert_allclose(lp.grad.numpy(), -A * mask * weight[:, None], rtol=1e-5, atol=1e-8)
    np.testing.assert_allclose(float(out["pg_loss"]), ref_aggregate(-A.astype(float), mask, mode, MAX_DEC_LEN),
                               rtol=1e-5, atol=1e-7)
    assert float(out["clip_frac_low"]) == float(out["clip_frac_high"]) == float(out["approx_kl_old"]) == 0.0
    # old_log_prob is detached inside, so passing the very same tensor gives the same (non-zero) gradient
    lp2 = paddle.to_tensor(lp_np, stop_gradient=False)
    compute_policy_loss(lp2, lp2, paddle.to_tensor(A), paddle.to_tensor(mask), loss_agg_mode=mode,
                        max_dec_len=MAX_DEC_LEN)["pg_loss"].backward()
    np.testing.assert_allclose(lp2.grad.numpy(), lp.grad.numpy(), rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("level,clip_ratio_c,mode", [
    ("token", None, "token-mean"),
    ("token", 2.0, "seq-mean-token-mean"),
    ("sequence", None, "seq-mean-token-sum"),
    ("sequence", 2.0, "token-mean"),
])
def test_gradient_matches_finite_differences(level, clip_ratio_c, mode):
    old = np.array([[-1.0, -2.0, -0.5, -1.5], [-0.7, -1.2, -3.0, -1.0], [-2.0, -0.3, -1.1, -0.9]])
    log_ratio = np.array([[0.5, -0.9, 0.05, 1.5], [-0.05, 1.2, 0.1, 0.0], [0.3, -0.4, 0.02, 0.0]])
    A = np.array([[1.0, -1.0, 0.5, -2.0], [0.7, 1.3, 0.4, 0.0], [0.9, 0.8, -1.1, 0.0]])
    mask = np.array([[1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 1, 0]], dtype=np.float64)
    lp0 = old + log_ratio
    # token level: (0,0), (1,1), (2,0) clipped high, (0,1) clipped low, (0,3) rho = e^1.5 > c = 2 with A < 0:
    # dual-clipped when c = 2. Sequence level: rho = 1.33 (A mixed), 1.52 (all A > 0: clipped), 0.97.
    # No ratio is within 1e-2 of a kink, so central differences are valid.

    def loss(lp_np):
        return float(compute_policy_loss(paddle.to_tensor(lp_np), paddle.to_tensor(old), paddle.to_tensor(A),
                                         paddle.to_tensor(mask), 0.2, 0.2, clip_ratio_c, level, mode,
                                         max_dec_len=5)["pg_loss"])

    lp = paddle.to_tensor(lp0, stop_gradient=False)
    out = compute_policy_loss(lp, paddle.to_tensor(old), paddle.to_tensor(A), paddle.to_tensor(mask), 0.2, 0.2,
                              clip_ratio_c, level, mode, max_dec_len=5)
    assert out["pg_loss"].dtype == paddle.float64
    out["pg_loss"].backward()
    grad = lp.grad.numpy()
    h = 1e-6
    numeric = np.zeros_like(lp0)
    for idx in np.ndindex(*lp0.shape):
        plus, minus = lp0.copy(), lp0.copy()
        plus[idx] += h
        minus[idx] -= h
        numeric[idx] = (loss(plus) - loss(minus)) / (2 * h)
    np.testing.assert_allclose(grad, numeric, rtol=1e-6, atol=1e-8)
    assert (grad[mask == 0] == 0).all()
    if level == "token":  # clipped tokens carry no gradient
        assert grad[0, 0] == grad[0, 1] == grad[1, 1] == grad[2, 0] == 0.0
        assert (grad[0, 3] == 0.0) == (clip_ratio_c is not None)
        assert (grad[0, 2] != 0.0) and (grad[1, 0] != 0.0) and (grad[2, 1] != 0.0)
    else:  # a clipped sequence carries no gradient; in the others every valid token does
        assert (grad[1] == 0.0).all()
        assert (grad[[0, 2]][mask[[0, 2]] > 0] != 0.0).all()


def test_extreme_log_ratios_stay_finite():
    # rows' mean log-ratios are +-2000/3: the sequence-level (GSPO) ratio needs its own clamp
    lp = np.array([[1000.0, 1000.0, 0.0], [-1000.0, -1000.0, 0.0]], dtype=np.float32)
    old = np.zeros_like(lp)
    A = np.array([[1.0, -1.0, 1.0], [1.0, -1.0, 0.5]], dtype=np.float32)
    mask = np.ones_like(lp)
    for level in ("token", "sequence"):
        for c in (None, 3.0):
            x = paddle.to_tensor(lp, stop_gradient=False)
            out = compute_policy_loss(x, old, A, mask, clip_ratio_c=c, importance_sampling_level=level)
            out["pg_loss"].backward()
            for key, value in out.items():
                assert np.isfinite(value.numpy()).all(), (level, c, key)
            assert np.isfinite(x.grad.numpy()).all()
            np.testing.assert_allclose(out["pg_losses"].numpy(),
                                       ref_token_losses(lp, old, A, mask, 0.2, 0.2, c, level), rtol=1e-5)


def test_masked_rows_and_padding_garbage_do_not_leak():
    lp = np.array([[-1.0, -2.0, np.nan], [np.inf, -np.inf, np.nan]], dtype=np.float32)
    old = np.array([[-1.1, -1.9, -np.inf], [np.nan, np.inf, -np.inf]], dtype=np.float32)
    A = np.array([[1.0, -1.0, np.nan], [np.inf, 1.0, 2.0]], dtype=np.float32)
    mask = np.array([[1, 1, 0], [0, 0, 0]], dtype=np.float32)
    for level in ("token", "sequence"):
        for mode in LOSS_AGG_MODES:
            x = paddle.to_tensor(lp, stop_gradient=False)
            out = compute_policy_loss(x, old, A, mask, importance_sampling_level=level, loss_agg_mode=mode,
                                      max_dec_len=4)
            out["pg_loss"].backward()
            for key, value in out.items():
                assert np.isfinite(value.numpy()).all(), (level, mode, key)
            assert (out["pg_losses"].numpy()[mask == 0] == 0).all()
            grad = x.grad.numpy()
            assert np.isfinite(grad).all() and (grad[mask == 0] == 0).all()
            clean = ref_token_losses(np.nan_to_num(lp), np.nan_to_num(old), np.nan_to_num(A), mask, 0.2, 0.2,
                                     None, level)
            np.testing.assert_allclose(float(out["pg_loss"]), ref_aggregate(clean, mask, mode, 4), rtol=1e-5)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_low_precision_inputs_give_float32(dtype):
    lp, old, A, mask = random_policy_case(5, bs=3, T=4)
    lp_t = paddle.to_tensor(lp).astype(dtype)
    lp_t.stop_gradient = False
    old_t, A_t = paddle.to_tensor(old).astype(dtype), paddle.to_tensor(A).astype(dtype)
    out = compute_policy_loss(lp_t, old_t, A_t, paddle.to_tensor(mask).astype("bool"))
    for key, value in out.items():
        assert value.dtype == paddle.float32, key
    expected = ref_token_losses(*(t.astype("float32").numpy() for t in (lp_t, old_t, A_t)), mask, 0.2, 0.2)
    np.testing.assert_allclose(out["pg_losses"].numpy(), expected, rtol=1e-5, atol=1e-6)
    out["pg_loss"].backward()
    assert lp_t.grad is not None and np.isfinite(lp_t.grad.astype("float32").numpy()).all()
    assert aggregate_loss(paddle.to_tensor(lp).astype(dtype), mask).dtype == paddle.float32


def test_policy_loss_argument_errors():
    x = paddle.zeros([2, 3])
    for bad in (1.0, 0.5):
        with pytest.raises(ValueError, match="clip_ratio_c"):
            compute_policy_loss(x, x, x, x, clip_ratio_c=bad)
    with pytest.raises(UnknownNameError) as info:
        compute_policy_loss(x, x, x, x, importance_sampling_level="geo")
    for name in ("token", "sequence", "gspo", "vanilla"):
        assert name in str(info.value)
    with pytest.raises(UnknownNameError, match="vanilla"):
        get_policy_loss("ppo2")
    with pytest.raises(ValueError, match="shape"):
        compute_policy_loss(x, x, paddle.zeros([2, 4]), x)


def test_policy_loss_registry_names():
    assert get_policy_loss("clip") is get_policy_loss("vanilla")
    lp, old, A, mask = random_policy_case(6)
    by_level = compute_policy_loss(*tensors(lp, old, A, mask), importance_sampling_level="sequence")
    by_name = compute_policy_loss(*tensors(lp, old, A, mask), importance_sampling_level="gspo")
    np.testing.assert_array_equal(by_level["pg_losses"].numpy(), by_name["pg_losses"].numpy())


# ---- logits ----------------------------------------------------------------------------------------------------------

def ref_log_softmax(z):
    z = z.astype(np.float64)
    shifted = z - z.max(-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


@pytest.mark.parametrize("seed,temperature", [(0, 1.0), (1, 0.7), (2, 1.5)])
def test_logprobs_from_logits(seed, temperature):
    rng = np.random.default_rng(seed)
    logits = rng.normal(0, 3, size=(2, 4, 11)).astype(np.float32)
    labels = rng.integers(0, 11, size=(2, 4))
    out = logprobs_from_logits(paddle.to_tensor(logits), paddle.to_tensor(labels), temperature)
    expected = np.take_along_axis(ref_log_softmax(logits / temperature), labels[..., None], -1)[..., 0]
    assert out.dtype == paddle.float32 and list(out.shape) == [2, 4]
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("seed,temperature", [(0, 1.0), (1, 0.6)])
def test_entropy_from_logits(seed, temperature):
    rng = np.random.default_rng(seed)
    logits = rng.normal(0, 2, size=(3, 2, 13)).astype(np.float32)
    logp = ref_log_softmax(logits / temperature)
    expected = -(np.exp(logp) * logp).sum(-1)
    out = entropy_from_logits(paddle.to_tensor(logits), temperature)
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-5, atol=1e-5)


def test_logit_helpers_are_stable_and_promote_low_precision():
    logits = np.array([[[1e4, 1e4 - 1.0, -1e4, 0.0]]], dtype=np.float32)  # a naive exp overflows
    out = logprobs_from_logits(paddle.to_tensor(logits), paddle.to_tensor([[1]])).numpy()
    # not max-shifted by design: absolute error ~ float32 ulp of 1e4 (~1e-3)
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out, [[ref_log_softmax(logits)[0, 0, 1]]], atol=2e-3)
    ent = entropy_from_logits(paddle.to_tensor(logits)).numpy()
    p = np.exp(ref_log_softmax(logits))
    np.testing.assert_allclose(ent, -(p * np.log(np.maximum(p, 1e-300))).sum(-1), rtol=1e-5)
    uniform = entropy_from_logits(paddle.zeros([2, 3, 8]).astype("bfloat16"))
    assert uniform.dtype == paddle.float32
    np.testing.assert_allclose(uniform.numpy(), np.full((2, 3), math.log(8)), rtol=1e-6)
    lp = logprobs_from_logits(paddle.zeros([1, 2, 8]).astype("bfloat16"), paddle.to_tensor([[3, -100]]))
    assert lp.dtype == paddle.float32
    np.testing.assert_allclose(lp.numpy(), np.full((1, 2), -math.log(8)), rtol=1e-6)
