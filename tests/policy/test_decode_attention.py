"""kernels/decode_attention.py: the per-row layout's attention in both score orientations.

`row_attention` against the q K^T code it replaces (fast_decoder_helpers.per_row_attention) and against float64,
within `attention_tol` (the two orientations are other BLAS kernels: the same sums, perhaps in another order on some
CPU), on both sides of SMALL_PRODUCT; and the engine's per-row steps past SMALL_PRODUCT against the same steps with
the old attention, within the logits' bound of tests/policy/test_decode_engine.py.
"""
import numpy as np
import paddle
import pytest
from fast_decoder_helpers import attention_tol, make_model, per_row_attention
from numerics import f32_sum_tol

from paddle_grpo.kernels.decode_attention import row_attention
from paddle_grpo.kernels.prefix_attention import SMALL_PRODUCT
from paddle_grpo.policy import decode_engine, fast_decoder

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
                m.setattr(decode_engine, "row_attention", per_row_attention)
                want = engines[1].step_numpy(token)
            assert np.isfinite(got).all()
            assert np.abs(got - want).max() <= tol, (t, np.abs(got - want).max(), tol)
