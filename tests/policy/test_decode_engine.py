"""The numpy decode engine (paddle_grpo/policy/decode_engine.py) against FastDecoder.decode, the paddle-op path it
replaces on CPU, and through `generate` against the same rollout with the engine switched off.

Tolerances (tests/numerics.py): the engine sums in other orders (other GEMM kernels, numpy reductions), so logits agree
within LOGIT_TOL: f32_sum_tol of the longest sum (intermediate 160) over the decoder's chained sums (9 per layer and
2 for the final norm and head; magnitudes ~1 at random initialisation), the bound tiny_lm_tol uses without its
log-softmax term. Greedy and key-sampled tokens must be identical (a flip needs a rounding-sized tie, whose chance
over this test's few hundred draws from 96 tokens is ~1e-4). Reduced precision: each bf16 rounding of a product's
inputs is off by at most 2^-9 relative, so a product of rounded inputs by 2 * 2^-9 of sum|x w| (magnitude ~1 here),
and the logits, through BF16_DEPTH chained products, within BF16_DEPTH * 2^-8 to first order.
"""
import numpy as np
import paddle
import pytest
from fast_decoder_helpers import V, make_model
from numerics import f32_sum_tol

from paddle_grpo.kernels import gemm
from paddle_grpo.policy import decode_engine, fast_decoder
from paddle_grpo.policy.causal import FastDecoderStepper, generate
from paddle_grpo.rollout.sampling import row_keys

pytestmark = pytest.mark.numerics

LAYERS = 2
LOGIT_TOL = f32_sum_tol(160, 1.0, depth=9 * LAYERS + 2)
BF16_DEPTH = 5 * LAYERS + 1  # q/k/v, o, gate and up (one depth), down per layer; the head
FAMILIES = [("qwen2", True), ("qwen2", False), ("llama", True)]


def prompts(P=3, L=7, seed=3):
    """[P, L] left-padded prompt ids and mask (numpy), rows with 0, 2 and 3 pads."""
    rng = np.random.default_rng(seed)
    mask = np.ones((P, L), dtype=np.int64)
    mask[1 % P, :2] = 0
    mask[-1, :3] = 0
    return np.where(mask == 1, rng.integers(3, V, size=(P, L)), 0), mask


def started(model, G=2, T=10, seed=3):
    """FastDecoder after start_decoding, a DecodeEngine (on another FastDecoder of the model) after prefill, of the
    same prompts, and both first logits (numpy)."""
    ids, mask = prompts(seed=seed)
    ref = fast_decoder.FastDecoder(model)
    with paddle.no_grad():
        want = ref.start_decoding(paddle.to_tensor(ids), paddle.to_tensor(mask), G, T).numpy()
        engine = decode_engine.DecodeEngine(fast_decoder.FastDecoder(model))
    return ref, engine, want, engine.prefill(ids, mask, G, T)


@pytest.mark.parametrize("family,tied", FAMILIES)
def test_engine_steps_equal_fast_decoder_steps(family, tied):
    """Prefill, then ten greedy steps with rows idling on some of them (the multi-turn `keep`): the engine's logits
    against FastDecoder's on the same tokens, its cache against FastDecoder's."""
    model = make_model(family, tie_word_embeddings=tied)
    ref, engine, want, got = started(model)
    assert np.abs(got - want).max() <= LOGIT_TOL, np.abs(got - want).max()
    with paddle.no_grad():
        token = paddle.argmax(paddle.to_tensor(want), axis=-1)
        N = token.shape[0]
        for t in range(10):
            keep = None if t < 3 else paddle.to_tensor((np.arange(N) + t) % 3 != 0)
            want = ref.decode(token, keep).numpy()
            got = engine.step(token, keep).numpy()
            assert np.abs(got - want).max() <= LOGIT_TOL, (t, np.abs(got - want).max(), LOGIT_TOL)
            assert (got.argmax(-1) == want.argmax(-1)).all(), t
            token = paddle.argmax(paddle.to_tensor(want), axis=-1)
    np.testing.assert_array_equal(engine.pos, ref.next_pos.numpy())
    np.testing.assert_array_equal(engine.write, ref.write.numpy())
    # the same keys and values in the same slots (the unfilled ones zero on both sides)
    for (kr, vr), (ke, ve) in zip(ref.cache, engine.row_caches()):
        assert np.abs(ke - kr.numpy()).max() <= LOGIT_TOL
        assert np.abs(ve - vr.numpy()).max() <= LOGIT_TOL


