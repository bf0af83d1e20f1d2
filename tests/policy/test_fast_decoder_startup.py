"""The trainer's start-up line about the decoder path (fast_decoder.describe): a tiny Llama policy says
"decoder: fast path (llama)" and trains a step on it; with LoRA the line names PaddleNLP's forward and why."""
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
    expected = ("decoder: PaddleNLP's forward (LoRA adapters (LoRAModel): its LoRA layers run in PaddleNLP's forward)"
                if lora else "decoder: fast path (llama)")
    assert lines == [expected]
    metrics = trainer.train_step()
    assert math.isfinite(metrics["train/policy_loss"]) and math.isfinite(metrics["train/kl_loss"])


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
