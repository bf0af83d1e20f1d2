"""The decode engine's shared prompt prefix (kernels/prefix_attention.py, policy/decode_engine.py) against the per-row
cache layout it replaces (PADDLE_GRPO_SHARED_PREFIX=0): the attention kernel alone on odd shapes, the engine's
logits step by step, and whole rollouts.

Tolerances. The attention of one query head over S slots, out = sum_s p_s v_s with p = softmax(q.k_s + mask):
- each score is a sum of d products; two float32 evaluations (another GEMM call) differ by at most
  delta = f32_sum_tol(d, max_s sum_j |q_j k_sj|);
- scores off by at most delta move each p_s by at most p_s (e^(2 delta) - 1) ~ 2 delta p_s (the max, exp and sum run
  in the same layout on both sides), so sum_s |dp_s| |v_s| <= 2 delta max|v|;
- p.v is a sum of S terms of total magnitude <= max|v| (sum p = 1): summed as prefix part + suffix part instead of
  one sum, the two evaluations differ by at most f32_sum_tol(S, max|v|) (any summation order is within
  (S - 1) u sum|terms| of the exact sum).
So |out_shared - out_per_row| <= 2 delta max|v| + f32_sum_tol(S, max|v|) (`attention_tol`). Through the model the
engine's logits are two float32 evaluations of the same function in other summation orders, which
tests/policy/test_decode_engine.py's LOGIT_TOL bounds (f32_sum_tol of the longest sum over the 9 chained sums per
layer and the final 2), and log-probs add the log-softmax's 2 V u.
"""
import numpy as np
import paddle
import pytest
from fast_decoder_helpers import V, attention_tol, make_model, per_row_attention, prefix_attention_inputs
from numerics import f32_sum_tol

from paddle_grpo.kernels.prefix_attention import SMALL_PRODUCT, PromptGroups, shared_prefix_attention
from paddle_grpo.policy import decode_engine, fast_decoder
from paddle_grpo.policy.causal import completion_logprobs, generate
from paddle_grpo.rollout.sampling import row_keys

pytestmark = pytest.mark.numerics

LAYERS = 2
LOGIT_TOL = f32_sum_tol(160, 1.0, depth=9 * LAYERS + 2)
LOGPROB_TOL = 2 * LOGIT_TOL + 2 * V * 2.0 ** -24


@pytest.mark.parametrize("P,G,L,T,pads,rows", [
    (3, 4, 1, 1, (0, 0, 0), None),           # a one-token prefix, the first decode step (the suffix is the token)
    (2, 4, 9, 1, (0, 5), None),              # left padding of different lengths, first step
    (3, 4, 7, 12, (0, 2, 6), None),          # later steps
    (4, 1, 6, 5, (0, 1, 2, 5), None),        # one sample per prompt: nothing shared, the kernel still agrees
    (3, 4, 7, 12, (0, 2, 6), [0, 1, 2, 5, 8, 9, 10, 11]),  # finished rows dropped: groups of 3, 1 and 4
    (3, 4, 5, 3, (1, 0, 2), [4, 6]),         # two prompts gone, the one left with two rows
    (2, 4, 120, 401, (0, 30), [0, 1, 2, 3, 5]),  # both scores as K q^T (past SMALL_PRODUCT), groups of 4 and 1
])
def test_shared_prefix_attention_equals_per_row(P, G, L, T, pads, rows):
    # row 0 idles at this step (multi-turn `keep`): its new slot hidden
    q, (kp, vp), (ks, vs), mask, groups = prefix_attention_inputs(P, G, L, T, pads, rows, idle=True)
    g = q.shape[2]
    if rows is not None:
        assert groups.flat is not None or len(set(np.bincount(groups.prompt))) == 1
    k = np.concatenate([kp[groups.prompt], ks], axis=2)   # the per-row layout's cache of the same rows
    v = np.concatenate([vp[groups.prompt], vs], axis=2)
    assert (groups.width * g * L > SMALL_PRODUCT) == (g * T > SMALL_PRODUCT) == (L > 100)
    got = shared_prefix_attention(q, (kp, vp), (ks, vs), mask, groups)
    want = per_row_attention(q, k, v, mask)
    tol = attention_tol(q, k, v, L + T)
    assert np.abs(got - want).max() <= tol, (np.abs(got - want).max(), tol)
    exact = per_row_attention(*(x.astype(np.float64) for x in (q, k, v, mask)))
    assert np.abs(got - exact).max() <= tol
    np.testing.assert_array_equal(shared_prefix_attention(q, (kp, vp), (ks, vs), mask, groups), got)


def test_prompt_groups_after_drops():
    groups = PromptGroups.of(np.repeat(np.arange(3), 4))
    assert (groups.prompts, groups.width, groups.flat) == (3, 4, None)
    kept, used = groups.keep(np.array([1, 2, 9]))
    assert used.tolist() == [0, 2] and kept.prompt.tolist() == [0, 0, 1] and kept.place.tolist() == [0, 1, 0]
    assert (kept.prompts, kept.width, kept.flat.tolist()) == (2, 2, [0, 1, 2])
    even, used = groups.keep(np.array([0, 3, 4, 5, 6, 7]))
    assert used.tolist() == [0, 1] and even.width == 4 and even.flat is not None
    assert PromptGroups.of(np.array([0, 0, 1, 1])).flat is None


