"""Changes to the decode engine that keep its results bit for bit, against the code they replaced (kept here as the
reference, verbatim from commit 33c1044):

- kernels/prefix_attention.py: the shared-prefix attention holds its scores as [P, KV, W * g, S] (no copies of the
  probabilities or of p.v, the prefix mask added in place, the suffix's all-zero mask skipped when the engine says
  so);
- policy/decode_engine.py: a step's keys and values written through a basic index while every row writes the same
  slot, and the suffix mask checked once a step; dropped rows' caches compacted in place (`compact_rows`), where
  the reference copies the kept rows into new arrays.

No tolerance: each product is the same BLAS or oneDNN call on the same operands and each elementwise operation the
same, so the outputs must be equal to the last bit (`assert_array_equal` on the bytes' values, -0.0 == 0.0 aside,
which the softmax treats alike). Each test can fail: a skipped mask, a mis-strided view or a write to the wrong slot
changes the logits far above the last bit.
"""
import numpy as np
import paddle
import pytest
from fast_decoder_helpers import V, make_model, prefix_attention_inputs

from paddle_grpo.kernels.prefix_attention import SMALL_PRODUCT, _scatter, shared_prefix_attention, softmax_
from paddle_grpo.policy import decode_engine, fast_decoder
from paddle_grpo.policy.causal import generate
from paddle_grpo.rollout.sampling import row_keys

pytestmark = pytest.mark.numerics


def reference_attention(q, prefix, suffix, mask, groups):
    """shared_prefix_attention as of commit 33c1044 (scores per row [N, KV, g, S])."""
    kp, vp = prefix
    ks, vs = suffix
    N, KV, g, d = q.shape
    P, L, T, W = groups.prompts, kp.shape[2], ks.shape[2], groups.width
    scores = np.empty((N, KV, g, L + T), np.float32)
    if g * T <= SMALL_PRODUCT:
        np.matmul(q, ks.transpose(0, 1, 3, 2), out=scores[..., L:])
    else:
        scores[..., L:] = np.matmul(ks, q.transpose(0, 1, 3, 2)).transpose(0, 1, 3, 2)
    grid = q if groups.flat is None else _scatter(q, groups.flat, P * W)
    grid = grid.reshape(P, W, KV, g, d)
    if W * g * L <= SMALL_PRODUCT:
        prefix_scores = np.matmul(grid.transpose(0, 2, 1, 3, 4).reshape(P, KV, W * g, d), kp.transpose(0, 1, 3, 2))
        prefix_scores = prefix_scores.reshape(P, KV, W, g, L).transpose(0, 2, 1, 3, 4)
    else:
        prefix_scores = np.matmul(kp, grid.transpose(0, 2, 4, 1, 3).reshape(P, KV, d, W * g))
        prefix_scores = prefix_scores.reshape(P, KV, L, W, g).transpose(0, 3, 1, 4, 2)
    if groups.flat is None:
        scores.reshape(P, W, KV, g, L + T)[..., :L] = prefix_scores
    else:
        scores[..., :L] = prefix_scores.reshape(P * W, KV, g, L)[groups.flat]
    scores += mask[:, None, None, :]
    softmax_(scores)
    out = np.matmul(scores[..., L:], vs)
    if groups.flat is None:
        p = scores.reshape(P, W, KV, g, L + T)[..., :L]
    else:
        p = _scatter(scores[..., :L], groups.flat, P * W).reshape(P, W, KV, g, L)
    pv = np.matmul(np.ascontiguousarray(p.transpose(0, 2, 1, 3, 4)).reshape(P, KV, W * g, L), vp)
    pv = pv.reshape(P, KV, W, g, d).transpose(0, 2, 1, 3, 4).reshape(P * W, KV, g, d)
    out += pv if groups.flat is None else pv[groups.flat]
    return out


