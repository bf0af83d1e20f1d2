"""Tokenizers as transformers reads them: a directory with a `tokenizer.json` is that file, whatever class it names.

transformers 5's `save_pretrained` writes `tokenizer_class: TokenizersBackend` and only tokenizer.json; hub checkpoints
say `GPT2Tokenizer` or `PreTrainedTokenizerFast` (SmolLM2, Llama 3), or `Qwen2Tokenizer`, sometimes with tokenizer.json
alone. PaddleNLP's AutoTokenizer knows none of the first three and needs vocab.json + merges.txt for the last, and its
look-alike classes (GPTTokenizer for GPT2Tokenizer) tokenize with other rules (SmolLM2's digit split is lost). The
`tokenizers` library reads tokenizer.json exactly (normalizer, pre-tokenizer with its digit and regex splits, BPE,
added and special tokens, post-processor), and PaddleNLP wraps it in its own `PretrainedTokenizerFast`, which has the
interface the rest of the code uses (`__call__`, `decode`, special tokens and ids, `get_vocab`, `apply_chat_template`,
`save_pretrained`); so that is what a directory with a tokenizer.json loads. A directory without one loads with
PaddleNLP's AutoTokenizer as before (the class named in tokenizer_config.json, e.g. this project's tiny Qwen2
tokenizers). In both cases a Jinja chat template in `chat_template.jinja` (where transformers 5 writes it) is used
when tokenizer_config.json holds none.
"""
from __future__ import annotations

import functools
import json
import os
from typing import Any

__all__ = ["TOKENIZER_FILE", "chat_template_text", "read_tokenizer", "tokenizer_kind"]

TOKENIZER_FILE = "tokenizer.json"
CHAT_TEMPLATE_FILE = "chat_template.jinja"


@functools.lru_cache(maxsize=None)
def _paddlenlp_fast() -> type:
    """The TokenizerJson class, made on first use (importing paddlenlp takes seconds)."""
    from paddlenlp.transformers import PretrainedTokenizerFast

    class TokenizerJson(PretrainedTokenizerFast):
        """PaddleNLP's wrapper of a `tokenizers.Tokenizer` read from tokenizer.json; an encoder's special tokens
        (`build_inputs_with_special_tokens`) come from the file's own post-processor, as in transformers."""

        def build_inputs_with_special_tokens(self, token_ids_0: list[int],
                                             token_ids_1: list[int] | None = None) -> list[int]:
            """`token_ids_0` (and `token_ids_1`) framed by the post-processor's special tokens (BOS/EOS, CLS/SEP):
            what it adds around a one-token probe, around the given ids."""
            probe = self._tokenizer.encode("a", add_special_tokens=False)
            second = self._tokenizer.encode("a", add_special_tokens=False) if token_ids_1 is not None else None
            framed = self._tokenizer.post_process(probe, second, add_special_tokens=True)
            marks = framed.sequence_ids
            out: list[int] = []
            done = set()
            for token, seq in zip(framed.ids, marks):
                if seq is None:
                    out.append(token)
                elif seq not in done:
                    out.extend(token_ids_0 if seq == 0 else token_ids_1)
                    done.add(seq)
            return out

    # PaddleNLP writes the class's name into a saved tokenizer_config.json and reads a "...Fast" class from
    # tokenizer.json (not through a slow class): its own base's name, which its AutoTokenizer also loads.
    TokenizerJson.__name__ = "PretrainedTokenizerFast"
    return TokenizerJson


def _config(directory: str) -> dict[str, Any]:
    path = os.path.join(directory, "tokenizer_config.json")
    if not os.path.isfile(path):
        return {}
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def tokenizer_kind(directory: str) -> str:
    """How `read_tokenizer` loads the tokenizer of `directory` (what the dry run prints): "tokenizer.json (...)", or
    the PaddleNLP class tokenizer_config.json names."""
    named = _config(directory).get("tokenizer_class") or "no tokenizer_class"
    if os.path.isfile(os.path.join(directory, TOKENIZER_FILE)):
        return f"tokenizer.json read as it is; tokenizer_config.json names {named}"
    return named


def chat_template_text(directory: str) -> str | None:
    """The Jinja chat template of `directory`'s chat_template.jinja (transformers 5's place for it), or None."""
    path = os.path.join(directory, CHAT_TEMPLATE_FILE)
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        return f.read()


def read_tokenizer(directory: str) -> Any:
    """The tokenizer of local directory `directory`: tokenizer.json through the `tokenizers` library (PaddleNLP's
    PretrainedTokenizerFast) when there is one, else PaddleNLP's AutoTokenizer; chat_template.jinja's template
    when tokenizer_config.json has none."""
    if os.path.isfile(os.path.join(directory, TOKENIZER_FILE)):
        config = _config(directory)
        kwargs: dict[str, Any] = {}
        extra = config.get("extra_special_tokens")  # transformers 5's name for additional_special_tokens
        if extra and not config.get("additional_special_tokens"):
            kwargs["additional_special_tokens"] = list(extra.values() if isinstance(extra, dict) else extra)
        tokenizer = _paddlenlp_fast().from_pretrained(directory, **kwargs)
    else:
        from paddlenlp.transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(directory)
    template = chat_template_text(directory)
    if template and not getattr(tokenizer, "chat_template", None):
        tokenizer.init_chat_template(template)  # the text: a path would be read as PaddleNLP's JSON template
        # PaddleNLP's save_pretrained writes init_kwargs to tokenizer_config.json, and not a compiled template:
        # without this a checkpoint's tokenizer would come back without its chat template
        tokenizer.init_kwargs["chat_template"] = template
    return tokenizer