def prompts(P=3, L=7, seed=3):
    """[P, L] left-padded prompt ids and mask (numpy), prompts of L, L - 2 and L - 5 tokens (at least one)."""
    rng = np.random.default_rng(seed)
    mask = np.ones((P, L), dtype=np.int64)
    mask[1 % P, :min(2, L - 1)] = 0
    mask[-1, :min(5, L - 1)] = 0
    return np.where(mask == 1, rng.integers(3, V, size=(P, L)), 0), mask


def engines(model, monkeypatch, G, T, L=7):
    """(shared, per-row) DecodeEngines after prefill of the same prompts and both first logits."""
    ids, mask = prompts(L=L)
    out = []
    with paddle.no_grad():
        for flag in ("1", "0"):
            monkeypatch.setenv(decode_engine.SHARED_PREFIX_SWITCH, flag)
            engine = decode_engine.DecodeEngine(fast_decoder.FastDecoder(model))
            out.append((engine, engine.prefill(ids, mask, G, T)))
    return out


@pytest.mark.parametrize("G,L", [(3, 7), (2, 1)])
def test_engine_logits_with_a_shared_prefix_equal_the_per_row_layout(monkeypatch, G, L):
    """Prefill (the same products on both sides: equal), then steps with rows idling on some (multi-turn `keep`:
    every slot attended) and a drop of rows that finished (single-turn): logits within LOGIT_TOL, the same argmax
    here, the caches equal bit for bit (the same keys and values, only stored once per prompt)."""
    model = make_model("qwen2")
    (shared, first), (per_row, again) = engines(model, monkeypatch, G, 10, L)
    assert shared.prefix is not None and per_row.prefix is None
    np.testing.assert_array_equal(first, again)
    token = paddle.argmax(paddle.to_tensor(first), axis=-1)
    with paddle.no_grad():
        for t in range(9):
            if t == 6:  # drop rows: the first prompt keeps one row, another none (grouped by a padded grid)
                rows = np.array([0] + list(range(2 * G, 3 * G)))
                shared.keep_rows(rows)
                per_row.keep_rows(rows)
                token = paddle.index_select(token, paddle.to_tensor(rows))
            keep = None if t < 2 or t >= 6 else paddle.to_tensor(np.arange(shared.N) % 3 != t % 3)
            got, want = shared.step(token, keep).numpy(), per_row.step(token, keep).numpy()
            assert np.abs(got - want).max() <= LOGIT_TOL, (t, np.abs(got - want).max())
            assert (got.argmax(-1) == want.argmax(-1)).all(), t
            token = paddle.argmax(paddle.to_tensor(want), axis=-1)
    for (ks, vs), (kr, vr) in zip(shared.row_caches(), per_row.row_caches()):
        assert np.abs(ks - kr).max() <= LOGIT_TOL and np.abs(vs - vr).max() <= LOGIT_TOL


def test_one_sample_per_prompt_keeps_the_per_row_layout(monkeypatch):
    """G = 1 (evaluation): nothing to share, the engine takes the per-row layout, bit for bit what it was."""
    model = make_model("llama")
    (shared, first), (per_row, again) = engines(model, monkeypatch, 1, 6)
    assert shared.prefix is None
    token = paddle.argmax(paddle.to_tensor(first), axis=-1)
    with paddle.no_grad():
        for _ in range(5):
            got, want = shared.step(token).numpy(), per_row.step(token).numpy()
            np.testing.assert_array_equal(got, want)
            token = paddle.argmax(paddle.to_tensor(want), axis=-1)


def rollout(model, monkeypatch, flag, **kw):
    monkeypatch.setenv(decode_engine.SHARED_PREFIX_SWITCH, flag)
    ids, mask = prompts(seed=11)
    return generate(model, ids, mask, num_samples=4, max_new_tokens=14, pad_token_id=0, **kw)


@pytest.mark.parametrize("kw", [dict(do_sample=False, eos_token_ids=[1]),
                                dict(temperature=1.0, eos_token_ids=list(range(1, 25)),  # rows end, get dropped
                                     row_keys=row_keys(5, 1, np.arange(12)))])
def test_rollouts_with_a_shared_prefix(monkeypatch, kw):
    """A rollout repeats itself bit for bit; against the per-row layout the same tokens here (a flip needs a draw
    within rounding of a boundary) and log-probs within LOGPROB_TOL; the trainer's log-probs of the completions
    (paddle's forward, not the engine) do not depend on the layout."""
    model = make_model("qwen2")
    with paddle.no_grad():
        shared, again = rollout(model, monkeypatch, "1", **kw), rollout(model, monkeypatch, "1", **kw)
        per_row = rollout(model, monkeypatch, "0", **kw)
        np.testing.assert_array_equal(again.completion_ids.numpy(), shared.completion_ids.numpy())
        np.testing.assert_array_equal(again.sample_logprobs.numpy(), shared.sample_logprobs.numpy())
        np.testing.assert_array_equal(shared.completion_ids.numpy(), per_row.completion_ids.numpy())
        diff = np.abs(shared.sample_logprobs.numpy() - per_row.sample_logprobs.numpy()).max()
        assert diff <= LOGPROB_TOL, diff
        trainer = [completion_logprobs(model, r.prompt_ids, r.prompt_mask, r.completion_ids,
                                       r.completion_mask)[0].numpy() for r in (shared, per_row)]
    np.testing.assert_array_equal(trainer[0], trainer[1])