def test_prefill_in_chunks_equals_prefill_at_once(monkeypatch):
    """Prompts split into chunks of PREFILL_TOKENS tokens: the logits and cache of one chunk, within rounding (the
    products' row counts differ, which may change a GEMM's summation order)."""
    model = make_model("qwen2")
    ids, mask = prompts(P=3, L=7, seed=4)
    with paddle.no_grad():
        whole = decode_engine.DecodeEngine(fast_decoder.FastDecoder(model))
        first = whole.prefill(ids, mask, 2, 5)
        monkeypatch.setattr(decode_engine, "PREFILL_TOKENS", 7)  # one prompt a chunk
        split = decode_engine.DecodeEngine(fast_decoder.FastDecoder(model))
        again = split.prefill(ids, mask, 2, 5)
    assert np.abs(again - first).max() <= LOGIT_TOL
    for (ka, va), (kb, vb) in zip(whole.row_caches(), split.row_caches()):
        assert np.abs(ka - kb).max() <= LOGIT_TOL and np.abs(va - vb).max() <= LOGIT_TOL
        assert (ka[:, :, 7:] == 0).all()  # the slots the samples will fill


def rollouts(model, monkeypatch, engine_on, **kw):
    monkeypatch.setenv(decode_engine.ENV_SWITCH, "1" if engine_on else "0")
    built = []
    original = decode_engine.DecodeEngine.__init__

    def counting(self, *args, **kwargs):
        built.append(1)
        original(self, *args, **kwargs)

    monkeypatch.setattr(decode_engine.DecodeEngine, "__init__", counting)
    ids, mask = prompts(seed=5)
    out = generate(model, ids, mask, num_samples=3, max_new_tokens=12, eos_token_ids=[1], pad_token_id=0, **kw)
    monkeypatch.setattr(decode_engine.DecodeEngine, "__init__", original)
    assert bool(built) == engine_on
    return out


@pytest.mark.parametrize("kw", [dict(do_sample=False), dict(temperature=0.8, row_keys=row_keys(7, 1, np.arange(9))),
                                dict(temperature=1.0, top_k=20, top_p=0.9, repetition_penalty=1.2, min_new_tokens=2,
                                     row_keys=row_keys(7, 2, np.arange(9)))])
def test_generate_with_the_engine_equals_generate_without(monkeypatch, kw):
    model = make_model("qwen2")
    on = rollouts(model, monkeypatch, True, **kw)
    off = rollouts(model, monkeypatch, False, **kw)
    np.testing.assert_array_equal(on.completion_ids.numpy(), off.completion_ids.numpy())
    np.testing.assert_array_equal(on.lengths, off.lengths)
    # log-probs: the logits' difference, plus the log-softmax's sum over V terms (2 V u)
    lp_tol = LOGIT_TOL * 2 + 2 * V * 2.0 ** -24
    assert np.abs(on.sample_logprobs.numpy() - off.sample_logprobs.numpy()).max() <= lp_tol
    again = rollouts(model, monkeypatch, True, **kw)  # one process, one backend: bit for bit
    np.testing.assert_array_equal(again.sample_logprobs.numpy(), on.sample_logprobs.numpy())
    np.testing.assert_array_equal(again.completion_ids.numpy(), on.completion_ids.numpy())


