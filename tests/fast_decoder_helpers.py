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
