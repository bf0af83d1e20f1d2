"""Blockwise attention (kernels/attention.py) against the unblocked attention of the lean Qwen2 forward.

Tolerances (tests/numerics.py): q, k, v ~N(0, 1) (q / sqrt(D)): a score sums D = 8 terms (sum|terms| ~2.3), the
softmax 9 positive terms, an output 9 terms p v (sum|terms| <= 3): f32_sum_tol(9, 3, depth=3) = 1e-5 against the
float64 reference; gradients go back through the same sums (rtol 1e-4 of values ~0.1-1, atol 1e-5). The model-level
comparison runs the tiny Qwen2 below (hidden 32, intermediate 64, 2 layers, vocab 50): MODEL_TOL, twice for gradients.
"""
import math

import numpy as np
import paddle
import pytest
from numerics import tiny_lm_tol

from paddle_grpo.kernels import attention
from paddle_grpo.kernels.attention import blockwise_attention, query_block
from paddle_grpo.policy import fast_decoder

pytestmark = pytest.mark.numerics  # compares float results: CI reruns it on other CPU kernels

B, KV, G, D = 2, 2, 3, 8
MODEL_TOL = tiny_lm_tol(64, 2, 50)  # 1.5e-4


def _reference(q, k, v, keep):
    """softmax(q k^T + mask) v with numpy float64; q [B, KV, g, Sq, d] pre-scaled, keep bool [B, Sq, Sk]."""
    s = np.einsum("bkgqd,bksd->bkgqs", q, k)
    s = np.where(keep[:, None, None], s, -1e30)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("bkgqs,bksd->bkgqd", p, v)


def _inputs(sq, sk, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(B, KV, G, sq, D)) / math.sqrt(D)
    k, v = rng.normal(size=(B, KV, sk, D)), rng.normal(size=(B, KV, sk, D))
    keep = np.tril(np.ones((sq, sk), bool), k=sk - sq)[None].repeat(B, 0)
    keep[1, :, :2] = False           # left padding of the second row
    keep[1, 0, :] = False            # a query that sees no key at all (a pad query): uniform, as F.softmax gives
    return q, k, v, keep


def _bias(keep):
    neg = float(np.finfo(np.float32).min)
    return paddle.to_tensor(np.where(keep, 0.0, neg).astype("float32")[:, None, None])


@pytest.mark.parametrize("block", [1, 3, 5, 64])
@pytest.mark.parametrize("kernels, threads", [("numpy", "1"), ("numpy", "2"), ("numpy", "5"), ("paddle", "2")])
def test_blockwise_equals_unblocked_attention_and_its_gradients(block, kernels, threads, monkeypatch):
    """Both implementations of the per-block softmax and its backward (numpy_kernels.py on CPU, paddle ops
    elsewhere), with the B x KV x g = 12 head slices split over 1, 2 or 5 threads."""
    monkeypatch.setenv("PADDLE_GRPO_NUMPY_KERNELS", "1" if kernels == "numpy" else "0")
    monkeypatch.setenv("OMP_NUM_THREADS", threads)
    q, k, v, keep = _inputs(7, 9)
    tq, tk, tv = (paddle.to_tensor(x.astype("float32"), stop_gradient=False) for x in (q, k, v))
    out = blockwise_attention(tq, tk, tv, _bias(keep), block)
    ref = _reference(q, k, v, keep)
    ref[1, :, :, 0] = v[1].mean(1)[:, None]  # the query without keys: the mean of all values
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-5, atol=1e-5)
    # Gradients against paddle's autograd through the unblocked formula (the full-shape bias of fast_decoder).
    weights = paddle.to_tensor(np.random.default_rng(1).normal(size=out.shape).astype("float32"))
    (out * weights).sum().backward()
    grads = [t.grad.numpy() for t in (tq, tk, tv)]
    rq, rk, rv = (paddle.to_tensor(x.astype("float32"), stop_gradient=False) for x in (q, k, v))
    s = paddle.matmul(rq.reshape([B, KV, G * 7, D]), rk, transpose_y=True).reshape([B, KV, G, 7, 9])
    p = paddle.nn.functional.softmax(s + _bias(keep).expand(s.shape), axis=-1)
    ref_out = paddle.matmul(p.reshape([B, KV, G * 7, 9]), rv).reshape(out.shape)
    (ref_out * weights).sum().backward()
    for got, want in zip(grads, (rq.grad.numpy(), rk.grad.numpy(), rv.grad.numpy())):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
        assert np.abs(want).max() > 1e-2


