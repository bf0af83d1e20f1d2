"""The critic's loss (`value_loss`, PaddleNLP's RLHFValueLoss), `explained_variance`, `positive_example_mask`, against
per-token numpy loops written here, hand-computed values, and the whole batch against its micro-batch / rank splits.

Tolerances. The loss is a float32 sum of n <= 64 non-negative terms per call: two evaluations (whole batch against a
sum of shares, or float32 against the float64 loop) differ by at most f32_sum_tol(n, sum of terms) (tests/numerics.py,
Higham's bound for sums in any order), plus a few roundings per term before the sum (square, 0.5, division: 4u of
the same magnitude). The gradient of one token is `(V - R) / N` or 0: 3 roundings (subtraction, scaling by 0.5 * 2,
division), so 4u relative to |V - R| / N whatever the split.
"""
import numpy as np
import paddle
import pytest

from paddle_grpo.algorithms import explained_variance, global_denominators, positive_example_mask, value_loss
from tests.numerics import EPS32, f32_sum_tol

pytestmark = pytest.mark.numerics


def case(seed, mb=8, T=10, c=0.2):
    """Values near their old values (about half the tokens outside the clip range), returns, a ragged mask with an
    empty row and a 1-token row, inf/NaN garbage on padding."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, T + 1, size=mb)
    lengths[:2] = [0, 1]
    mask = np.arange(T)[None, :] < lengths[:, None]
    old = rng.normal(size=(mb, T)).astype(np.float32)
    values = (old + rng.normal(scale=2 * c, size=(mb, T))).astype(np.float32)
    returns = (old + rng.normal(size=(mb, T))).astype(np.float32)
    for x in (old, values, returns):
        x[~mask] = np.nan
    values[~mask] = np.inf
    return values, old, returns, mask


def loss_loop(values, old, returns, mask, c):
    """PaddleNLP's form, per token in float64: V_clip = min(max(V, V_old - c), V_old + c);
    0.5 * sum max((V - R)^2, (V_clip - R)^2) / n_valid, and the count of tokens where the clipped term is larger."""
    total, clipped, n = 0.0, 0, 0
    grad = np.zeros(values.shape)
    for i, t in zip(*np.nonzero(mask)):
        v, vo, r = float(values[i, t]), float(old[i, t]), float(returns[i, t])
        v_clip = min(max(v, vo - c), vo + c)
        l1, l2 = (v - r) ** 2, (v_clip - r) ** 2
        total += 0.5 * max(l1, l2)
        clipped += l2 > l1
        n += 1
        # d/dV: the unclipped branch gives V - R; the clipped one gives (V_clip - R) * [V inside the clip range]
        grad[i, t] = (v - r) if l1 >= l2 else (v_clip - r) * (abs(v - vo) < c)
    n = max(n, 1)
    return total / n, clipped / n, grad / n


def run(values, old, returns, mask, c, **agg):
    v = paddle.to_tensor(values, stop_gradient=False)
    out = value_loss(v, paddle.to_tensor(old), paddle.to_tensor(returns), paddle.to_tensor(mask), c, **agg)
    out["loss"].backward()
    return float(out["loss"]), float(out["clip_frac"]), v.grad.numpy()


@pytest.mark.parametrize("seed", range(4))
def test_value_loss_matches_loop(seed):
    c = 0.2
    values, old, returns, mask = case(seed, c=c)
    loss, clip_frac, grad = run(values, old, returns, mask, c)
    ref_loss, ref_frac, ref_grad = loss_loop(values, old, returns, mask, c)
    n = int(mask.sum())
    assert 0 < ref_frac < 1  # both branches occur
    np.testing.assert_allclose(loss, ref_loss, rtol=0, atol=f32_sum_tol(n, ref_loss) + 4 * EPS32 * ref_loss)
    assert clip_frac == pytest.approx(ref_frac, rel=2 * EPS32)  # count / n: one division
    assert np.isfinite(grad).all() and (grad[~mask] == 0).all()
    scale = np.abs(np.where(mask, values.astype(np.float64) - returns, 0)).max() / n + 1.0 / n
    np.testing.assert_allclose(grad, ref_grad, rtol=0, atol=4 * EPS32 * scale)


def test_value_loss_hand_computed():
    # c = 0.5, R = 0 for all three tokens:
    #  token 0: V_old 0, V 0.3 -> inside the range, both terms 0.09, not clipped: 0.5 * 0.09 = 0.045
    #  token 1: V_old 0, V 1.0 -> V_clip 0.5; (1 - 0)^2 = 1 > 0.25: unclipped term wins: 0.5
    #  token 2: V_old 2, V 0.5 -> V_clip 1.5; 0.25 < 2.25: clipped term wins (moving toward R is refused): 1.125
    # loss = (0.045 + 0.5 + 1.125) / 3 = 0.556666..., clip_frac = 1/3; gradient (V - R)/3 on tokens 0-1, 0 on token 2
    values = np.array([[0.3, 1.0, 0.5]])
    old = np.array([[0.0, 0.0, 2.0]])
    loss, frac, grad = run(values, old, np.zeros((1, 3)), np.ones((1, 3)), 0.5)
    assert loss == pytest.approx(1.67 / 3, rel=1e-14, abs=0) and frac == pytest.approx(1 / 3, rel=1e-15)  # float64
    np.testing.assert_allclose(grad, [[0.1, 1 / 3, 0.0]], rtol=1e-14, atol=0)


def test_huge_clip_range_is_half_the_mse():
    values, old, returns, mask = case(5)
    loss, frac, _ = run(values, old, returns, mask, 1e6)
    diff = (values.astype(np.float64) - returns)[mask]
    ref = 0.5 * np.mean(diff ** 2)
    assert frac == 0.0
    np.testing.assert_allclose(loss, ref, rtol=0, atol=f32_sum_tol(diff.size, ref) + 4 * EPS32 * ref)


def test_value_loss_is_independent_of_the_split():
    # The whole batch against (a) 3 micro-batches and (b) 2 simulated ranks with 2 micro-batches each, every call
    # given the global token count: the shares add up to the whole loss, the gradient of every token is the same.
    c = 0.2
    values, old, returns, mask = case(6, mb=12, T=9, c=c)
    agg = global_denominators(mask, "token-mean")
    whole_loss, whole_frac, whole_grad = run(values, old, returns, mask, c)

    def split(parts):
        counts = [global_denominators(mask[p], "token-mean") for p in parts]
        total = {k: sum(cnt[k] for cnt in counts) for k in counts[0]}  # the caller's sum / all-reduce
        assert total == agg
        loss = frac = 0.0
        grad = np.zeros_like(whole_grad)
        for p in parts:
            l_, f_, g_ = run(values[p], old[p], returns[p], mask[p], c, **total)
            loss, frac, grad[p] = loss + l_, frac + f_, g_
        return loss, frac, grad

    micro = [slice(0, 5), slice(5, 7), slice(7, 12)]
    ranks = [slice(0, 3), slice(3, 6), slice(6, 9), slice(9, 12)]  # rank 0: rows 0-5, rank 1: rows 6-11
    n = int(mask.sum())
    for loss, frac, grad in (split(micro), split(ranks)):
        # two float32 sums of the same n non-negative terms in another order (+ the float32 sum of the shares)
        np.testing.assert_allclose(loss, whole_loss, rtol=0, atol=f32_sum_tol(n + 4, whole_loss))
        assert frac == pytest.approx(whole_frac, abs=f32_sum_tol(4, 1.0))
        scale = np.abs(np.where(mask, values.astype(np.float64) - returns, 0)).max() / n
        np.testing.assert_allclose(grad, whole_grad, rtol=0, atol=4 * EPS32 * scale)


def test_value_loss_without_valid_tokens_is_zero():
    values, old, returns, _ = case(7)
    loss, frac, grad = run(values, old, returns, np.zeros(values.shape, dtype=bool), 0.2)
    assert loss == 0.0 and frac == 0.0 and (grad == 0).all()


# ---- explained variance ----------------------------------------------------------------------------------------------

def test_explained_variance():
    rng = np.random.default_rng(8)
    returns = rng.normal(size=(4, 6))
    values = returns + rng.normal(scale=0.5, size=(4, 6))
    mask = rng.random((4, 6)) > 0.3
    r, v = returns[mask], values[mask]
    ref = 1 - np.sum(((r - v) - (r - v).mean()) ** 2) / np.sum((r - r.mean()) ** 2)  # written out, float64
    assert explained_variance(values, returns, mask) == pytest.approx(ref, rel=1e-12)
    assert explained_variance(paddle.to_tensor(values), paddle.to_tensor(returns), paddle.to_tensor(mask)) == \
        pytest.approx(ref, rel=1e-12)
    garbage = np.where(mask, values, np.nan)
    assert explained_variance(garbage, returns, mask) == pytest.approx(ref, rel=1e-12)
    assert explained_variance(returns, returns, mask) == 1.0                      # perfect critic
    mean = np.full_like(returns, r.mean())
    assert explained_variance(mean, returns, mask) == pytest.approx(0.0, abs=1e-12)  # the mean: explains nothing
    assert np.isnan(explained_variance(values, returns, np.zeros_like(mask)))
    assert np.isnan(explained_variance(values, np.ones_like(returns), mask))        # constant returns: undefined


# ---- positive examples -----------------------------------------------------------------------------------------------

def test_positive_examples_are_every_correct_answer_of_the_batch():
    # The batch: 3 prompts x 4 samples, right/wrong rewards. The paper's T (arXiv 2504.05118, section 3.3)
    # is every correct answer: the all-correct group's 4 and the mixed group's 2, 6 rows (the group-best rule that
    # this replaced marked only the mixed group's 2).
    scores = np.array([1, 1, 1, 1, 1, 0, 0, 1, 0, 0, 0, 0], dtype=np.float64)
    valid = np.ones(12, dtype=bool)
    expected = [True, True, True, True, True, False, False, True, False, False, False, False]
    assert positive_example_mask(scores, valid, 1.0 - 1e-6).tolist() == expected


def test_positive_examples_with_continuous_rewards_and_unjudged_rows():
    # Continuous rewards: correct from the threshold on (>=, exactly), whatever the group; an unjudged row (invalid,
    # its score NaN or stale) never counts.
    scores = np.array([3.0, 2.0, 2.5, np.nan, 9.0, -1.0, 2.5 - 1e-9])
    valid = np.array([1, 1, 1, 0, 0, 1, 1], dtype=bool)
    assert positive_example_mask(scores, valid, 2.5).tolist() == [True, False, True, False, False, False, False]
    assert positive_example_mask(np.zeros(0), np.zeros(0, dtype=bool), 1.0).shape == (0,)
    with pytest.raises(ValueError, match="same length"):
        positive_example_mask(np.zeros(2), np.zeros(3, dtype=bool), 1.0)
    with pytest.raises(ValueError, match="min_reward must be a finite number"):
        positive_example_mask(np.zeros(2), np.ones(2, dtype=bool), float("nan"))
