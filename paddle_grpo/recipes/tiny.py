"""Tiny Qwen2-architecture models and tokenizers made locally (tests, benchmark, quickstart; never downloaded).

`build_tokenizer(corpus, out_dir, vocab_size)` trains a byte-level BPE (the `tokenizers` library) on the given texts
and saves it as a PaddleNLP `Qwen2Tokenizer` with Qwen's special tokens; `build_model(out_dir, tokenizer, **sizes)`
saves a randomly initialised `Qwen2ForCausalLM`; `build_reward_model(out_dir, corpus)` both, with a one-label
`Qwen2ForSequenceClassification` (a reward model); `build_char_tokenizer(out_dir, vocab_size)` a character-level
tokenizer of exactly `vocab_size` tokens, any size up to Qwen's 151,936 (tools/bench/bench.py). The directory then loads
with `AutoTokenizer` / `AutoModelForCausalLM` like any PaddleNLP checkpoint.
"""
from __future__ import annotations

import os
import tempfile
from typing import TYPE_CHECKING, Any, Iterable, Sequence

if TYPE_CHECKING:
    from paddlenlp.transformers import (PretrainedTokenizer, Qwen2ForCausalLM, Qwen2ForSequenceClassification,
                                        Qwen2Tokenizer)

PAD, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = [PAD, IM_START, IM_END]