class ReferenceEngine(decode_engine.DecodeEngine):
    """DecodeEngine with commit 33c1044's step (per-row index writes, the whole mask added every layer, the
    reference attention) and commit ec3acfc's keep_rows (the kept rows' caches copied into new arrays)."""

    def keep_rows(self, rows):
        rows = np.asarray(rows, dtype=np.int64)
        self.cache = [(kc[rows], vc[rows]) for kc, vc in self.cache]  # fancy indexing copies
        if self.prefix is not None:  # the prompts no kept row uses are let go
            self.groups, used = self.groups.keep(rows)
            if len(used) < len(self.prefix[0][0]):
                self.prefix = [(kp[used], vp[used]) for kp, vp in self.prefix]
        self.mask, self.pos, self.write = self.mask[rows], self.pos[rows], self.write[rows]
        self.N = len(rows)
        self.rows = np.arange(self.N)

    def step_numpy(self, token, keep=None, out=None):
        N, KV, g, d = self.N, self.KV, self.g, self.d
        self.all_slots = self.all_slots or keep is not None
        keep = np.ones(N, dtype=bool) if keep is None else np.asarray(keep, dtype=bool)
        w = np.minimum(self.write, self.S - 1)
        self.mask[self.rows, w] = np.where(keep, np.float32(0.0), self.neg)
        S = self.S if self.all_slots else int(w.max()) + 1
        mask = self.mask[:, None, None, :S]

        def attend(li, q, k, v):
            kc, vc = self.cache[li]
            if self.prefix is not None:
                kc[self.rows, :, w - self.L] = k
                vc[self.rows, :, w - self.L] = v
                T = S - self.L
                return reference_attention(q.reshape(N, KV, g, d) * self.scale, self.prefix[li],
                                           (kc[:, :, :T], vc[:, :, :T]), self.mask[:, :S],
                                           self.groups).reshape(N, self.H * d)
            kc[self.rows, :, w] = k
            vc[self.rows, :, w] = v
            scores = np.matmul(q.reshape(N, KV, g, d) * self.scale, kc[:, :, :S].transpose(0, 1, 3, 2))
            scores += mask
            return np.matmul(self._softmax(scores), vc[:, :, :S]).reshape(N, self.H * d)

        x = self._layers(self.embed[token], self.pos, attend)
        step = keep.astype(np.int64)
        self.write += step
        self.pos += step
        return self.head(self._rms(x, self.final_norm), out=out)


@pytest.mark.parametrize("P,G,L,T,pads,rows,idle", [
    (3, 4, 1, 1, (0, 0, 0), None, False),             # a one-token prefix, the first decode step
    (2, 4, 9, 1, (0, 5), None, False),                # left padding of different lengths, first step
    (3, 4, 7, 12, (0, 2, 6), None, False),            # later steps, every row appending (single-turn)
    (3, 4, 7, 12, (0, 2, 6), None, True),             # a row idling (multi-turn `keep`): the suffix mask counts
    (4, 1, 6, 5, (0, 1, 2, 5), None, False),          # one sample per prompt
    (3, 4, 7, 12, (0, 2, 6), [0, 1, 2, 5, 8, 9, 10, 11], False),  # rows dropped: groups of 3, 1 and 4 (padded)
    (3, 4, 7, 12, (0, 2, 6), [0, 1, 4, 5, 8, 9], False),  # rows dropped, groups of 2 each: no padding
    (2, 4, 120, 401, (0, 30), None, False),           # both scores as K q^T (past SMALL_PRODUCT)
    (2, 4, 120, 401, (0, 30), [0, 1, 2, 3, 5], True),  # the same, padded groups, a row idling
])
def test_attention_equals_the_previous_code_bit_for_bit(P, G, L, T, pads, rows, idle):
    q, (kp, vp), (ks, vs), mask, groups = prefix_attention_inputs(P, G, L, T, pads, rows, idle, cache_views=True)
    want = reference_attention(q, (kp, vp), (ks, vs), mask, groups)
    got = shared_prefix_attention(q, (kp, vp), (ks, vs), mask, groups)
    np.testing.assert_array_equal(got, want)
    if not idle:  # the engine's single-turn case: the suffix's zero mask skipped
        np.testing.assert_array_equal(shared_prefix_attention(q, (kp, vp), (ks, vs), mask, groups,
                                                              suffix_unmasked=True), want)
    elif groups.flat is None:  # the flag matters where the suffix is masked: the idle slot then has a weight
        assert not np.array_equal(shared_prefix_attention(q, (kp, vp), (ks, vs), mask, groups,
                                                           suffix_unmasked=True), want)


