"""Shared by the policy tests (tests/policy/test_fast_decoder.py, tests/policy/test_recompute.py): a grouped batch; by
tests/test_padding.py and tests/test_tool_masks.py: a tiny Qwen2 with random biases; by tests/test_tool_masks.py and
tests/test_rollout_correction.py: the configuration of a loss test's batch."""
import numpy as np
import paddle


def grouped_batch(vocab: int, P: int = 3, G: int = 4, L: int = 7, T: int = 6, seed: int = 0) -> list:
    """[prompt_ids, prompt_mask, completion_ids, completion_mask] paddle tensors: G consecutive rows per prompt,
    prompts with different left padding, completions of random length (row 0 full length), ids in [3, vocab)."""
    rng = np.random.default_rng(seed)
    pm = np.ones((P, L), dtype="int64")
    pm[0, :3] = 0
    pm[-1, :1] = 0
    pid = np.where(pm == 1, rng.integers(3, vocab, size=(P, L)), 0)
    pid, pm = np.repeat(pid, G, 0), np.repeat(pm, G, 0)
    lens = rng.integers(1, T + 1, size=P * G)
    lens[0] = T
    cm = (np.arange(T)[None] < lens[:, None]).astype("int64")
    cid = np.where(cm == 1, rng.integers(3, vocab, size=(P * G, T)), 0)
    return [paddle.to_tensor(x) for x in (pid, pm, cid, cm)]


def random_bias_qwen2(vocab: int, seed: int = 0) -> paddle.nn.Layer:
    """A tiny Qwen2ForCausalLM (hidden 32, intermediate 64, 2 layers, 4 heads, 2 KV heads) seeded with `seed`, its
    biases random (std 0.1) instead of 0 so that every parameter is observable in the outputs."""
    from paddlenlp.transformers import Qwen2Config, Qwen2ForCausalLM

    paddle.seed(seed)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                         rms_norm_eps=1e-6, dtype="float32"))
    with paddle.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.set_value(paddle.randn(p.shape) * 0.1)
    return model


def loss_test_cfg(G: int, N: int, T: int, L: int, **values):
    """A Config for loss tests on a batch of N rows (N // G prompts x G samples), prompts of L tokens, completions of
    T: one mini-batch, micro-batches of 2 rows, no KL in the reward, temperature 0.9; `values` override."""
    from paddle_grpo.config import config_from_dict

    base = dict(actor_model_name_or_path="unused", use_rm_server=False, reward_funcs="kk", train_datasets="unused",
                rollout_n=G, global_batch_size=N // G, global_mini_batch_size=N // G, max_dec_len=T, min_dec_len=1,
                max_prompt_len=L, max_length=L + T, kl_coeff=0.0, temperature=0.9, per_device_train_batch_size=2,
                per_device_logprob_batch_size=2)
    return config_from_dict({**base, **values})