def test_query_block_sizes():
    assert query_block(8, 14, 127, 191) is None                   # 8 x 128 completion tokens: one batched product
    assert query_block(32, 8, 127, 127) is None                   # the toy shape (tools/bench/shapes/default.json)
    assert query_block(8, 14, 511, 575) == 65                     # 8 x 512: blocks of 65 queries (16 MB)
    block = query_block(8, 14, 2047, 2111)                        # 8 x 2048: 1.9 GB of scores otherwise
    assert block == attention.BLOCK_ELEMENTS // (8 * 14 * 2111) == 17
    assert query_block(1, 1, 10, 10, block_elements=40, above=1) == 4
    assert query_block(1, 1, 10, 10 ** 6, block_elements=4, above=1) == 1  # at least one query per block
    with pytest.raises(ValueError, match="block"):
        blockwise_attention(*(paddle.zeros([1, 1, 1, 2, 2]),) * 1, paddle.zeros([1, 1, 2, 2]),
                            paddle.zeros([1, 1, 2, 2]), paddle.zeros([1, 1, 1, 2, 2]), 0)


@pytest.fixture
def tiny_qwen2():
    from paddlenlp.transformers import Qwen2Config, Qwen2ForCausalLM

    paddle.seed(1)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2))
    assert fast_decoder.enabled_for(model)
    return model


def test_long_completions_take_the_blocked_path_with_the_same_numbers(tiny_qwen2, monkeypatch):
    """The lean forward's log-probs and gradients are the same whether attention is blocked or not."""
    from paddle_grpo.policy.causal import completion_logprobs

    model = tiny_qwen2
    rng = np.random.default_rng(0)
    N, L, T = 4, 5, 9
    pid = paddle.to_tensor(rng.integers(3, model.config.vocab_size, (N, L)))
    pm = paddle.to_tensor(np.array([[0, 1, 1, 1, 1]] * 2 + [[1] * 5] * 2))
    cid = paddle.to_tensor(rng.integers(3, model.config.vocab_size, (N, T)))
    cm = paddle.to_tensor((np.arange(T)[None] < np.array([[9], [4], [9], [6]])).astype("int64"))

    def run():
        model.clear_gradients()
        lp, ent = completion_logprobs(model, pid, pm, cid, cm, with_entropy=True)
        ((lp * cm.astype("float32")).sum() + ent.sum()).backward()
        return lp.numpy(), {n: p.grad.numpy().copy() for n, p in model.named_parameters() if p.grad is not None}

    calls = []
    real = attention._BlockwiseAttention.apply
    monkeypatch.setattr(attention._BlockwiseAttention, "apply",
                        staticmethod(lambda *a: calls.append(a[-1]) or real(*a)))
    lp_full, g_full = run()
    assert calls == []
    monkeypatch.setattr(attention, "BLOCK_ABOVE", 0)
    monkeypatch.setattr(attention, "BLOCK_ELEMENTS", 1)
    monkeypatch.setattr(fast_decoder, "query_block", lambda *a: attention.query_block(*a, block_elements=1, above=0))
    numpy_blocks = []  # the model's compact mask and scores take the numpy kernels (numpy_kernels.py) on CPU
    real_heads = attention._over_heads
    monkeypatch.setattr(attention, "_over_heads", lambda *a: numpy_blocks.append(1) or real_heads(*a))
    lp_blocks, g_blocks = run()
    assert calls and set(calls) == {1}
    assert len(numpy_blocks) > 3 * len(calls)  # per block: softmax; backward: probabilities and score gradient
    np.testing.assert_allclose(lp_blocks, lp_full, rtol=1e-5, atol=MODEL_TOL)
    assert set(g_blocks) == set(g_full)
    for name in g_full:
        np.testing.assert_allclose(g_blocks[name], g_full[name], rtol=1e-4, atol=2 * MODEL_TOL, err_msg=name)
