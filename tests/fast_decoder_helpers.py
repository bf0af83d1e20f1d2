"""Tiny random Qwen2 / Llama models for the lean decoder's tests (test_fast_decoder.py, test_decode_engine.py)."""
import paddle
from paddlenlp.transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

V = 96


def make_model(family="qwen2", seed=0, **overrides):
    """A tiny random `family` causal LM (hidden 64, intermediate 160, 2 layers, GQA), float32."""
    kw = dict(vocab_size=V, hidden_size=64, intermediate_size=160, num_hidden_layers=2, max_position_embeddings=64,
              dtype="float32")
    if family == "qwen2":
        kw.update(num_attention_heads=8, num_key_value_heads=2, rms_norm_eps=1e-6)
    else:
        kw.update(num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5, rope_theta=100000.0)
    kw.update(overrides)
    paddle.seed(seed)
    model = (Qwen2ForCausalLM(Qwen2Config(**kw)) if family == "qwen2" else LlamaForCausalLM(LlamaConfig(**kw)))
    # PaddleNLP initialises norms to 1 and biases to 0; random ones make the q/k/v bias fusion and the norm weights
    # observable.
    with paddle.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.set_value(paddle.randn(p.shape) * 0.1)
            elif "norm" in name:
                p.set_value(1.0 + paddle.randn(p.shape) * 0.1)
    return model


def prefix_attention_inputs(P: int, G: int, L: int, T: int, pads: tuple, rows=None, idle: bool = True,
                            cache_views: bool = False):
    """Random inputs of kernels/prefix_attention.py for P prompts of L slots (left padding `pads` per prompt, each
    keeping at least one token) with G rows each and T own slots per row: (q [N, KV, g, d] scaled, (kp, vp)
    [P, KV, L, d], (ks, vs) [N, KV, T, d] (strided views of a longer cache with `cache_views`, as the engine passes),
    mask [N, L + T] additive, groups), N = P * G rows, or the `rows` kept of them (groups padded where uneven);
    `idle`: row 0's newest slot hidden (a row idling in a multi-turn step)."""
    import numpy as np
    from paddle_grpo.kernels.prefix_attention import PromptGroups

    neg = np.float32(np.finfo(np.float32).min)
    rng = np.random.default_rng(P * 100 + L * 10 + T)
    KV, g, d = 2, 3, 16
    kp, vp = (rng.standard_normal((P, KV, L, d), dtype=np.float32) for _ in range(2))
    N = P * G
    extra = 3 if cache_views else 0
    ks, vs = (rng.standard_normal((N, KV, T + extra, d), dtype=np.float32)[:, :, :T] for _ in range(2))
    q = rng.standard_normal((N, KV, g, d), dtype=np.float32) * np.float32(d ** -0.5)
    mask = np.zeros((N, L + T), np.float32)
    for p, pad in enumerate(pads):
        mask[p * G:(p + 1) * G, :min(pad, L - 1)] = neg
    if idle:
        mask[0, L + T - 1:] = neg
    groups = PromptGroups.of(np.repeat(np.arange(P), G))
    if rows is not None:
        rows = np.asarray(rows)
        groups, used = groups.keep(rows)
        kp, vp = kp[used], vp[used]
        ks, vs, q, mask = ks[rows], vs[rows], q[rows], mask[rows]
    return q, (kp, vp), (ks, vs), mask, groups


def per_row_attention(q, k, v, mask):
    """The per-row layout's attention as the engine computed it before kernels/decode_attention.py (q K^T at every
    size): q [N, KV, g, d], k and v [N, KV, S, d], mask [N, S] -> [N, KV, g, d]."""
    import numpy as np
    from paddle_grpo.kernels.prefix_attention import softmax_

    scores = np.matmul(q, k.transpose(0, 1, 3, 2))
    scores += mask[:, None, None, :]
    return np.matmul(softmax_(scores), v)


def attention_tol(q, k, v, S):
    """Bound on two float32 evaluations of attention over S slots in other summation orders (other GEMM calls, p.v
    in parts): each score is a sum of d products, off by at most delta = f32_sum_tol(d, max_s sum_j |q_j k_sj|);
    scores off by delta move each p_s by at most ~2 delta p_s, so sum_s |dp_s| |v_s| <= 2 delta max|v|; p.v, a sum of
    S terms of total magnitude <= max|v| (sum p = 1), adds f32_sum_tol(S, max|v|)."""
    import numpy as np
    from numerics import f32_sum_tol

    delta = f32_sum_tol(q.shape[-1], float(np.einsum("nkgd,nksd->nkgs", np.abs(q), np.abs(k)).max()))
    vmax = float(np.abs(v).max())
    return 2 * delta * vmax + f32_sum_tol(S, vmax)