def test_the_engine_runs_only_without_gradients_and_when_switched_on(monkeypatch):
    model = make_model("llama")
    fast = fast_decoder.FastDecoder(model)
    monkeypatch.setenv(decode_engine.ENV_SWITCH, "0")
    assert decode_engine.refusal(fast) == f"{decode_engine.ENV_SWITCH}=0"
    monkeypatch.setenv(decode_engine.ENV_SWITCH, "1")
    assert "gradients" in decode_engine.refusal(fast)  # grads are on outside no_grad
    with paddle.no_grad():
        assert decode_engine.refusal(fast) is None
    assert "GEMM:" in decode_engine.describe()
    with pytest.raises(ValueError, match=", ".join(decode_engine.PRECISIONS)):
        decode_engine.DecodeEngine(fast, "float16")
    # a reduced precision with the engine refused is an error, not a silent float32 rollout
    monkeypatch.setenv(decode_engine.ENV_SWITCH, "0")
    ids, mask = prompts(P=1, L=5, seed=1)
    stepper = FastDecoderStepper(model, precision="bfloat16")
    with paddle.no_grad(), pytest.raises(ValueError, match="bfloat16 rollout needs the CPU decode engine"):
        stepper.start(paddle.to_tensor(ids), paddle.to_tensor(mask), 2, 4)


@pytest.mark.parametrize("precision", [p for p in decode_engine.PRECISIONS if p != "float32"])
def test_reduced_precision_logits_stay_near_float32(precision):
    try:
        gemm.best_backend(precision)
    except ValueError as e:
        pytest.skip(f"no {precision} GEMM on this CPU: {e}")
    model = make_model("qwen2")
    ids, mask = prompts(seed=3)
    with paddle.no_grad():
        f32 = decode_engine.DecodeEngine(fast_decoder.FastDecoder(model))
        low = decode_engine.DecodeEngine(fast_decoder.FastDecoder(model), precision)
        want, got = f32.prefill(ids, mask, 2, 10), low.prefill(ids, mask, 2, 10)
        token = paddle.argmax(paddle.to_tensor(want), axis=-1)
        for t in range(6):
            assert np.abs(got - want).max() <= BF16_DEPTH * 2.0 ** -8, (t, np.abs(got - want).max())
            assert np.abs(got - want).max() > 0  # it did multiply in reduced precision
            want, got = f32.step(token).numpy(), low.step(token).numpy()
            token = paddle.argmax(paddle.to_tensor(want), axis=-1)


def test_finished_rows_are_dropped_without_changing_the_rollout(monkeypatch):
    """With 29 of 96 tokens ending a row, rows finish at different steps: the single-turn loop goes on without them
    (DecodeEngine.keep_rows, each time a quarter of the held rows has finished), and the rollout is the one without
    dropping: the same tokens, lengths and truncation, log-probs within rounding (other row counts M)."""
    model = make_model("llama")
    kept = []
    original = decode_engine.DecodeEngine.keep_rows

    def recording(self, rows):
        kept.append((self.N, len(rows)))
        original(self, rows)

    monkeypatch.setattr(decode_engine.DecodeEngine, "keep_rows", recording)
    ids, mask = prompts(seed=9)
    kw = dict(num_samples=4, max_new_tokens=16, eos_token_ids=list(range(1, 30)), pad_token_id=0, temperature=1.0,
              row_keys=row_keys(2, 3, np.arange(12)))
    with_drops = generate(model, ids, mask, **kw)
    assert kept and all(after <= 0.75 * before for before, after in kept), kept
    monkeypatch.setattr(decode_engine.DecodeEngine, "keep_rows", original)
    monkeypatch.setenv(decode_engine.ENV_SWITCH, "0")
    without = generate(model, ids, mask, **kw)
    assert len(set(with_drops.lengths.tolist())) > 3  # rows did end at different steps
    np.testing.assert_array_equal(with_drops.completion_ids.numpy(), without.completion_ids.numpy())
    np.testing.assert_array_equal(with_drops.lengths, without.lengths)
    np.testing.assert_array_equal(with_drops.truncated, without.truncated)
    lp_tol = LOGIT_TOL * 2 + 2 * V * 2.0 ** -24
    assert np.abs(with_drops.sample_logprobs.numpy() - without.sample_logprobs.numpy()).max() <= lp_tol
    assert (with_drops.sample_logprobs.numpy()[with_drops.completion_mask.numpy() == 0] == 0).all()
