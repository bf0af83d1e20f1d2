"""use_fused_head_and_loss_fn's default (issue 22 item 5): unset, the chunked LM head from HEAD_CHUNK_MIN_VOCAB
tokens on and full logits below; an explicit true or false, from the file or the command line, always wins; the
start-up line says which and why. The decision is `Config.lm_head_decision`; `policy.head_chunk_size` reads the
vocabulary from the model's config.json and logs the line; the trainer passes it to the policy and the reference.
"""
import json
import logging
import math
import shutil

import pytest

from paddle_grpo.config import HEAD_CHUNK_MIN_VOCAB, Config, config_from_dict, load_config
from paddle_grpo.policy import head_chunk_size, model_vocab_size

SMALL, LARGE = HEAD_CHUNK_MIN_VOCAB - 1, HEAD_CHUNK_MIN_VOCAB


def test_unset_is_none_and_paddlenlps_false_stays_explicit(tmp_path):
    assert Config().use_fused_head_and_loss_fn is None
    path = tmp_path / "cfg.yaml"
    for text, expected in (("use_fused_head_and_loss_fn: false\n", False),
                           ("use_fused_head_and_loss_fn: true\n", True),
                           ("use_fused_head_and_loss_fn: null\n", None), ("learning_rate: 1.0e-6\n", None)):
        path.write_text(text)
        assert load_config(path, warn=False).use_fused_head_and_loss_fn is expected, text


@pytest.mark.parametrize("setting, vocab, chunked", [
    (None, LARGE, True), (None, 151936, True), (None, SMALL, False), (None, 300, False),
    (False, LARGE, False), (False, 151936, False), (True, SMALL, True), (True, 300, True)])
def test_the_decision(setting, vocab, chunked):
    cfg = config_from_dict({} if setting is None else {"use_fused_head_and_loss_fn": setting,
                                                       "fused_head_chunk_size": 64})
    chunk, line = cfg.lm_head_decision(vocab)
    assert chunk == ((cfg.fused_head_chunk_size if chunked else None))
    if setting is None:
        sign = ">=" if chunked else "<"
        why = (f"(use_fused_head_and_loss_fn unset, vocabulary {vocab:,} {sign} {HEAD_CHUNK_MIN_VOCAB:,} "
               "(set it to choose))")
    else:
        why = f"(use_fused_head_and_loss_fn: {str(setting).lower()} in the config)"
    what = (f"chunked, {cfg.fused_head_chunk_size} positions at a time" if chunked
            else f"full [rows, T, {vocab}] logits")
    assert line == f"LM head: {what} {why}"


def test_the_command_line_wins_over_the_file(tmp_path):
    path = tmp_path / "cfg.yaml"
    path.write_text("use_fused_head_and_loss_fn: true\n")
    cfg = load_config(path, ["--use_fused_head_and_loss_fn", "false"], warn=False)
    assert cfg.lm_head_decision(LARGE)[0] is None
    path.write_text("use_fused_head_and_loss_fn: false\n")
    assert load_config(path, ["--use_fused_head_and_loss_fn", "null"], warn=False).lm_head_decision(LARGE)[0] == 512


def _model_dir(tmp_path, tiny_policy_dir, vocab):
    """The tiny policy's tokenizer with a random 1-layer Qwen2 of `vocab` outputs (more rows than the tokenizer has
    tokens, as Qwen's 151,936 has over its tokenizer's 151,665: every sampled id still decodes)."""
    import paddle
    from paddlenlp.transformers import Qwen2Config, Qwen2ForCausalLM

    out = tmp_path / f"model_{vocab}"
    shutil.copytree(tiny_policy_dir, out)
    base = json.loads((out / "config.json").read_text())
    config = Qwen2Config(vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                         eos_token_id=base["eos_token_id"], pad_token_id=base["pad_token_id"],
                         bos_token_id=base["pad_token_id"], dtype="float32")
    paddle.seed(0)
    Qwen2ForCausalLM(config).save_pretrained(str(out))
    return str(out)


def test_head_chunk_size_reads_the_vocabulary_and_logs_one_line(tmp_path, tiny_policy_dir, caplog):
    assert model_vocab_size(tiny_policy_dir) == 320
    with caplog.at_level(logging.INFO, logger="paddle_grpo.policy"):
        assert head_chunk_size(config_from_dict({"actor_model_name_or_path": tiny_policy_dir})) is None
        assert head_chunk_size(config_from_dict({"actor_model_name_or_path": tiny_policy_dir}), announce=False) is None
    lines = [r.getMessage() for r in caplog.records if r.name == "paddle_grpo.policy"]
    assert lines == [f"LM head: full [rows, T, 320] logits (use_fused_head_and_loss_fn unset, vocabulary 320 < "
                     f"{HEAD_CHUNK_MIN_VOCAB:,} (set it to choose))"]


REWARD = '''
def reward(prompts, completions, **kwargs):
    return [float("a" in c) for c in completions]
'''


@pytest.mark.parametrize("setting", [None, False])
def test_trainer_at_a_large_vocabulary(tmp_path, tiny_policy_dir, caplog, setting):
    """Unset at vocabulary HEAD_CHUNK_MIN_VOCAB: the policy and the reference get the chunked head, the start-up
    says so, and a step runs; explicit false at the same vocabulary: full logits."""
    from paddle_grpo.trainer import Trainer

    model = _model_dir(tmp_path, tiny_policy_dir, LARGE)
    (tmp_path / "rewards.py").write_text(REWARD)
    (tmp_path / "train.jsonl").write_text("".join(json.dumps({"src": f"Who is {n}?", "tgt": ""}) + "\n"
                                                  for n in ("Ann", "Bob")))
    cfg = config_from_dict(dict(
        actor_model_name_or_path=model, use_rm_server=False, reward_funcs=f"{tmp_path / 'rewards.py'}:reward",
        train_datasets=str(tmp_path / "train.jsonl"), output_dir=str(tmp_path / "out"),
        logging_dir=str(tmp_path / "vdl"), max_prompt_len=16, max_dec_len=4, min_dec_len=1, max_length=20,
        global_batch_size=2,
        rollout_n=2, per_device_train_batch_size=4, per_device_logprob_batch_size=4, max_steps=1,
        save_strategy="no", disable_tqdm=True, kl_loss_coeff=0.05, chat_template="none",
        **({} if setting is None else {"use_fused_head_and_loss_fn": setting})))
    with caplog.at_level(logging.INFO, logger="paddle_grpo.policy"):
        trainer = Trainer(cfg)
    expected = 512 if setting is None else None
    assert trainer.policy.head_chunk_size == trainer.reference.head_chunk_size == expected
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("LM head:")]
    assert len(lines) == 1 and lines[0].startswith("LM head: chunked, 512" if expected else "LM head: full"), lines
    if setting is None:
        metrics = trainer.train_step()
        assert math.isfinite(metrics["train/policy_loss"]) and math.isfinite(metrics["train/kl_loss"])
