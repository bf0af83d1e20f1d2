"""Sampling at a real vocabulary (rollout/sampling.py, rollout.decode): the two-level inverse CDF against an exact numpy
float64 inverse CDF over many uniforms and distributions, top-k / top-p candidates against the full-vocabulary
filters (ties included), and a whole decode loop at V = 151,936 against a numpy float64 reference loop."""
import numpy as np
import paddle
import pytest
from numerics import EPS32, f32_sum_tol

from paddle_grpo.kernels.chunk_kernels import shifted_statistics
from paddle_grpo.rollout import decode, top_p_filter
from paddle_grpo.rollout.sampling import (candidates, row_keys, sample_with_uniforms, sample_with_uniforms_numpy,
                                          uniforms)

REAL_V = 151936
# The two implementations of the two-level inverse CDF: paddle ops (any device) and numpy (the CPU decode step).
SAMPLERS = {"paddle": lambda p, u, block: sample_with_uniforms(paddle.to_tensor(p), u, block=block).numpy(),
            "numpy": lambda p, u, block: sample_with_uniforms_numpy(p, u, block=block)}


def exact_inverse_cdf(p, u):
    """Reference: float64 cumsum of the float32 probabilities; the first token whose cdf exceeds u * total,
    clamped to the last non-zero token. Returns (token, the cdf, the target) per row."""
    p = np.asarray(p, dtype=np.float64)
    cdf = np.cumsum(p, axis=-1)
    target = u * cdf[:, -1]
    tok = (cdf <= target[:, None]).sum(-1)
    last = p.shape[1] - 1 - np.argmax((p > 0)[:, ::-1], axis=-1)
    return np.minimum(tok, last), cdf, target


