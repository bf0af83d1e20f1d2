"""Seq2seq build recipes: a tiny random T5 / BART with a locally trained tokenizer, and the summarization policy
(optionally fine-tuned on reference summaries) that configs/summarization*.yaml train. Nothing is downloaded."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Sequence, Tuple, Union

import numpy as np
import paddle

from ..data import collate_prompts, read_jsonl
from ..policy.seq2seq import completion_logprobs, encoder_input_ids
from .tiny import build_tokenizer

if TYPE_CHECKING:
    from paddlenlp.transformers import Qwen2Tokenizer


def build_tiny_seq2seq(out_dir: str, corpus: Iterable[str], *, arch: str = "t5", vocab_size: int = 512,
                       d_model: int = 64, ffn_dim: int = 128, num_layers: int = 2, num_heads: int = 4,
                       max_position_embeddings: int = 512, seed: int = 0) -> Tuple[Qwen2Tokenizer, paddle.nn.Layer]:
    """Save a randomly initialised tiny T5 or BART (`arch`) and a byte-level BPE tokenizer trained on `corpus` in
    `out_dir`; returns (tokenizer, model). Loads with AutoTokenizer / AutoModelForConditionalGeneration.

    The tokenizer is tiny.build_tokenizer's Qwen2Tokenizer (EOS `<|im_end|>`, pad `<|endoftext|>`); the decoder
    starts from pad (T5's convention) for T5 and from EOS (BART's) for BART. Dropout is 0. BART's learned positions
    cover `max_position_embeddings` tokens; T5's relative positions have no limit.
    """
    from paddlenlp.transformers import BartConfig, BartForConditionalGeneration, T5Config, T5ForConditionalGeneration

    tokenizer = build_tokenizer(corpus, out_dir, vocab_size=vocab_size)
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    if arch == "t5":
        config = T5Config(vocab_size=len(tokenizer), d_model=d_model, d_kv=d_model // num_heads, d_ff=ffn_dim,
                          num_layers=num_layers, num_decoder_layers=num_layers, num_heads=num_heads,
                          relative_attention_num_buckets=16, dropout_rate=0.0, feed_forward_proj="relu",
                          pad_token_id=pad, eos_token_id=eos, bos_token_id=pad, decoder_start_token_id=pad,
                          tie_word_embeddings=False)
        cls = T5ForConditionalGeneration
    elif arch == "bart":
        config = BartConfig(vocab_size=len(tokenizer), d_model=d_model, encoder_layers=num_layers,
                            decoder_layers=num_layers, encoder_attention_heads=num_heads,
                            decoder_attention_heads=num_heads, encoder_ffn_dim=ffn_dim, decoder_ffn_dim=ffn_dim,
                            max_position_embeddings=max_position_embeddings, dropout=0.0, attention_dropout=0.0,
                            activation_dropout=0.0, pad_token_id=pad, bos_token_id=pad, eos_token_id=eos,
                            decoder_start_token_id=eos, forced_eos_token_id=None,
                            init_std=0.2)  # BART's 0.02 makes a 2-layer random model ignore its input
        cls = BartForConditionalGeneration
    else:
        raise ValueError(f"arch must be 't5' or 'bart', got {arch!r}")
    paddle.seed(seed)
    model = cls(config)
    model.save_pretrained(out_dir)
    return tokenizer, model


def build_summarization_policy(out_dir: str, train_datasets: Union[str, Sequence[str]], *, arch: str = "t5",
                               seed: int = 0, sft_steps: int = 0, sft_batch_size: int = 16,
                               sft_learning_rate: float = 3e-3,
                               **model_kwargs: Any) -> Tuple[Qwen2Tokenizer, paddle.nn.Layer]:
    """A tiny random encoder-decoder whose tokenizer is trained on the src and tgt texts of `train_datasets`
    (src/tgt JSONL, comma-separated for several); see build_tiny_seq2seq. Returns (tokenizer, model).

    `sft_steps > 0` first fine-tunes it on the reference summaries (teacher-forced cross-entropy through
    `completion_logprobs`, AdamW, batches drawn with `seed`) and saves that: a random policy's samples score
    ROUGE-L ~0, so GRPO has nothing to compare; after ~100 steps greedy summaries score ~0.5 and samples vary.
    """
    records = read_jsonl(train_datasets)
    corpus = [r["src"] for r in records] + [r["tgt"] for r in records]
    tokenizer, model = build_tiny_seq2seq(out_dir, corpus, arch=arch, seed=seed, **model_kwargs)
    if sft_steps <= 0:
        return tokenizer, model
    encode_ = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    pairs = [(encoder_input_ids(tokenizer, encode_(r["src"])), encode_(r["tgt"]) + [tokenizer.eos_token_id])
             for r in records]
    optimizer = paddle.optimizer.AdamW(learning_rate=sft_learning_rate, parameters=model.parameters(),
                                       weight_decay=0.0)
    rng = np.random.default_rng(seed)
    model.train()
    for _ in range(sft_steps):
        batch = [pairs[i] for i in rng.choice(len(pairs), min(sft_batch_size, len(pairs)), replace=False)]
        ids, mask = collate_prompts([src for src, _ in batch], tokenizer.pad_token_id, None)
        lengths = np.array([len(t) for _, t in batch])
        tgt = np.array([t + [tokenizer.pad_token_id] * (lengths.max() - len(t)) for _, t in batch])
        tgt_mask = paddle.to_tensor(np.arange(lengths.max())[None] < lengths[:, None], dtype="float32")
        logprobs, _ = completion_logprobs(model, paddle.to_tensor(ids), paddle.to_tensor(mask),
                                          paddle.to_tensor(tgt), tgt_mask.astype("int64"))
        loss = -(logprobs * tgt_mask).sum() / tgt_mask.sum()
        loss.backward()
        optimizer.step()
        optimizer.clear_grad()
    model.save_pretrained(out_dir)
    return tokenizer, model
