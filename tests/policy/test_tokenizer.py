"""A directory with a tokenizer.json loads a tokenizer that reproduces it exactly, whatever class name its
tokenizer_config.json carries (policy/tokenizer.py). The reference is the `tokenizers` library's own encode of the
same file (what transformers runs); transformers itself is compared in test_tokenizer_peer.py."""
import pytest
from tokenizers import Tokenizer

from tokenizer_helpers import MARKERS, SPECIAL, probe_strings, write_tokenizer_dir
from paddle_grpo.policy import load_tokenizer

CLASSES = ["TokenizersBackend", "GPT2Tokenizer", "PreTrainedTokenizerFast", "Qwen2Tokenizer"]


@pytest.fixture(scope="module", params=CLASSES)
def tokenizer_dir(request, tmp_path_factory):
    return write_tokenizer_dir(tmp_path_factory.mktemp(request.param), request.param)


def test_ids_equal_the_tokenizer_json(tokenizer_dir):
    ours = load_tokenizer(tokenizer_dir)
    reference = Tokenizer.from_file(f"{tokenizer_dir}/tokenizer.json")
    strings = probe_strings()
    assert any(" 4" in s or "42" in s for s in strings) and any(m in s for s in strings for m in SPECIAL + MARKERS)
    for add in (False, True):
        got = [ours(s, add_special_tokens=add)["input_ids"] for s in strings]
        assert got == [reference.encode(s, add_special_tokens=add).ids for s in strings]
    # SmolLM2's digit split, which PaddleNLP's GPTTokenizer loses: "  42" is [ĠĠ, 4, 2], not [Ġ, Ġ, 4, 2]
    assert ours.convert_ids_to_tokens(ours("  42", add_special_tokens=False)["input_ids"]) == ["ĠĠ", "4", "2"]
    for s in strings[:50]:
        ids = ours(s, add_special_tokens=False)["input_ids"]
        assert ours.decode(ids, skip_special_tokens=False) == reference.decode(ids, skip_special_tokens=False) == s


def test_special_tokens_and_vocabulary(tokenizer_dir):
    ours = load_tokenizer(tokenizer_dir)
    reference = Tokenizer.from_file(f"{tokenizer_dir}/tokenizer.json")
    assert ours.eos_token_id == reference.token_to_id("<|im_end|>")
    assert ours.pad_token_id == reference.token_to_id("<|endoftext|>")
    assert len(ours) == reference.get_vocab_size(with_added_tokens=True)
    assert ours.get_vocab() == reference.get_vocab(with_added_tokens=True)
    assert ours.padding_side == "left"


def test_the_chat_template_comes_from_chat_template_jinja(tokenizer_dir, tmp_path):
    """transformers 5 writes the template beside tokenizer_config.json; it is used, and kept by save_pretrained."""
    ours = load_tokenizer(tokenizer_dir)
    messages = [{"role": "user", "content": "What is 12 + 35?"}]
    text = "<|im_start|>user\nWhat is 12 + 35?<|im_end|>\n<|im_start|>assistant\n"
    assert ours.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == text
    ours.save_pretrained(str(tmp_path / "saved"))
    again = load_tokenizer(str(tmp_path / "saved"))
    assert again.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == text
    assert again("  42 <tool_call>")["input_ids"] == ours("  42 <tool_call>")["input_ids"]


def test_a_transformers5_directory_passes_the_dry_run_and_trains(tmp_path):
    """Model and tokenizer in transformers 5's layout (rope theta inside rope_parameters; TokenizersBackend with only
    tokenizer.json; chat_template.jinja): the dry run names how each is read and says ok, and a step trains (before:
    the dry run failed on the tokenizer class, and the rope theta fell back to 10000 without a word)."""
    import json
    import os
    import subprocess
    import sys

    from dry_run_helpers import REPO, one_step_run_argv
    from rope_helpers import edit_config, sharp_llama, transformers5_layout

    model = write_tokenizer_dir(tmp_path / "model", "TokenizersBackend")
    vocab = Tokenizer.from_file(f"{model}/tokenizer.json").get_vocab_size(with_added_tokens=True)
    sharp_llama(model, vocab_size=vocab, eos_token_id=2, pad_token_id=0, bos_token_id=1)
    edit_config(model, lambda c: transformers5_layout(c, {"rope_type": "default", "rope_theta": 1e5}))
    assert not os.path.exists(f"{model}/vocab.json")  # PaddleNLP's save wrote no tokenizer files over ours
    argv, out_dir = one_step_run_argv(tmp_path, model)
    env = {**os.environ, "PPNLP_HOME": str(tmp_path / "ppnlp"), "PYTHONPATH": str(REPO)}
    dry = subprocess.run([sys.executable, *argv, "--dry_run"], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=400)
    assert dry.returncode == 0 and "dry run: ok" in dry.stdout, dry.stdout[-3000:] + dry.stderr[-3000:]
    assert "tokenizer.json read as it is; tokenizer_config.json names TokenizersBackend" in dry.stdout
    assert "actor_model_name_or_path: rope theta 100000, no scaling" in dry.stdout
    run = subprocess.run([sys.executable, *argv], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400)
    assert run.returncode == 0, run.stderr[-3000:]
    with open(out_dir / "metrics.jsonl") as f:
        assert [json.loads(line)["step"] for line in f] == [1]
