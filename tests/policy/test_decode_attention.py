"""kernels/decode_attention.py: the per-row layout's attention in both score orientations, and a decode step's
attention split over threads.

- `row_attention` against the q K^T code it replaces (fast_decoder_helpers.per_row_attention) and against float64,
  within `attention_tol` (the two orientations are other BLAS kernels: the same sums, perhaps in another order on
  some CPU), on both sides of SMALL_PRODUCT; and the engine's per-row steps past SMALL_PRODUCT against the same steps
  with the old attention, within the logits' bound of tests/policy/test_decode_engine.py.
- `decode_attention` split over 2 and 3 threads against 1 thread, bit for bit: each part runs the same products per
  row or prompt, so any difference is a mis-sliced part (a wrong row range, a prefix of another prompt, a part's
  groups at another width). SPLIT_FROM is set to 0 so that these small shapes split; only numpy_kernels' split
  follows OMP_NUM_THREADS here (paddle's GEMM threads are fixed at start-up), so whole rollouts must repeat to the
  bit too.
"""
import numpy as np
import paddle
import pytest
from fast_decoder_helpers import attention_tol, make_model, per_row_attention, prefix_attention_inputs
from numerics import f32_sum_tol

from paddle_grpo.kernels import decode_attention as kernel
from paddle_grpo.kernels import numpy_kernels, onednn
from paddle_grpo.kernels.decode_attention import decode_attention, row_attention, slots_read
from paddle_grpo.kernels.prefix_attention import SMALL_PRODUCT, PromptGroups, shared_prefix_attention
from paddle_grpo.policy import decode_engine, fast_decoder
from paddle_grpo.policy.causal import generate
from paddle_grpo.rollout.sampling import row_keys

pytestmark = pytest.mark.numerics


