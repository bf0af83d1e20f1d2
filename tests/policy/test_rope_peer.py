"""Checkpoints written by transformers 5 itself (the `.[peer]` environment) load with transformers' logits: rope theta
inside `rope_parameters`, and each scaling type policy/rope.py computes (linear, dynamic, llama3, yarn), in
transformers 5's layout and rewritten as transformers 4 writes it (top-level rope_theta / rope_scaling).

The models have sharp attention (q/k weights of std 1, shared/PLATFORM.md "Random test models hide rope"): the test
asserts that the same weights with plain RoPE at theta 10000 give logits off by more than a tenth of their scale, so a
loader that dropped any of these settings would fail it by orders of magnitude. Skipped with the reason where the peer
environment is absent (PADDLE_GRPO_PEER_PYTHON).
"""
import json
import os
import subprocess

import numpy as np
import paddle
import pytest

from numerics import f32_sum_tol
from peer_helpers import transformers_python_or_skip
from paddle_grpo.policy import load_policy
from paddle_grpo.policy.causal import FastDecoderStepper, PaddleNLPStepper, decoder_path

LAYERS, INTER = 2, 128
IDS = [[3, 5, 7, 9, 11, 13, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28]]
MODELS = {
    "qwen2-theta": ("qwen2", {"rope_type": "default", "rope_theta": 1e6}),
    "llama-theta": ("llama", {"rope_type": "default", "rope_theta": 1e5}),
    "llama-linear": ("llama", {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e5}),
    "qwen2-linear": ("qwen2", {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e6}),
    "llama-dynamic": ("llama", {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e5}),  # plain below 64
    # original 16 positions: with head_dim 16 the frequencies fall in all of llama3's bands / yarn's ramp
    "llama-llama3": ("llama", {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                               "original_max_position_embeddings": 16, "rope_theta": 5e5}),
    "qwen2-yarn": ("qwen2", {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
                             "rope_theta": 1e4}),
}

PEER = r'''
import json, sys, torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM
spec = json.loads(sys.argv[1])
out = {}
for name, (arch, params, directory) in spec["models"].items():
    cls, cfg = (LlamaForCausalLM, LlamaConfig) if arch == "llama" else (Qwen2ForCausalLM, Qwen2Config)
    config = cfg(vocab_size=40, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5, tie_word_embeddings=True,
                 rope_parameters=params, bos_token_id=0, eos_token_id=1, pad_token_id=0)
    torch.manual_seed(0)
    model = cls(config).eval()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith(("q_proj.weight", "k_proj.weight")):
                p.normal_(0.0, 1.0)  # sharp attention
        model.save_pretrained(directory)
        out[name] = model(torch.tensor(spec["ids"])).logits.double().numpy().tolist()
print(json.dumps(out))
'''


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """{name: (directory, transformers' logits [1, 20, 40])} of MODELS, written by transformers 5."""
    python = transformers_python_or_skip()
    root = tmp_path_factory.mktemp("rope-peer")
    spec = {"ids": IDS, "models": {n: (a, p, str(root / n)) for n, (a, p) in MODELS.items()}}
    peer = subprocess.run([python, "-c", PEER, json.dumps(spec)], capture_output=True, text=True, timeout=600)
    assert peer.returncode == 0, peer.stderr[-3000:]
    theirs = json.loads(peer.stdout.strip().splitlines()[-1])
    return {n: (str(root / n), np.array(theirs[n])) for n in MODELS}


@pytest.fixture(autouse=True)
def ppnlp_cache(tmp_path, monkeypatch):
    import paddlenlp.utils.env

    monkeypatch.setattr(paddlenlp.utils.env, "MODEL_HOME", str(tmp_path / "ppnlp" / "models"))


def as_transformers4(directory, out):
    """A copy of `directory` whose config.json has transformers 4's keys: top-level rope_theta and rope_scaling."""
    os.makedirs(out)
    for name in os.listdir(directory):
        with open(os.path.join(directory, name), "rb") as f, open(os.path.join(out, name), "wb") as g:
            g.write(f.read())
    with open(os.path.join(out, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    params = dict(config.pop("rope_parameters"))
    config["rope_theta"] = params.pop("rope_theta")
    config["rope_scaling"] = None if params["rope_type"] == "default" else params
    with open(os.path.join(out, "config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f)
    return str(out)


def decoded_logits(model, stepper_class):
    """Logits of IDS [1, 20, 40] from a decode stepper: prefill of the first 5 tokens, then one token per step."""
    stepper = stepper_class(model)
    ids = paddle.to_tensor(IDS)
    with paddle.no_grad():
        rows = [stepper.start(ids[:, :5], paddle.ones([1, 5], dtype="int64"), 1, 15)]
        rows += [stepper.step(ids[:, t]) for t in range(5, 19)]
    return np.stack([r.numpy()[0] for r in rows])  # positions 4..18


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("layout", ["transformers5", "transformers4"])
def test_logits_equal_transformers(written, name, layout, tmp_path, monkeypatch):
    directory, theirs = written[name]
    if layout == "transformers4":
        directory = as_transformers4(directory, tmp_path / "v4")
    scale = np.abs(theirs).max()
    # Two float32 implementations of the same maths: per layer ~9 chained sums of at most INTER terms adding up to
    # at most the logits' scale + 1 (numerics.f32_sum_tol), doubled for the two evaluations
    tol = 2 * f32_sum_tol(INTER, scale + 1, depth=9 * LAYERS + 2)
    ids = paddle.to_tensor(IDS)
    policy = load_policy(directory, trainable=False)
    assert decoder_path(policy.model) == f"decoder: fast path ({name.split('-')[0]})"
    with paddle.no_grad():
        paddlenlp_forward = policy.model(ids, return_dict=True).logits.numpy()
    assert np.abs(paddlenlp_forward - theirs[0]).max() < tol
    assert np.abs(decoded_logits(policy.model, FastDecoderStepper) - theirs[0, 4:19]).max() < tol
    assert np.abs(decoded_logits(policy.model, PaddleNLPStepper) - theirs[0, 4:19]).max() < tol
    if layout == "transformers5":  # the same weights with plain RoPE at theta 10000: what was loaded before
        plain = as_transformers4(directory, tmp_path / "plain")
        with open(os.path.join(plain, "config.json"), encoding="utf-8") as f:
            config = json.load(f)
        config.update(rope_theta=10000.0, rope_scaling=None)
        with open(os.path.join(plain, "config.json"), "w", encoding="utf-8") as f:
            json.dump(config, f)
        with paddle.no_grad():
            wrong = load_policy(plain, trainable=False).model(ids, return_dict=True).logits.numpy()
        assert np.abs(wrong - theirs[0]).max() > 0.1 * scale
