"""recipes.tiny.build_char_tokenizer at any vocabulary size (what tools/bench/bench.py builds): exactly V entries, every
id decodes to text, prompts encode one character per token, and small vocabularies keep their files byte for byte."""
import hashlib
import json
import time

import pytest

from paddle_grpo.recipes.tiny import CHAR_ALPHABET, SPECIAL_TOKENS, build_char_tokenizer, synthetic_words

# sha256 of vocab.json as built before vocabularies above 131 were possible (the quickstart and tests use these ids).
PINNED = {64: "7250b24ce9dbf61a5b38a6627c658855acc6d712b9819bb1e83b5ac7111c8500",
          128: "7873800d355c02dc793fd747879ec097fd0a9678132a9acaef69dc49f8411ff5"}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """V -> (tokenizer, directory, build seconds), and the same directory reloaded as the trainer loads it."""
    from paddle_grpo.policy import load_tokenizer

    out = {}
    for V in (4, 64, 128, 131, 132, 1000, 151936):
        path = tmp_path_factory.mktemp(f"char_{V}")
        t0 = time.perf_counter()
        tok = build_char_tokenizer(str(path), V)
        out[V] = (tok, path, time.perf_counter() - t0, load_tokenizer(str(path)))
    return out


@pytest.mark.parametrize("V", [4, 64, 128, 131, 132, 1000, 151936])
def test_exactly_v_entries_each_decoding_to_text(built, V):
    tok, _, _, loaded = built[V]
    assert len(tok) == len(loaded) == V
    texts = loaded.batch_decode([[i] for i in range(V)], skip_special_tokens=False,
                                clean_up_tokenization_spaces=False)
    assert all(texts), [i for i, t in enumerate(texts) if not t][:10]
    assert len(set(texts)) == V  # no two ids spell the same text
    assert texts[:3] == SPECIAL_TOKENS
    n_chars = min(V - 3, len(CHAR_ALPHABET))
    assert "".join(texts[3:3 + n_chars]) == CHAR_ALPHABET[:n_chars]
    assert texts[3 + n_chars:] == synthetic_words(V - 3 - n_chars)


@pytest.mark.parametrize("V", [64, 128, 1000, 151936])
def test_prompts_encode_one_token_per_character(built, V):
    tok, _, _, loaded = built[V]
    usable = CHAR_ALPHABET[:V - 3]
    # Letters that would spell a synthetic word ("ab", "zz", "aaa") must still be single characters.
    for prompt in ("abcdefghij0123456789", "aa ab zz aaa hpoq", usable[:64], "".join(reversed(usable))):
        prompt = "".join(c for c in prompt if c in usable)
        ids = loaded(prompt, add_special_tokens=False)["input_ids"]
        assert len(ids) == len(prompt), prompt
        assert ids == [3 + usable.index(c) for c in prompt]
        assert loaded.decode(ids, clean_up_tokenization_spaces=False) == prompt


def test_small_vocabularies_unchanged(built):
    for V, digest in PINNED.items():
        data = (built[V][1] / "vocab.json").read_bytes()
        assert hashlib.sha256(data).hexdigest() == digest, V
        vocab = json.loads(data)
        assert len(vocab) == V and not any(len(t) > 1 for t in vocab if t not in SPECIAL_TOKENS)


def test_real_vocabulary_builds_in_seconds(built):
    assert built[151936][2] < 10


def test_synthetic_words_and_bad_size(tmp_path):
    assert synthetic_words(3) == ["aa", "ab", "ac"]
    words = synthetic_words(676 + 2)
    assert words[675] == "zz" and words[676:] == ["aaa", "aab"] and len(set(words)) == len(words)
    with pytest.raises(ValueError, match="vocab_size"):
        build_char_tokenizer(str(tmp_path), 3)
