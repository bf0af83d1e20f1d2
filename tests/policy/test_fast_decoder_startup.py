"""The trainer's start-up line about the decoder path (fast_decoder.describe): a tiny Llama policy says
"decoder: fast path (llama)" and trains a step on it; with LoRA the line says that sampling runs the fast path with
the adapters merged and the log-probs PaddleNLP's forward, and each rollout samples with the adapters of its step."""
import json
import logging
import math
import shutil

import pytest

from paddle_grpo.config import config_from_dict

REWARD = '''
def reward(prompts, completions, **kwargs):
    return [float(len(c)) for c in completions]
'''


def _llama_policy(tmp_path, tiny_policy_dir):
    """The tiny policy's tokenizer with a random LlamaForCausalLM (GQA, tied embeddings, rope_theta 100,000)."""
    import paddle
    from paddlenlp.transformers import LlamaConfig, LlamaForCausalLM

    out = tmp_path / "llama"
    shutil.copytree(tiny_policy_dir, out)  # the tokenizer files; the Qwen2's config and weights are replaced
    base = json.loads((out / "config.json").read_text())
    for name in ("config.json", "model_state.pdparams", "model.safetensors"):
        if (out / name).exists():
            (out / name).unlink()
    config = LlamaConfig(vocab_size=base["vocab_size"], hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         rope_theta=100000.0, rms_norm_eps=1e-5, tie_word_embeddings=True,
                         eos_token_id=base["eos_token_id"], pad_token_id=base["pad_token_id"],
                         bos_token_id=base["pad_token_id"], dtype="float32")
    paddle.seed(0)
    LlamaForCausalLM(config).save_pretrained(str(out))
    return str(out)


@pytest.mark.parametrize("lora", [False, True])
def test_the_start_up_line_names_the_decoder_path(tmp_path, tiny_policy_dir, caplog, lora):
    from paddle_grpo.trainer import Trainer

    model = _llama_policy(tmp_path, tiny_policy_dir)
    (tmp_path / "rewards.py").write_text(REWARD)
    (tmp_path / "train.jsonl").write_text("".join(json.dumps({"src": f"Who is {n}?", "tgt": ""}) + "\n"
                                                  for n in ("Ann", "Bob")))
    cfg = config_from_dict(dict(
        actor_model_name_or_path=model, use_rm_server=False, reward_funcs=f"{tmp_path / 'rewards.py'}:reward",
        train_datasets=str(tmp_path / "train.jsonl"), output_dir=str(tmp_path / "out"),
        logging_dir=str(tmp_path / "vdl"), max_prompt_len=16, max_dec_len=4, min_dec_len=1, max_length=20,
        global_batch_size=2, rollout_n=2, per_device_train_batch_size=4, per_device_logprob_batch_size=4,
        max_steps=1, save_strategy="no", disable_tqdm=True, kl_loss_coeff=0.05, chat_template="none", lora=lora,
        lora_rank=2))
    with caplog.at_level(logging.INFO, logger="paddle_grpo.trainer"):
        trainer = Trainer(cfg)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("decoder:")]
    expected = ("decoder: sampling on the fast path (llama) with the LoRA adapters merged (W + scaling * A @ B, once "
                "per rollout); log-probs and updates on PaddleNLP's forward (its LoRA layers)"
                if lora else "decoder: fast path (llama)")
    assert lines == [expected]
    metrics = trainer.train_step()
    assert math.isfinite(metrics["train/policy_loss"]) and math.isfinite(metrics["train/kl_loss"])


def test_each_lora_rollout_samples_with_the_adapters_of_its_step(tmp_path, tiny_policy_dir, monkeypatch):
    """Two steps of a LoRA trainer: every rollout's lean decoder holds W + scaling * A @ B of the adapters as they
    are when it is built (against numpy in float64: each entry one r-term sum and an add, within 2 * (r + 1) * u of
    its magnitude), so the second rollout samples with the adapters the first update moved (B starts at 0: the first
    rollout's weights are W itself), not with stale merged weights; no lean forward without merged weights is built
    (the log-probs and the update run PaddleNLP's LoRA forward)."""
    import numpy as np

    from paddle_grpo.policy import fast_decoder
    from paddle_grpo.policy.lora import lora_layers
    from paddle_grpo.trainer import Trainer

    model = _llama_policy(tmp_path, tiny_policy_dir)
    (tmp_path / "rewards.py").write_text(REWARD)
    (tmp_path / "train.jsonl").write_text("".join(json.dumps({"src": f"Who is {n}?", "tgt": ""}) + "\n"
                                                  for n in ("Ann", "Bob")))
    rank, alpha = 2, 4.0
    cfg = config_from_dict(dict(
        actor_model_name_or_path=model, use_rm_server=False, reward_funcs=f"{tmp_path / 'rewards.py'}:reward",
        train_datasets=str(tmp_path / "train.jsonl"), output_dir=str(tmp_path / "out"),
        logging_dir=str(tmp_path / "vdl"), max_prompt_len=16, max_dec_len=4, min_dec_len=1, max_length=20,
        global_batch_size=2, rollout_n=2, per_device_train_batch_size=4, per_device_logprob_batch_size=4,
        max_steps=2, save_strategy="no", disable_tqdm=True, chat_template="none", lora=True, lora_rank=rank,
        lora_alpha=alpha, learning_rate=0.05))
    trainer = Trainer(cfg)
    seen, plain = [], []
    original_build, original_init = fast_decoder.sampling_decoder, fast_decoder.FastDecoder.__init__

    def build(m):
        fast = original_build(m)
        o_proj = lora_layers(m)["llama.layers.1.self_attn.o_proj"]
        W, A, B = (t.numpy().astype(np.float64) for t in (o_proj.weight, o_proj.lora_A, o_proj.lora_B))
        scaling = alpha / rank
        tol = 2 * (rank + 1) * 2.0 ** -24 * (np.abs(W) + (np.abs(A) @ np.abs(B)) * scaling)
        got = fast.layers[1]["wo"].numpy()
        assert (np.abs(got - (W + (A @ B) * scaling)) <= tol).all()
        seen.append(got.copy())
        return fast

    def init(self, m, weight=None):
        plain.append(weight is None)
        original_init(self, m, weight)

    monkeypatch.setattr(fast_decoder, "sampling_decoder", build)
    monkeypatch.setattr(fast_decoder.FastDecoder, "__init__", init)
    base_weight = lora_layers(trainer.policy.model)["llama.layers.1.self_attn.o_proj"].weight.numpy().copy()
    for _ in range(2):
        trainer.train_step()
    assert len(seen) >= 2 and not any(plain), (len(seen), plain)
    assert np.array_equal(seen[0], base_weight)  # B = 0 at the first rollout
    assert np.abs(seen[-1] - seen[0]).max() > 1e-3  # the first update moved the adapters: the last rollout saw it


def test_the_critics_start_up_line_names_its_decoder_path(tmp_path, tiny_policy_dir, caplog, monkeypatch):
    from paddle_grpo.policy import load_critic

    model = _llama_policy(tmp_path, tiny_policy_dir)
    with caplog.at_level(logging.INFO, logger="paddle_grpo.policy"):
        load_critic(model)
        monkeypatch.setenv("PADDLE_GRPO_FAST", "0")
        load_critic(model)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("critic:")]
    assert len(lines) == 2 and all("is a causal LM (LlamaForCausalLM)" in line for line in lines), lines
    assert lines[0].endswith("; decoder: fast path (llama)")
    assert lines[1].endswith("; decoder: PaddleNLP's forward (PADDLE_GRPO_FAST=0)")
