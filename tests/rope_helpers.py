"""Checkpoints whose logits depend on positions (sharp attention) and config.json in transformers 4's or 5's
layout, made with PaddleNLP alone (tests/policy/test_rope.py, test_tokenizer.py)."""
import json
import os

import numpy as np
import paddle


def sharp_llama(directory, seed=0, **config):
    """A random PaddleNLP LlamaForCausalLM (hidden 64, 2 layers, 4 / 2 heads) with q/k weights of std 1, saved to
    `directory` (PaddleNLP writes transformers 4's top-level rope_theta)."""
    from paddlenlp.transformers import LlamaConfig, LlamaForCausalLM

    base = dict(vocab_size=40, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5, bos_token_id=0,
                eos_token_id=1, pad_token_id=0, dtype="float32")
    base.update(config)
    paddle.seed(seed)
    model = LlamaForCausalLM(LlamaConfig(**base))
    rng = np.random.default_rng(seed)
    with paddle.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                p.set_value(paddle.to_tensor(rng.standard_normal(p.shape).astype("float32")))
    model.save_pretrained(str(directory))
    return str(directory)


def edit_config(directory, change):
    path = os.path.join(directory, "config.json")
    with open(path, encoding="utf-8") as f:
        config = json.load(f)
    change(config)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(config, f)


def transformers5_layout(config, params):
    """config.json as transformers 5 writes it: rope_theta and any scaling inside rope_parameters only."""
    config.pop("rope_theta", None)
    config.pop("rope_scaling", None)
    config["rope_parameters"] = params
