"""Tiny Qwen2-architecture models and tokenizers made locally (tests, benchmark, quickstart; never downloaded).

`build_tokenizer(corpus, vocab_size, out_dir)` trains a byte-level BPE (the `tokenizers` library) on the given texts
and saves it as a PaddleNLP `Qwen2Tokenizer` with Qwen's special tokens; `build_model(config_kwargs, out_dir)` saves
a randomly initialised `Qwen2ForCausalLM`. The directory then loads with `AutoTokenizer` / `AutoModelForCausalLM`
like any PaddleNLP checkpoint.
"""
from __future__ import annotations

import os
import tempfile

PAD, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = [PAD, IM_START, IM_END]


def build_tokenizer(corpus, out_dir, vocab_size=512):
    """Train a byte-level BPE on `corpus` (iterable of str) and save a Qwen2Tokenizer in `out_dir`.

    EOS is `<|im_end|>` (Qwen's chat turn end), padding `<|endoftext|>`. Returns the paddlenlp tokenizer.
    """
    from paddlenlp.transformers import Qwen2Tokenizer
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator(list(corpus), trainer)
    os.makedirs(out_dir, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        vocab, merges = bpe.model.save(tmp)
        tokenizer = Qwen2Tokenizer(vocab_file=vocab, merges_file=merges, unk_token=None, bos_token=None,
                                   eos_token=IM_END, pad_token=PAD)
        tokenizer.padding_side = "left"
        tokenizer.save_pretrained(out_dir)
    return tokenizer


def build_model(out_dir, tokenizer, *, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                num_kv_heads=2, max_position_embeddings=1024, seed=0, tie_word_embeddings=False):
    """Save a randomly initialised Qwen2ForCausalLM whose vocabulary matches `tokenizer`; returns the model."""
    import paddle
    from paddlenlp.transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=intermediate_size,
                         num_hidden_layers=num_layers, num_attention_heads=num_heads,
                         num_key_value_heads=num_kv_heads, max_position_embeddings=max_position_embeddings,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                         bos_token_id=tokenizer.pad_token_id, tie_word_embeddings=tie_word_embeddings,
                         rms_norm_eps=1e-6, dtype="float32")
    paddle.seed(seed)
    model = Qwen2ForCausalLM(config)
    model.save_pretrained(out_dir)
    return model


def build_tiny_policy(out_dir, corpus, *, vocab_size=512, seed=0, **model_kwargs):
    """Tokenizer + random model in one directory (what `actor_model_name_or_path` points at)."""
    tokenizer = build_tokenizer(corpus, out_dir, vocab_size=vocab_size)
    model = build_model(out_dir, tokenizer, seed=seed, **model_kwargs)
    return tokenizer, model