def distributions(V, rng):
    """Rows of float32 probabilities of several kinds: flat, peaked, sparse, zero runs, one-hot."""
    rows = [rng.dirichlet(np.full(V, 1.0)),                       # flat
            rng.dirichlet(np.full(V, 0.01)),                      # peaked: most mass on few tokens
            np.exp(3 * rng.standard_normal(V))]                   # LM-like logits
    r = rng.random(V)
    r[V // 3:] = 0.0                                              # a zero-probability run to the end
    rows.append(r)
    r = rng.random(V)
    r[: V // 2] = 0.0                                             # zeros first, mass at the end
    r[-7:] = 0.0
    rows.append(r)
    r = rng.random(V)
    r[rng.random(V) < 0.9] = 0.0                                  # sparse, zeros inside blocks
    rows.append(r)
    for hot in (0, V // 2, V - 1):                                # one-hot at the edges and in the middle
        r = np.zeros(V)
        r[hot] = 1.0
        rows.append(r)
    p = np.stack(rows)
    return (p / p.sum(-1, keepdims=True)).astype(np.float32)


@pytest.mark.parametrize("sampler", sorted(SAMPLERS))
@pytest.mark.parametrize("V,block", [(1000, 128), (1000, 512), (4099, 512), (4099, 256), (20000, 1024), (REAL_V, 512),
                                     (40, 512)])
def test_two_level_inverse_cdf_equals_the_exact_float64_one(V, block, sampler):
    rng = np.random.default_rng(V + block)
    base = distributions(V, rng)
    reps = 16 if V > 100000 else 64
    p = np.repeat(base, reps, axis=0)
    u = rng.random(len(p))
    u[::reps] = 0.0                                               # every distribution at u = 0 ...
    u[1::reps] = 1.0 - 2.0 ** -53                                 # ... and just below 1
    got = SAMPLERS[sampler](p, u, block)
    ref, cdf, target = exact_inverse_cdf(p, u)
    assert (p[np.arange(len(p)), got] > 0).all()                  # never a zero-probability token
    differ = np.nonzero(got != ref)[0]
    for i in differ:  # only where the target is within float32 rounding of a cdf boundary
        gap = np.abs(cdf[i] - target[i]).min()
        assert gap <= 2e-6 * cdf[i, -1], (V, i, got[i], ref[i], gap)
    # Such a u is rare: about 1 draw in 300 for a flat distribution over 151,936 tokens (0 for peaked ones).
    assert len(differ) <= 2 + 0.01 * len(p)


@pytest.mark.parametrize("sampler", sorted(SAMPLERS))
def test_two_level_inverse_cdf_at_block_boundaries_and_one_hot_rows(sampler):
    V, block = 3000, 512                                          # 6 blocks, the last one partial
    p = np.zeros((4, V), dtype=np.float32)
    p[0, [511, 512, 1023, 2999]] = 0.25                           # mass on both sides of block edges
    p[1, 2999] = 1.0                                              # only the very last token
    p[2, 0] = 1.0
    p[3, 1024:1536] = 1.0 / 512                                   # exactly one full block
    for u0 in (0.0, 0.1, 0.26, 0.5, 0.74, 0.76, 0.999999):
        u = np.full(4, u0)
        got = SAMPLERS[sampler](p, u, block)
        ref = exact_inverse_cdf(p, u)[0]
        assert got.tolist() == ref.tolist(), u0


def numpy_filter(p, top_k=0, top_p=1.0):
    """PaddleNLP's TopKProcess then TopPProcess (ties kept at both cut-offs), on float32 probabilities with a
    float32 sequential cumulative sum, as rollout.top_p_filter. Returns the kept mask [n, V]."""
    keep = np.ones(p.shape, dtype=bool)
    for i, row in enumerate(p):
        s = -np.sort(-row)
        thr = s[top_k - 1] if 0 < top_k < len(row) else 0.0
        if top_p < 1.0:
            cum = np.cumsum(s, dtype=np.float32)
            n_keep = int(((cum - s) < np.float32(top_p)).sum())
            thr = max(thr, s[n_keep - 1])
        keep[i] = row >= thr
    return keep


def tied_distributions(V, rng):
    """float32 rows with exact ties at likely cut-offs, including ties that extend past the first candidates."""
    rows = [np.exp(3 * rng.standard_normal(V)), rng.dirichlet(np.full(V, 1.0)), rng.dirichlet(np.full(V, 0.05))]
    r = np.full(V, 1.0)                                           # a long flat tie: the whole vocabulary
    rows.append(r)
    r = np.full(V, 1e-3)                                          # a few large, then 3000 equal, then small
    r[:5] = [50, 40, 30, 20, 10]
    r[5:3005] = 0.2
    rows.append(rng.permutation(r))
    r = np.exp(2 * rng.standard_normal(V))                        # many duplicated values (quantised)
    rows.append(np.round(r, 1) + 1e-3)
    p = np.stack(rows)
    return (p / p.sum(-1, keepdims=True)).astype(np.float32)


@pytest.mark.parametrize("V", [300, 5000, REAL_V])
@pytest.mark.parametrize("top_k,top_p", [(0, 0.9), (0, 0.5), (0, 0.999), (1, 1.0), (5, 1.0), (50, 1.0),
                                         (50, 0.8), (3000, 0.95), (10**9, 0.7)])
def test_candidates_keep_exactly_what_the_full_vocabulary_filter_keeps(V, top_k, top_p):
    rng = np.random.default_rng(V + top_k)
    p = tied_distributions(V, rng)
    ids, weights = candidates(paddle.to_tensor(p), top_k, top_p)
    full = np.zeros_like(p)
    if ids is None:
        full = weights.numpy()
    else:
        ids, weights = ids.numpy(), weights.numpy()
        assert (np.diff(ids, axis=-1) > 0).all()                  # vocabulary order, no repeats
        np.put_along_axis(full, ids, weights, axis=-1)
    keep = numpy_filter(p, top_k, top_p)
    assert ((full > 0) == keep).all()
    np.testing.assert_array_equal(full[keep], p[keep])            # the kept probabilities themselves
    if top_k in (0, 10**9):  # top-p alone: the same set as today's full-sort filter
        np.testing.assert_array_equal(top_p_filter(paddle.to_tensor(p), top_p).numpy() > 0, keep)


@pytest.mark.numerics
@pytest.mark.parametrize("top_k,top_p", [(0, 0.9), (40, 1.0), (40, 0.9)])
def test_sampling_among_candidates_picks_the_full_vocabulary_token(top_k, top_p):
    rng = np.random.default_rng(top_k)
    V = 20000
    p = np.exp(3 * rng.standard_normal((64, V)))
    p = (p / p.sum(-1, keepdims=True)).astype(np.float32)
    u = uniforms(row_keys(3, 1, np.arange(64)), 0)
    ids, weights = candidates(paddle.to_tensor(p), top_k, top_p)
    got = np.take_along_axis(ids.numpy(), sample_with_uniforms(weights, u).numpy()[:, None], axis=-1)[:, 0]
    kept = np.where(numpy_filter(p, top_k, top_p), p, 0.0)
    ref, cdf, target = exact_inverse_cdf(kept, u)
    differ = np.nonzero(got != ref)[0]
    # A float32 draw may pick another token than the float64 inverse CDF only where the target lies within the
    # float32 CDF's rounding of a boundary: cumulative sums of at most 1257 kept probabilities (top_p 0.9 here),
    # positive terms adding up to <= 1, so within 1257 u of the exact CDF at worst.
    assert all(np.abs(cdf[i] - target[i]).min() <= f32_sum_tol(1257, 1.0) / 2 for i in differ)
    # In practice rounding errors of random sign add up to ~sqrt(1257) u = 2e-6, and a uniform draw lands that close
    # to a boundary (candidate probabilities >= 1e-4 wide here) with chance ~4e-2 per row at most: <= 1 of 64 rows.
    assert len(differ) <= 1


class FakeStepper:
    """Logits [N, V] that depend only on (row, step): a numpy float64 reference can replay the same loop."""

    def __init__(self, N, V, scale, seed=0):
        self.N, self.V, self.scale, self.seed, self.t = N, V, scale, seed, 0

    def logits(self, t):
        rng = np.random.default_rng(self.seed * 1000 + t)
        return (self.scale * rng.standard_normal((self.N, self.V))).astype(np.float32)

    def start(self, prompt_ids, prompt_mask, G, max_new_tokens):
        self.t = 0
        return paddle.to_tensor(self.logits(0))

    def step(self, token):
        self.t += 1
        return paddle.to_tensor(self.logits(self.t))


def reference_decode(stepper, prompt, G, T, min_new, eos, temperature, top_k, top_p, penalty, keys):
    """The decode contract in numpy float64: tokens and log-probs of the temperature-scaled logits."""
    N = len(prompt) * G
    seen = [set(prompt[i // G]) for i in range(N)] if penalty != 1.0 else None
    toks, lps = [], []
    for t in range(T):
        z = stepper.logits(t).astype(np.float64) / temperature
        logp = z - z.max(-1, keepdims=True)
        logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
        w = z.copy()
        if seen is not None:
            for i in range(N):
                c = list(seen[i])
                w[i, c] = np.where(w[i, c] > 0, w[i, c] / penalty, w[i, c] * penalty)
        if t < min_new:
            w[:, eos] = -np.inf
        p = np.exp(w - w.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        p = np.where(numpy_filter(p.astype(np.float32), top_k, top_p), p, 0.0)
        tok = exact_inverse_cdf(p, uniforms(keys, t))[0]
        toks.append(tok)
        lps.append(logp[np.arange(N), tok])
        if seen is not None:
            for i in range(N):
                seen[i].add(int(tok[i]))
    return np.stack(toks, 1), np.stack(lps, 1)


@pytest.mark.numerics
@pytest.mark.parametrize("kw", [dict(temperature=0.7, top_k=0, top_p=1.0, penalty=1.0, min_new=0),
                                dict(temperature=1.0, top_k=50, top_p=0.9, penalty=1.3, min_new=3),
                                dict(temperature=0.5, top_k=0, top_p=0.7, penalty=1.0, min_new=0),
                                dict(temperature=1.3, top_k=0, top_p=1.0, penalty=1.2, min_new=2),
                                dict(temperature=1.0, top_k=0, top_p=1.0, penalty=1.0, min_new=3)])
def test_decode_at_the_real_vocabulary_matches_a_float64_reference(kw):
    prompt = np.array([[5, 17, 99, 151000], [7, 7, 8, 9]])
    G, T, eos = 4, 6, [REAL_V - 1, 3]
    keys = row_keys(11, 2, np.arange(len(prompt) * G))
    stepper = FakeStepper(len(prompt) * G, REAL_V, scale=3.0)
    ids, lps, lengths, truncated = decode(stepper, paddle.to_tensor(prompt), paddle.ones([2, 4], dtype="int64"),
                                          G, T, kw["min_new"], eos, 0, kw["temperature"], kw["top_p"],
                                          kw["penalty"], True, keys, True, kw["top_k"])
    ref_ids, ref_lps = reference_decode(stepper, prompt.tolist(), G, T, kw["min_new"], eos, kw["temperature"],
                                        kw["top_k"], kw["top_p"], kw["penalty"], keys)
    assert (lengths == T).all() and truncated.all()              # the EOS ids are too unlikely to be drawn
    np.testing.assert_array_equal(ids.numpy(), ref_ids)
    # On CPU the decode step sums exp over the 151,936 terms with numpy's pairwise summation (rollout/single_turn.py,
    # NUMPY_FROM_VOCAB): within float32 rounding of the float64 reference (paddle's own float32 sums, as in
    # paddle.logsumexp, are off by ~1e-4 relative at this size) ...
    # pairwise sums of 151,936 terms <= 1 (relative error (log2 V + 1) u = 1.1e-6, absolute in the log) after
    # logits ~N(0, 9) / temperature >= 0.5 shifted by their max (|z - m| <= 60: 60 u = 3.6e-6 per rounding, 3 of them)
    np.testing.assert_allclose(lps.numpy(), ref_lps, atol=3e-5)
    # ... and the log-probs are what the chunked LM head (use_fused_head_and_loss_fn; chunk_kernels.py) computes
    # for the same logits when it recomputes them for the update.
    for t in range(T):
        z = paddle.to_tensor(stepper.logits(t)) / kw["temperature"]
        _, picked, lse_s, _ = shifted_statistics(z.clone(), ids[:, t], False)
        # two float32 evaluations of the same pairwise-summed statistics (rollout/ and chunk_kernels.py): the
        # sums' (log2 V + 1) u twice, and the shifted logit's rounding (|z - m| <= 60) in each
        np.testing.assert_allclose(lps.numpy()[:, t], (picked - lse_s).numpy(), rtol=0,
                                   atol=2 * (np.log2(REAL_V) + 1) * EPS32 + 2 * 60 * EPS32)


@pytest.mark.parametrize("min_new", [0, 3])
def test_greedy_decode_at_the_real_vocabulary_takes_the_argmax(min_new):
    """Greedy decoding (do_sample=False: the numpy step on CPU when nothing else processes the logits) picks each
    row's largest logit, the EOS ids excluded before `min_new` tokens; the log-probs are the float64 ones."""
    prompt = np.array([[5, 17, 99, 151000], [7, 7, 8, 9]])
    G, T = 2, 5
    stepper = FakeStepper(len(prompt) * G, REAL_V, scale=3.0)
    first = stepper.logits(0)
    eos = [int(first[0].argmax()), 3]  # row 0's favourite first token is an EOS id: blocked while t < min_new
    ids, lps, _, _ = decode(stepper, paddle.to_tensor(prompt), paddle.ones([2, 4], dtype="int64"), G, T, min_new,
                            eos, 0, 1.0, 1.0, 1.0, False, None, True, 0)
    for t in range(int(ids.shape[1])):
        z = stepper.logits(t).astype(np.float64)
        blocked = z.copy()
        if t < min_new:
            blocked[:, eos] = -np.inf
        live = ids.numpy()[:, t] != 0
        np.testing.assert_array_equal(ids.numpy()[live, t], blocked.argmax(-1)[live])
        lse = np.log(np.exp(z - z.max(-1, keepdims=True)).sum(-1)) + z.max(-1)
        ref = z[np.arange(len(z)), ids.numpy()[:, t]] - lse
        # as the sampled case above: pairwise float32 sums, |z - m| <= 60
        np.testing.assert_allclose(lps.numpy()[live, t], ref[live], atol=3e-5)
    assert (ids.numpy()[0, 0] == eos[0]) == (min_new == 0)