def row_inputs(N, S, seed=0, g=3, KV=2, d=16):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((N, KV, g, d), dtype=np.float32) * np.float32(d ** -0.5)
    k, v = (rng.standard_normal((N, KV, S, d), dtype=np.float32) for _ in range(2))
    mask = np.zeros((N, S), np.float32)
    mask[0, :S // 2] = np.finfo(np.float32).min   # a left-padded row
    mask[-1, -1] = np.finfo(np.float32).min      # a row idling at this step
    return q, k, v, mask


@pytest.mark.parametrize("S", [7, 400, 401, 700])  # g * S = 1,200 is the last q K^T
def test_row_attention_in_either_orientation(S):
    q, k, v, mask = row_inputs(5, S)
    assert (3 * S > SMALL_PRODUCT) == (S > 400)
    got = row_attention(q, k, v, mask)
    tol = attention_tol(q, k, v, S)
    assert np.abs(got - per_row_attention(q, k, v, mask)).max() <= tol
    exact = per_row_attention(*(x.astype(np.float64) for x in (q, k, v, mask)))
    assert np.abs(got - exact).max() <= tol
    assert np.abs(got[0] - per_row_attention(q[:1, :, :, :], k[:1, :, S // 2:], v[:1, :, S // 2:],
                                             mask[:1, S // 2:])[0]).max() <= tol   # the padding is hidden
    np.testing.assert_array_equal(row_attention(q, k, v, mask), got)


def test_engine_per_row_steps_past_small_product(monkeypatch):
    """One sample per prompt, a context of 310 + 60 slots (g * S = 4 x 311 > SMALL_PRODUCT from the first step):
    the engine's logits with row_attention against the same engine with the old q K^T attention, step by step.
    Bound: two float32 evaluations of the model (test_decode_engine.py's LOGIT_TOL: 9 chained sums a layer and the
    final 2, of at most 370 terms (the attention's S) of magnitude ~1)."""
    model = make_model("qwen2", max_position_embeddings=1024)
    g = model.config.num_attention_heads // model.config.num_key_value_heads
    rng = np.random.default_rng(0)
    ids, mask = rng.integers(3, 96, size=(3, 310)), np.ones((3, 310), dtype=np.int64)
    mask[1, :40] = 0
    tol = f32_sum_tol(370, 1.0, depth=9 * 2 + 2)
    with paddle.no_grad():
        engines = [decode_engine.DecodeEngine(fast_decoder.FastDecoder(model)) for _ in range(2)]
        first = [e.prefill(ids, mask, 1, 60) for e in engines]
        assert g * (310 + 1) > SMALL_PRODUCT
        np.testing.assert_array_equal(first[0], first[1])
        for t in range(6):
            token = rng.integers(3, 96, size=3)
            got = engines[0].step_numpy(token)
            with monkeypatch.context() as m:
                m.setattr(kernel, "row_attention", per_row_attention)
                want = engines[1].step_numpy(token)
            assert np.isfinite(got).all()
            assert np.abs(got - want).max() <= tol, (t, np.abs(got - want).max(), tol)


def split_over(monkeypatch, n_threads, fn, split_from=0):
    monkeypatch.setenv("OMP_NUM_THREADS", str(n_threads))
    monkeypatch.setattr(kernel, "SPLIT_FROM", split_from)
    assert numpy_kernels.threads() == n_threads
    return fn()


@pytest.mark.parametrize("N,S", [(7, 30), (5, 401)])
def test_per_row_layout_split_over_threads_is_bit_identical(monkeypatch, N, S):
    q, k, v, mask = row_inputs(N, S, seed=N)
    run = lambda: decode_attention(q, (k, v), mask)  # noqa: E731
    one = split_over(monkeypatch, 1, run)
    np.testing.assert_array_equal(one, row_attention(q, k, v, mask))
    for n in (2, 3):
        np.testing.assert_array_equal(split_over(monkeypatch, n, run), one)


@pytest.mark.parametrize("P,G,L,T,pads,rows", [
    (3, 4, 7, 12, (0, 2, 6), None),                          # every group full: parts of whole prompts
    (3, 4, 7, 12, (0, 2, 6), [0, 1, 2, 5, 8, 9, 10, 11]),   # groups of 3, 1, 4: padded parts and a full one
    (2, 4, 120, 401, (0, 30), [0, 1, 2, 3, 5]),             # scores as K q^T (past SMALL_PRODUCT), padded
    (4, 1, 6, 5, (0, 1, 2, 5), None),                       # one sample per prompt
])
def test_shared_prefix_split_over_threads_is_bit_identical(monkeypatch, P, G, L, T, pads, rows):
    q, prefix, suffix, mask, groups = prefix_attention_inputs(P, G, L, T, pads, rows, idle=True, cache_views=True)
    run = lambda: decode_attention(q, suffix, mask, prefix, groups)  # noqa: E731
    one = split_over(monkeypatch, 1, run)
    np.testing.assert_array_equal(one, shared_prefix_attention(q, prefix, suffix, mask, groups))
    for n in (2, 3):
        np.testing.assert_array_equal(split_over(monkeypatch, n, run), one)
    # against the per-row layout of the same rows: the split is still attention (attention_tol as there)
    k = np.concatenate([prefix[0][groups.prompt], suffix[0]], axis=2)
    v = np.concatenate([prefix[1][groups.prompt], suffix[1]], axis=2)
    assert np.abs(one - per_row_attention(q, k, v, mask)).max() <= attention_tol(q, k, v, L + T)


def test_the_split_starts_at_split_from(monkeypatch):
    """Below SPLIT_FROM slots read a layer the caller's thread does all the work; from it the threads share it."""
    q, prefix, suffix, mask, groups = prefix_attention_inputs(3, 4, 7, 12, (0, 2, 6), None, idle=True,
                                                              cache_views=True)
    read = slots_read(suffix, prefix)
    assert read == 12 * 2 * 12 + 3 * 2 * 7 == int(np.prod(suffix[0].shape[:3])) + int(np.prod(prefix[0].shape[:3]))
    calls = []
    real = numpy_kernels.parallel_ranges
    monkeypatch.setattr(kernel, "parallel_ranges", lambda n, work: (calls.append(n), real(n, work)))
    for split_from, split in ((read + 1, False), (read, True)):
        calls.clear()
        split_over(monkeypatch, 2, lambda: decode_attention(q, suffix, mask, prefix, groups), split_from)
        assert calls == ([3] if split else [])  # the 3 prompts shared out
    calls.clear()
    split_over(monkeypatch, 1, lambda: decode_attention(q, suffix, mask, prefix, groups), 0)
    assert calls == []  # one thread: nothing to share


def test_prompt_groups_part():
    groups, _ = PromptGroups.of(np.repeat(np.arange(3), 4)).keep(np.array([0, 1, 2, 5, 8, 9, 10, 11]))
    assert groups.part(0, 3)[2] is groups
    r0, r1, first = groups.part(0, 2)           # groups of 3 and 1 at width 4: padded
    assert (r0, r1, first.prompts, first.width) == (0, 4, 2, 4)
    np.testing.assert_array_equal(first.flat, [0, 1, 2, 4])
    r0, r1, last = groups.part(2, 3)            # the full group of 4: no padding
    assert (r0, r1, last.prompts, last.width, last.flat) == (8 - 4, 8, 1, 4, None)
    np.testing.assert_array_equal(last.prompt, [0, 0, 0, 0])


@pytest.mark.parametrize("samples", [1, 4])
def test_rollouts_split_over_threads_repeat_bit_for_bit(monkeypatch, samples):
    """`generate` with keyed sampling and finished rows dropped (EOS among the tokens): the per-row layout
    (1 sample per prompt) and the shared prefix (4), the attention and the sampling's exp split over 2 threads."""
    model = make_model("qwen2", seed=3)
    rng = np.random.default_rng(1)
    ids = rng.integers(3, 96, size=(3, 9))
    mask = np.ones_like(ids)
    mask[1, :4] = 0
    ids[1, :4] = 0
    kw = dict(num_samples=samples, max_new_tokens=20, min_new_tokens=2, eos_token_ids=[1, 2, 5], pad_token_id=0,
              temperature=1.0, row_keys=row_keys(7, 1, np.arange(3 * samples)))
    outs = [split_over(monkeypatch, n, lambda: generate(model, ids, mask, **kw)) for n in (1, 2)]
    lengths = outs[0].lengths
    assert lengths.min() < lengths.max()   # rows finished at different steps: the drops ran
    np.testing.assert_array_equal(outs[0].lengths, outs[1].lengths)
    for key in ("completion_ids", "sample_logprobs"):
        np.testing.assert_array_equal(getattr(outs[0], key).numpy(), getattr(outs[1], key).numpy())


def test_workers_sleep_between_products_within_the_block_only():
    """The OpenMP blocktime of this thread is 0 inside the block and what it was after it, also after an error."""
    if not onednn.available()[0]:
        pytest.skip(f"oneDNN does not load here: {onednn.available()[1]}")
    omp = onednn._omp
    original = omp.kmp_get_blocktime()
    omp.kmp_set_blocktime(37)  # a value of this test's, whatever KMP_BLOCKTIME the process started with
    try:
        with onednn.workers_sleep_between_products() as previous:
            assert previous == 37 and omp.kmp_get_blocktime() == 0
        assert omp.kmp_get_blocktime() == 37
        with pytest.raises(KeyError):
            with onednn.workers_sleep_between_products():
                raise KeyError("inside")
        assert omp.kmp_get_blocktime() == 37
    finally:
        omp.kmp_set_blocktime(original)


@pytest.mark.parametrize("split_from,sleeps", [(0, True), (10 ** 9, False)])
def test_the_engine_puts_workers_to_sleep_only_for_steps_that_split(monkeypatch, split_from, sleeps):
    """Steps whose attention splits run under workers_sleep_between_products (and only those: a 32 x 128 rollout
    at two threads was slower with it), with the same logits either way."""
    entered = []
    real = onednn.workers_sleep_between_products
    monkeypatch.setattr(onednn, "workers_sleep_between_products", lambda: (entered.append(1), real())[1])
    model = make_model("qwen2")
    rng = np.random.default_rng(2)
    ids, mask = rng.integers(3, 96, size=(2, 6)), np.ones((2, 6), dtype=np.int64)
    tokens = rng.integers(3, 96, size=(3, 6))
    with paddle.no_grad():
        logits = {}
        for n, limit in ((1, 0), (2, split_from)):
            engine = decode_engine.DecodeEngine(fast_decoder.FastDecoder(model))
            engine.prefill(ids, mask, 3, 4)
            logits[n] = split_over(monkeypatch, n, lambda: [engine.step_numpy(t) for t in tokens], limit)
    assert len(entered) == (3 if sleeps else 0)  # one thread never splits
    for a, b in zip(logits[1], logits[2]):
        np.testing.assert_array_equal(a, b)
