"""Counter-based sampling noise (paddle_grpo/rollout/sampling.py): uniform, deterministic, independent of batching, and
inverse-CDF sampling that matches a numpy reference and the target distribution."""
import numpy as np
import paddle

from paddle_grpo.rollout.sampling import row_keys, sample_with_uniforms, uniforms


def test_uniforms_are_deterministic_and_do_not_depend_on_the_batch():
    keys = row_keys(seed=42, step=3, rows=np.arange(64))
    u = uniforms(keys, 5)
    assert np.array_equal(u, uniforms(row_keys(42, 3, np.arange(64)), 5))
    # rows 32..63 sampled by "another rank" get exactly the same numbers
    assert np.array_equal(u[32:], uniforms(row_keys(42, 3, np.arange(32, 64)), 5))
    assert not np.array_equal(u, uniforms(row_keys(42, 4, np.arange(64)), 5))   # another step
    assert not np.array_equal(u, uniforms(row_keys(43, 3, np.arange(64)), 5))   # another seed
    assert not np.array_equal(u, uniforms(keys, 6))                              # another position


def test_uniforms_are_uniform_and_uncorrelated():
    keys = row_keys(0, 0, np.arange(20000))
    u0, u1 = uniforms(keys, 0), uniforms(keys, 1)
    assert (u0 >= 0).all() and (u0 < 1).all()
    # mean 1/2 and variance 1/12, each within ~5 standard errors for n = 20000
    assert abs(u0.mean() - 0.5) < 5 * np.sqrt(1 / 12 / 20000)
    assert abs(u0.var() - 1 / 12) < 0.004
    counts = np.histogram(u0, bins=10, range=(0, 1))[0]
    chi2 = ((counts - 2000) ** 2 / 2000).sum()
    assert chi2 < 30  # 9 degrees of freedom: p < 0.001 above 27.9
    assert abs(np.corrcoef(u0, u1)[0, 1]) < 0.03


def test_inverse_cdf_matches_a_numpy_reference():
    rng = np.random.default_rng(0)
    probs = rng.dirichlet(np.ones(17), size=50)
    probs[:, 3] = 0.0
    probs /= probs.sum(-1, keepdims=True)
    u = rng.random(50)
    got = sample_with_uniforms(paddle.to_tensor(probs.astype(np.float32)), u).numpy()
    expected = [int(np.searchsorted(np.cumsum(p), x, side="right")) for p, x in zip(probs, u)]
    assert got.tolist() == expected
    assert 3 not in got.tolist()


def test_edges_never_pick_a_zero_probability_token():
    probs = paddle.to_tensor(np.array([[0.5, 0.5, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0]], dtype=np.float32))
    got = sample_with_uniforms(probs, np.array([0.999999999, 0.999999999])).numpy()
    assert got.tolist() == [1, 1]
    assert sample_with_uniforms(probs, np.array([0.0, 0.0])).numpy().tolist() == [0, 1]


def test_sampled_frequencies_match_the_distribution():
    p = np.array([0.05, 0.6, 0.1, 0.25])
    n = 20000
    u = uniforms(row_keys(7, 0, np.arange(n)), 0)
    got = sample_with_uniforms(paddle.to_tensor(np.tile(p, (n, 1)).astype(np.float32)), u).numpy()
    freq = np.bincount(got, minlength=4) / n
    # statistics, not rounding: 5 binomial standard errors (at most sqrt(0.25 / n)) of each frequency
    np.testing.assert_allclose(freq, p, atol=5 * np.sqrt(0.25 / n))


def test_keyed_rollout_does_not_depend_on_chunking_or_on_which_rows_are_sampled_together(tiny_policy_dir):
    from paddle_grpo.policy import load_tokenizer
    from paddle_grpo.policy.causal import generate, load_causal_lm

    model, tok = load_causal_lm(tiny_policy_dir), load_tokenizer(tiny_policy_dir)
    texts = ["Zoey is a knight", "What is", "You meet 2"]
    ids = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    L = max(map(len, ids))
    pid = np.array([[tok.pad_token_id] * (L - len(x)) + x for x in ids])
    mask = np.array([[0] * (L - len(x)) + [1] * len(x) for x in ids])
    keys = row_keys(5, 0, np.arange(12))
    kw = dict(num_samples=4, max_new_tokens=10, eos_token_ids=[tok.eos_token_id], pad_token_id=tok.pad_token_id,
              temperature=1.3)
    whole = generate(model, pid, mask, row_keys=keys, **kw)
    chunked = generate(model, pid, mask, row_keys=keys, max_num_seqs=4, **kw)
    last_only = generate(model, pid[2:], mask[2:], row_keys=keys[8:], **kw)  # e.g. rank 1's share
    w = whole.completion_ids.numpy()
    assert np.array_equal(w, chunked.completion_ids.numpy())
    assert np.array_equal(w[8:, :last_only.completion_ids.shape[1]], last_only.completion_ids.numpy())
    assert len({tuple(r) for r in w[:4]}) > 1  # the 4 samples of one prompt differ