def prompts(P=3, L=7, seed=3):
    """[P, L] left-padded prompt ids and mask (numpy): prompts of L, L - 2 and L - 5 tokens."""
    rng = np.random.default_rng(seed)
    mask = np.ones((P, L), dtype=np.int64)
    mask[1 % P, :2] = 0
    mask[-1, :5] = 0
    return np.where(mask == 1, rng.integers(3, V, size=(P, L)), 0), mask


@pytest.mark.parametrize("G", [3, 1])
def test_engine_steps_equal_the_previous_code_bit_for_bit(G):
    """Prefill, steps, two drops of rows, steps with rows idling (multi-turn `keep`, before the drops too, so that
    the rows have written different numbers of slots when their caches move): logits equal to the reference
    engine's at every step (G = 3: the shared prefix; G = 1: the per-row layout)."""
    model = make_model("qwen2")
    ids, mask = prompts()
    with paddle.no_grad():
        new = decode_engine.DecodeEngine(fast_decoder.FastDecoder(model))
        old = ReferenceEngine(fast_decoder.FastDecoder(model))
        np.testing.assert_array_equal(new.prefill(ids, mask, G, 12), old.prefill(ids, mask, G, 12))
        rng = np.random.default_rng(0)
        for t in range(11):
            if t in (4, 8):  # single-turn drops finished rows (the cache compacted in place, the reference copies)
                rows = np.flatnonzero(rng.random(new.N) < 0.7)
                new.keep_rows(rows)
                old.keep_rows(rows)
            token = rng.integers(3, V, size=new.N)
            keep = None if t < 2 or t in (4, 5, 6) else rng.random(new.N) < 0.6
            got, want = new.step_numpy(token, keep), old.step_numpy(token, keep)
            np.testing.assert_array_equal(got, want)
            assert np.isfinite(got).all()


def test_a_rollout_equals_the_previous_code_bit_for_bit(monkeypatch):
    """`generate` with sampling (keyed draws), 4 samples per prompt: the same tokens and log-probs to the bit."""
    model = make_model("llama")
    ids, mask = prompts(seed=5)
    kw = dict(num_samples=4, max_new_tokens=14, min_new_tokens=14, eos_token_ids=[1], pad_token_id=0,
              temperature=1.0, row_keys=row_keys(4, 1, np.arange(12)))
    new = generate(model, ids, mask, **kw)
    monkeypatch.setattr(decode_engine, "DecodeEngine", ReferenceEngine)
    old = generate(model, ids, mask, **kw)
    np.testing.assert_array_equal(new.completion_ids.numpy(), old.completion_ids.numpy())
    np.testing.assert_array_equal(new.sample_logprobs.numpy(), old.sample_logprobs.numpy())


@pytest.mark.parametrize("rows", [[0, 1, 2, 3, 4, 5], [1, 3, 4], [0, 2, 5], [5], []])
def test_compact_rows_is_fancy_indexing_over_the_filled_slots(rows):
    """compact_rows against numpy's copy `cache[rows]`: equal over the filled slots, the other slots untouched in
    the moved rows (zeros there, as in a fresh cache), and the result a view of the same memory."""
    rng = np.random.default_rng(1)
    cache = np.zeros((6, 2, 9, 4), np.float32)
    cache[:, :, :5] = rng.standard_normal((6, 2, 5, 4), dtype=np.float32)  # 5 slots filled
    want = cache[np.asarray(rows, dtype=np.int64)]
    got = decode_engine.compact_rows(cache, np.asarray(rows, dtype=np.int64), 5)
    np.testing.assert_array_equal(got, want)
    assert got.shape == (len(rows), 2, 9, 4) and (np.shares_memory(got, cache) or not rows)


def test_keep_rows_refuses_rows_out_of_order():
    model = make_model("qwen2")
    ids, mask = prompts()
    with paddle.no_grad():
        engine = decode_engine.DecodeEngine(fast_decoder.FastDecoder(model))
        engine.prefill(ids, mask, 2, 4)
        for rows in ([2, 1], [0, 0, 3], [1, 6], [-1, 2]):
            with pytest.raises(ValueError, match=r"keep_rows takes increasing indices into the 6 current rows"):
                engine.keep_rows(np.asarray(rows))
