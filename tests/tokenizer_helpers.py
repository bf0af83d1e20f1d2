"""Tokenizer directories as transformers and the hub write them, built locally with the `tokenizers` library (no
download), and the strings their ids are compared on (tests/policy/test_tokenizer*.py)."""
import json
import os

import numpy as np

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MARKERS = ["<tool_call>", "</tool_call>"]  # added, not special: chat markers a template writes
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
PIECES = ["Hello", " world", "  42", "12 + 35 = 47", "\n\n", "\t", "   ", "café", " naïve", " 日本語", " 😀", " don't",
          " I'M", "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<tool_call>", "</tool_call>", "user\n", " 3.14159",
          "####", " Zoey", " knave", "x=1", "-7", "1000000", " ", "a", "\r\n", "ÿ", "—", "{\"a\": 1}"]


def probe_strings(n=300, seed=0):
    """`n` strings of 1-8 pieces of PIECES (digits, runs of whitespace, non-ASCII, special and added tokens)."""
    rng = np.random.default_rng(seed)
    return ["".join(rng.choice(PIECES, size=rng.integers(1, 9))) for _ in range(n)]


def build_tokenizer_json(path):
    """A SmolLM2-like tokenizer.json at `path`: digits split one by one, then byte-level BPE; SPECIAL as special
    tokens, MARKERS as added non-special tokens; a template post-processor that adds nothing."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False)])
    tok.decoder = decoders.ByteLevel()
    corpus = ["".join(p for p in PIECES if not p.startswith("<")) * 3, "Hello world, the answer is 47."] * 40
    trainer = trainers.BpeTrainer(vocab_size=420, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus, trainer)
    tok.add_tokens([AddedToken(m, special=False, normalized=False) for m in MARKERS])
    tok.save(str(path))


def write_tokenizer_dir(directory, tokenizer_class, template_file=True):
    """A tokenizer directory with only tokenizer.json + tokenizer_config.json naming `tokenizer_class` (and the chat
    template in chat_template.jinja, as transformers 5 writes it, or in tokenizer_config.json)."""
    os.makedirs(directory, exist_ok=True)
    build_tokenizer_json(os.path.join(directory, "tokenizer.json"))
    config = {"tokenizer_class": tokenizer_class, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
              "bos_token": None, "unk_token": None, "model_max_length": 8192,
              "extra_special_tokens": ["<|im_start|>", "<|im_end|>"]}
    if template_file:
        with open(os.path.join(directory, "chat_template.jinja"), "w", encoding="utf-8") as f:
            f.write(TEMPLATE)
    else:
        config["chat_template"] = TEMPLATE
    with open(os.path.join(directory, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f)
    return str(directory)