def build_tokenizer(corpus: Iterable[str], out_dir: str, vocab_size: int = 512,
                    added_tokens: Sequence[str] = ()) -> Qwen2Tokenizer:
    """Train a byte-level BPE on `corpus` (iterable of str) and save a Qwen2Tokenizer in `out_dir`.

    EOS is `<|im_end|>` (Qwen's chat turn end), padding `<|endoftext|>`. `added_tokens` (e.g. Qwen2.5's
    `<tool_call>`, `</tool_call>`) become single tokens, registered as Qwen2.5 registers them (in
    tokenizer_config.json's added_tokens_decoder, not special), so `data.tokenize_prompts` keeps them whole.
    Returns the paddlenlp tokenizer (reloaded from `out_dir` when there are added tokens).
    """
    from paddlenlp.transformers import Qwen2Tokenizer
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS + list(added_tokens),
                                  show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator(list(corpus), trainer)
    os.makedirs(out_dir, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        vocab, merges = bpe.model.save(tmp)
        tokenizer = Qwen2Tokenizer(vocab_file=vocab, merges_file=merges, unk_token=None, bos_token=None,
                                   eos_token=IM_END, pad_token=PAD)
        tokenizer.padding_side = "left"
        tokenizer.save_pretrained(out_dir)
    if added_tokens:
        tokenizer = _register_added_tokens(out_dir, added_tokens)
    return tokenizer


def _register_added_tokens(out_dir, added_tokens):
    import json

    from paddlenlp.transformers import AutoTokenizer

    with open(os.path.join(out_dir, "vocab.json"), encoding="utf-8") as f:
        vocab = json.load(f)
    path = os.path.join(out_dir, "tokenizer_config.json")
    with open(path, encoding="utf-8") as f:
        config = json.load(f)
    config["added_tokens_decoder"] = {
        str(vocab[token]): {"content": token, "lstrip": False, "rstrip": False, "normalized": False,
                            "single_word": False, "special": False} for token in added_tokens}
    with open(path, "w", encoding="utf-8") as f:
        json.dump(config, f, ensure_ascii=False, indent=2)
    tokenizer = AutoTokenizer.from_pretrained(out_dir)
    tokenizer.padding_side = "left"
    return tokenizer


def _config(tokenizer, *, hidden_size, intermediate_size, num_layers, num_heads, num_kv_heads,
            max_position_embeddings, **extra):
    from paddlenlp.transformers import Qwen2Config

    return Qwen2Config(vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=intermediate_size,
                       num_hidden_layers=num_layers, num_attention_heads=num_heads,
                       num_key_value_heads=num_kv_heads, max_position_embeddings=max_position_embeddings,
                       eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                       bos_token_id=tokenizer.pad_token_id, rms_norm_eps=1e-6, dtype="float32", **extra)


def build_model(out_dir: str, tokenizer: PretrainedTokenizer, *, hidden_size: int = 64, intermediate_size: int = 128,
                num_layers: int = 2, num_heads: int = 4, num_kv_heads: int = 2, max_position_embeddings: int = 1024,
                seed: int = 0, tie_word_embeddings: bool = False) -> Qwen2ForCausalLM:
    """Save a randomly initialised Qwen2ForCausalLM whose vocabulary matches `tokenizer`; returns the model."""
    import paddle
    from paddlenlp.transformers import Qwen2ForCausalLM

    config = _config(tokenizer, hidden_size=hidden_size, intermediate_size=intermediate_size, num_layers=num_layers,
                     num_heads=num_heads, num_kv_heads=num_kv_heads, max_position_embeddings=max_position_embeddings,
                     tie_word_embeddings=tie_word_embeddings)
    paddle.seed(seed)
    model = Qwen2ForCausalLM(config)
    model.save_pretrained(out_dir)
    return model


def build_reward_model(out_dir: str, corpus: Iterable[str], *, vocab_size: int = 320, seed: int = 0,
                       hidden_size: int = 32, intermediate_size: int = 64, num_layers: int = 2, num_heads: int = 4,
                       num_kv_heads: int = 2, max_position_embeddings: int = 1024) -> Qwen2ForSequenceClassification:
    """Tokenizer + randomly initialised Qwen2ForSequenceClassification with one label (a reward model's shape:
    `reward_model_name_or_path`, `python -m reward_server --reward-model`) in `out_dir`; returns the model.
    Seeded: the same arguments give the same weights, so the same scores."""
    import paddle
    from paddlenlp.transformers import Qwen2ForSequenceClassification

    tokenizer = build_tokenizer(corpus, out_dir, vocab_size=vocab_size)
    config = _config(tokenizer, hidden_size=hidden_size, intermediate_size=intermediate_size, num_layers=num_layers,
                     num_heads=num_heads, num_kv_heads=num_kv_heads, max_position_embeddings=max_position_embeddings,
                     num_labels=1)
    paddle.seed(seed)
    model = Qwen2ForSequenceClassification(config)
    model.save_pretrained(out_dir)
    return model


def build_tiny_policy(out_dir: str, corpus: Iterable[str], *, vocab_size: int = 512, seed: int = 0,
                      **model_kwargs: Any) -> tuple[Qwen2Tokenizer, Qwen2ForCausalLM]:
    """Tokenizer + random model in one directory (what `actor_model_name_or_path` points at)."""
    tokenizer = build_tokenizer(corpus, out_dir, vocab_size=vocab_size)
    model = build_model(out_dir, tokenizer, seed=seed, **model_kwargs)
    return tokenizer, model


def _byte_to_unicode():
    """GPT-2's byte -> printable character table (what byte-level BPE vocabularies are written in)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


# Single-byte characters in the order a character vocabulary takes them: printable ASCII, newline, tab, then the
# other ASCII control characters (128 in all).
CHAR_ALPHABET = "".join(map(chr, [*range(32, 127), 10, 9, *range(0, 9), *range(11, 32), 127]))


def synthetic_words(n: int) -> list[str]:
    """The first `n` lowercase "words" in length-then-alphabetical order: aa, ab, ..., zz, aaa, ... (>= 2 letters,
    so never a single character of CHAR_ALPHABET)."""
    import itertools
    import string

    words = ("".join(w) for size in itertools.count(2)
             for w in itertools.product(string.ascii_lowercase, repeat=size))
    return list(itertools.islice(words, n))


def write_char_vocab(out_dir: str, vocab_size: int) -> tuple[str, str]:
    """`vocab.json` and an empty `merges.txt` of build_char_tokenizer's vocabulary in `out_dir`, without importing
    paddle (tools/bench/trl_bench.py loads them with transformers' Qwen2Tokenizer). Returns the two paths."""
    import json

    n_chars = min(vocab_size - len(SPECIAL_TOKENS), len(CHAR_ALPHABET))
    if n_chars < 1:
        raise ValueError(f"vocab_size must be at least {len(SPECIAL_TOKENS) + 1}, got {vocab_size}")
    table = _byte_to_unicode()
    vocab = {t: i for i, t in enumerate(SPECIAL_TOKENS)}
    for ch in CHAR_ALPHABET[:n_chars]:
        vocab[table[ord(ch)]] = len(vocab)
    # Lowercase ASCII letters are their own byte-level spelling, so a word's entry decodes to the word itself.
    for word in synthetic_words(vocab_size - len(vocab)):
        vocab[word] = len(vocab)
    vocab_file, merges_file = os.path.join(out_dir, "vocab.json"), os.path.join(out_dir, "merges.txt")
    with open(vocab_file, "w", encoding="utf-8") as f:
        json.dump(vocab, f, ensure_ascii=False)
    with open(merges_file, "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n")
    return vocab_file, merges_file


def build_char_tokenizer(out_dir: str, vocab_size: int = 128) -> Qwen2Tokenizer:
    """A character-level Qwen2Tokenizer with exactly `vocab_size` tokens and no merges: Qwen's 3 special tokens, the
    first `vocab_size - 3` characters of CHAR_ALPHABET (all 128 of them above 131 tokens), then, to fill a
    real-size vocabulary (e.g. Qwen's 151,936), `synthetic_words` (aa, ab, ...).

    Every id decodes to non-empty text, as with a real tokenizer (a sampled id of a random model must not vanish
    from the completion text). Encoding never yields a word: without merges each character of CHAR_ALPHABET is one
    token, so a text of n such characters is n tokens. Up to 131 tokens the files are those of the plain character
    tokenizer (the quickstart and tests rely on its ids). Characters outside the alphabet map to the unknown token
    (= EOS); use only CHAR_ALPHABET in texts. Building 151,936 tokens takes about a second. Returns the tokenizer.
    """
    from paddlenlp.transformers import Qwen2Tokenizer

    os.makedirs(out_dir, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        vocab_file, merges_file = write_char_vocab(tmp, vocab_size)
        tokenizer = Qwen2Tokenizer(vocab_file=vocab_file, merges_file=merges_file, unk_token=None, bos_token=None,
                                   eos_token=IM_END, pad_token=PAD)
        tokenizer.padding_side = "left"
        tokenizer.save_pretrained(out_dir)
    return tokenizer
