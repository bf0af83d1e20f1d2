"""Tokenizers as transformers 5 reads and writes them (the `.[peer]` environment), on 300 strings with digits,
whitespace runs, non-ASCII, special and added tokens, for each class name a hub tokenizer_config.json carries, on the
directory and on transformers' own save_pretrained of it (chat_template.jinja):

- transformers' tokenizer of the file as it is (`TokenizersBackend`, what AutoTokenizer builds for TokenizersBackend
  and PreTrainedTokenizerFast) gives load_tokenizer's ids and chat text, for every class name;
- AutoTokenizer for GPT2Tokenizer and Qwen2Tokenizer: transformers 5.25 rebuilds those classes' pre-tokenizer (plain
  byte-level, its own regex) instead of the file's, and so loses a digit split the file has (SmolLM2's: "  42" ->
  [Ġ, Ġ, 4, 2]); load_tokenizer follows the file (transformers 4's fast classes do too). The test records that
  they differ on some strings, so that a transformers that stops doing it is noticed. transformers' save_pretrained
  of such a tokenizer writes the rebuilt one, which then loads the same everywhere.

Skipped with the reason where the peer environment is absent (PADDLE_GRPO_PEER_PYTHON)."""
import json
import os
import subprocess

from peer_helpers import transformers_python_or_skip
from tokenizer_helpers import probe_strings, write_tokenizer_dir
from paddle_grpo.policy import load_tokenizer

CLASSES = ["TokenizersBackend", "GPT2Tokenizer", "PreTrainedTokenizerFast", "Qwen2Tokenizer"]
MESSAGES = [{"role": "user", "content": "What is 12 + 35?"}, {"role": "assistant", "content": "  47 <tool_call>"}]

PEER = r'''
import json, sys
from transformers import AutoTokenizer, TokenizersBackend
spec = json.loads(sys.argv[1])
out = {}
for source, saved in spec["dirs"]:
    tok = AutoTokenizer.from_pretrained(source)
    tok.save_pretrained(saved)
    for d in (source, saved):
        t, auto = TokenizersBackend.from_pretrained(d), AutoTokenizer.from_pretrained(d)
        out[d] = {"ids": [t(s)["input_ids"] for s in spec["strings"]], "class": type(auto).__name__,
                  "auto": [auto(s)["input_ids"] for s in spec["strings"]],
                  "chat": t.apply_chat_template(spec["messages"], tokenize=False, add_generation_prompt=True)}
print(json.dumps(out))
'''


def test_ids_and_chat_text_equal_transformers(tmp_path):
    python = transformers_python_or_skip()
    strings = probe_strings()
    dirs = [(write_tokenizer_dir(tmp_path / c, c, template_file=c != "Qwen2Tokenizer"), str(tmp_path / f"{c}-saved"))
            for c in CLASSES]
    spec = {"dirs": dirs, "strings": strings, "messages": MESSAGES}
    peer = subprocess.run([python, "-c", PEER, json.dumps(spec)], capture_output=True, text=True, timeout=600)
    assert peer.returncode == 0, peer.stderr[-3000:]
    theirs = json.loads(peer.stdout.strip().splitlines()[-1])
    for source, saved in dirs:
        assert os.path.isfile(f"{saved}/chat_template.jinja")  # transformers 5's own layout, whatever the source's
        for directory in (source, saved):
            ours = load_tokenizer(directory)
            assert [ours(s)["input_ids"] for s in strings] == theirs[directory]["ids"], directory
            assert ours.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True) == \
                theirs[directory]["chat"], directory
            same = sum(a == b for a, b in zip(theirs[directory]["auto"], theirs[directory]["ids"]))
            if directory == source and theirs[directory]["class"] in ("GPT2Tokenizer", "Qwen2Tokenizer"):
                assert same < len(strings), directory  # rebuilt by transformers 5 (module docstring)
            else:  # the file as it is; or transformers' save of its rebuilt tokenizer, which then is the file
                assert same == len(strings), directory
