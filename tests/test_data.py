"""Tests of paddle_grpo.data: reading src/tgt files, chat templates, tokenization, collation, the prompt sampler."""
import json

import numpy as np
import pandas as pd
import pytest

from paddle_grpo.data import (
    DataError,
    PromptSampler,
    apply_chat_template,
    collate_prompts,
    encode_prompts,
    format_qwen_chat,
    read_jsonl,
    shuffle_split,
    special_token_ids,
    tokenize_prompts,
    write_jsonl,
)
from paddle_grpo.recipes.kk_puzzles import build_kk_prompt, format_kk_solution

# Seed 003's example record, verbatim: the reference for the K&K prompt format.
SEED_003_SRC = (
    "<|im_start|>system\nYou are a helpful assistant. The assistant first thinks about the reasoning process in the "
    "mind and then provides the user with the answer. The reasoning process and answer are enclosed within <think> "
    "</think> and<answer> </answer> tags, respectively, i.e., <think> reasoning process here </think><answer> answer "
    "here </answer>.  Now the user asks you to solve a logical reasoning problem. After thinking, when you finally "
    "reach a conclusion, clearly state the identity of each character within <answer> </answer> tags. i.e., <answer> "
    "(1) Zoey is a knight\n(2) ... </answer>.\n<|im_end|>\n<|im_start|>user\nA very special island is inhabited only "
    "by knights and knaves. Knights always tell the truth, and knaves always lie. You meet 3 inhabitants: Michael, "
    "Zoey, and Ethan. Michael was heard saying, \"Ethan is a knight if and only if Michael is a knight\". \"Zoey is a "
    "knight or Ethan is a knight,\" Zoey mentioned. Ethan asserted: \"Michael is a knave if and only if Zoey is a "
    "knave\". So who is a knight and who is a knave?\n<|im_end|>\n<|im_start|>assistant\n<think>"
)
SEED_003_TGT = "(1) Michael is a knight\n(2) Zoey is a knight\n(3) Ethan is a knight"


def write_lines(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


# ------------------------------------------------------------------------------------------------ read_jsonl

def test_read_string_and_list_fields_keep_other_columns(tmp_path):
    f = write_lines(tmp_path / "d.jsonl", [
        json.dumps({"src": "p1", "tgt": "t1", "level": 3}),
        json.dumps({"src": ["p2"], "tgt": ["t2"], "meta": {"a": [1, 2]}}),
    ])
    assert read_jsonl(str(f)) == [
        {"src": "p1", "tgt": "t1", "level": 3},
        {"src": "p2", "tgt": "t2", "meta": {"a": [1, 2]}},
    ]


def test_read_seed_003_example(tmp_path):
    f = write_lines(tmp_path / "kk.jsonl", [json.dumps({"src": [SEED_003_SRC], "tgt": [SEED_003_TGT]})])
    assert read_jsonl(f) == [{"src": SEED_003_SRC, "tgt": SEED_003_TGT}]


def test_read_custom_keys_and_optional_response(tmp_path):
    f = write_lines(tmp_path / "d.jsonl", [
        json.dumps({"question": "q1", "answer": "a1", "id": 7}),
        json.dumps({"question": ["q2"]}),
    ])
    with pytest.raises(DataError, match=r"d\.jsonl:2: missing key 'answer'"):
        read_jsonl(f, prompt_key="question", response_key="answer")
    assert read_jsonl(f, prompt_key="question", response_key="answer", require_response=False) == [
        {"src": "q1", "tgt": "a1", "id": 7},
        {"src": "q2", "tgt": None},
    ]


def test_blank_lines_are_skipped(tmp_path):
    f = tmp_path / "d.jsonl"
    f.write_text('\n{"src": "a", "tgt": "b"}\n   \n\n{"src": "c", "tgt": "d"}\n\n', encoding="utf-8")
    assert [r["src"] for r in read_jsonl(f)] == ["a", "c"]


BAD_LINES = [
    ("not json", '{"src": "a", "tgt": ', "invalid JSON", "'src'"),
    ("array", '["a", "b"]', "expected a JSON object", "'src'"),
    ("missing src", '{"tgt": "b"}', "missing key 'src'", "'src'"),
    ("null src", '{"src": null, "tgt": "b"}', "missing key 'src'", "'src'"),
    ("missing tgt", '{"src": "a"}', "missing key 'tgt'", "'tgt'"),
    ("two-element src", '{"src": ["a", "b"], "tgt": "c"}', "list of 2 elements", "'src'"),
    ("empty list tgt", '{"src": "a", "tgt": []}', "list of 0 elements", "'tgt'"),
    ("int src", '{"src": 5, "tgt": "c"}', "got int", "'src'"),
    ("dict tgt", '{"src": "a", "tgt": {"x": 1}}', "got dict", "'tgt'"),
    ("list of int", '{"src": [5], "tgt": "c"}', "got int", "'src'"),
    ("empty prompt", '{"src": "  ", "tgt": "c"}', "empty prompt", "'src'"),
]


@pytest.mark.parametrize("kind,line,what,key", BAD_LINES, ids=[b[0] for b in BAD_LINES])
def test_bad_line_names_file_line_and_key(tmp_path, kind, line, what, key):
    f = tmp_path / "bad.jsonl"
    # line 1 good, line 2 blank, line 3 bad: the number counts blank lines too
    f.write_text('{"src": "ok", "tgt": "ok"}\n\n' + line + "\n", encoding="utf-8")
    with pytest.raises(DataError) as err:
        read_jsonl(f)
    msg = str(err.value)
    assert msg.startswith(f"{f}:3: "), msg
    assert what in msg and key in msg, msg
    assert isinstance(err.value, ValueError)


def test_bad_utf8_names_line(tmp_path):
    f = tmp_path / "bad.jsonl"
    f.write_bytes(b'{"src": "ok", "tgt": "ok"}\n{"src": "\xff", "tgt": "x"}\n')
    with pytest.raises(DataError, match=r"bad\.jsonl:2: not UTF-8"):
        read_jsonl(f)


@pytest.mark.parametrize("content", ["", "\n\n  \n"])
def test_empty_file_is_an_error(tmp_path, content):
    f = tmp_path / "empty.jsonl"
    f.write_text(content, encoding="utf-8")
    with pytest.raises(DataError, match=r"empty\.jsonl: no records"):
        read_jsonl(f)


def test_missing_file_and_shadowed_column(tmp_path):
    with pytest.raises(DataError, match=r"nope\.jsonl: dataset file not found"):
        read_jsonl(tmp_path / "nope.jsonl")
    f = write_lines(tmp_path / "d.jsonl", [json.dumps({"question": "q", "tgt": "a", "src": "other"})])
    with pytest.raises(DataError, match=r"d\.jsonl:1: key 'src' is present besides prompt_key='question'"):
        read_jsonl(f, prompt_key="question")


def test_parquet_input(tmp_path):
    f = tmp_path / "d.parquet"
    pd.DataFrame({
        "src": ["p1", "p2"],
        "tgt": [["t1"], ["t2"]],
        "solution": [[True, False], [False, False]],
        "n": [1, 2],
    }).to_parquet(f)
    records = read_jsonl(f)
    assert records == [
        {"src": "p1", "tgt": "t1", "solution": [True, False], "n": 1},
        {"src": "p2", "tgt": "t2", "solution": [False, False], "n": 2},
    ]
    # numpy values are converted to plain Python, so records can be sent as JSON
    assert type(records[0]["n"]) is int and type(records[0]["solution"][0]) is bool
    json.dumps(records)


def test_parquet_bad_row_names_row_and_key(tmp_path):
    f = tmp_path / "d.parquet"
    pd.DataFrame({"src": [["a"], ["b", "c"]], "tgt": ["x", "y"]}).to_parquet(f)
    with pytest.raises(DataError, match=r"d\.parquet: row 2: key 'src': .*list of 2 elements"):
        read_jsonl(f)
    g = tmp_path / "g.parquet"
    pd.DataFrame({"src": ["a", "b"], "tgt": ["x", None]}).to_parquet(g)
    with pytest.raises(DataError, match=r"g\.parquet: row 2: missing key 'tgt'"):
        read_jsonl(g)


def test_several_files(tmp_path):
    a = write_lines(tmp_path / "a.jsonl", [json.dumps({"src": "a1", "tgt": "x"}),
                                           json.dumps({"src": "a2", "tgt": "y"})])
    b = tmp_path / "b.parquet"
    pd.DataFrame({"src": ["b1"], "tgt": ["z"]}).to_parquet(b)
    expected = ["a1", "a2", "b1"]
    assert [r["src"] for r in read_jsonl(f"{a}, {b}")] == expected
    assert [r["src"] for r in read_jsonl([a, b])] == expected
    assert [r["src"] for r in read_jsonl(f"{b},{a}")] == ["b1", "a1", "a2"]
    bad = write_lines(tmp_path / "c.jsonl", ['{"src": "c"}'])
    with pytest.raises(DataError, match=r"c\.jsonl:1: missing key 'tgt'"):
        read_jsonl(f"{a},{bad}")


def test_write_then_read_round_trip(tmp_path):
    records = [{"src": ["é ü"], "tgt": ["1"], "solution": [True]}]
    write_jsonl(tmp_path / "sub" / "o.jsonl", records)
    assert (tmp_path / "sub" / "o.jsonl").read_text(encoding="utf-8").count("\n") == 1
    assert read_jsonl(tmp_path / "sub" / "o.jsonl") == [{"src": "é ü", "tgt": "1", "solution": [True]}]


def test_shuffle_split_is_seeded_deduplicated_and_disjoint():
    records = [{"src": [f"p{i % 40}"], "tgt": ["t"]} for i in range(50)]  # p0..p9 appear twice
    train, ev = shuffle_split(records, seed=3, limit=30, eval_fraction=0.2)
    assert len(train) == 24 and len(ev) == 6
    srcs = [r["src"][0] for r in train + ev]
    assert len(set(srcs)) == 30
    assert shuffle_split(records, seed=3, limit=30, eval_fraction=0.2) == (train, ev)
    assert shuffle_split(records, seed=4, limit=30, eval_fraction=0.2) != (train, ev)
    full, none = shuffle_split(records, seed=0)
    assert none == [] and sorted(r["src"][0] for r in full) == sorted(f"p{i}" for i in range(40))


# ------------------------------------------------------------------------------------------------ chat templates

QWEN_WRAPPED = ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
                "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n")


def test_templated_prompt_passes_through_in_every_mode():
    for mode in ("auto", "none", "qwen"):
        assert apply_chat_template(SEED_003_SRC, mode=mode) == SEED_003_SRC
        assert apply_chat_template(SEED_003_SRC, system="ignored", mode=mode) == SEED_003_SRC


def test_raw_prompt_is_wrapped_in_qwen_format():
    assert apply_chat_template("What is 2+2?") == QWEN_WRAPPED
    assert apply_chat_template("What is 2+2?", mode="qwen") == QWEN_WRAPPED
    assert apply_chat_template("What is 2+2?", system="Be brief.") == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n")
    assert apply_chat_template("What is 2+2?", system="") == (
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n")
    assert apply_chat_template("What is 2+2?", mode="none") == "What is 2+2?"
    with pytest.raises(ValueError, match="unknown mode 'chatml'.*auto, none, qwen"):
        apply_chat_template("x", mode="chatml")


def test_kk_prompt_and_answer_match_seed_003():
    quiz = SEED_003_SRC.split("<|im_start|>user\n")[1].split("\n<|im_end|>")[0]
    assert build_kk_prompt(quiz) == SEED_003_SRC
    assert format_kk_solution(["Michael", "Zoey", "Ethan"], [True, True, True]) == SEED_003_TGT
    assert format_kk_solution(["A", "B"], [False, True]) == "(1) A is a knave\n(2) B is a knight"
    assert format_qwen_chat("u", system=None, assistant_prefix="<think>") == (
        "<|im_start|>user\nu<|im_end|>\n<|im_start|>assistant\n<think>")


# ------------------------------------------------------------------------------------------------ tokenizer

@pytest.fixture(scope="module")
def qwen_tokenizer(tmp_path_factory):
    """A real paddlenlp Qwen2Tokenizer with a byte-level vocabulary (byte b has id b) and no merges, plus the three
    Qwen special tokens at 256..258 (and a plain "<tool>" entry at 259), loaded the way checkpoints are
    (from_pretrained)."""
    transformers = pytest.importorskip("paddlenlp.transformers")
    from paddlenlp.transformers.qwen2.tokenizer import bytes_to_unicode

    d = tmp_path_factory.mktemp("tok")
    vocab = {ch: b for b, ch in bytes_to_unicode().items()}
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    for i, t in enumerate(specials):
        vocab[t] = 256 + i
    vocab["<tool>"] = 259  # in the vocabulary but not special until registered
    (d / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    (d / "merges.txt").write_text("#version: 0.2\n", encoding="utf-8")
    added = {str(256 + i): {"content": t, "special": True, "lstrip": False, "rstrip": False, "normalized": False,
                            "single_word": False} for i, t in enumerate(specials)}
    (d / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "Qwen2Tokenizer", "added_tokens_decoder": added, "additional_special_tokens": specials[1:],
        "bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "unk_token": None,
        "errors": "replace", "model_max_length": 32768}), encoding="utf-8")
    tok = transformers.AutoTokenizer.from_pretrained(str(d))
    return tok, d


def byte_ids(text):
    return list(text.encode("utf-8"))


def test_tokenize_prompts_with_paddlenlp_tokenizer(qwen_tokenizer):
    tok, _ = qwen_tokenizer
    ids = tokenize_prompts(tok, ["<|im_start|>user\nhé<|im_end|>\n<|im_start|>assistant\n", "a b", "\n<|im_end|>"])
    assert ids == [[257] + byte_ids("user\nhé") + [258, 10, 257] + byte_ids("assistant\n"), byte_ids("a b"),
                   [10, 258]]
    assert special_token_ids(tok) == {"<|endoftext|>": 256, "<|im_start|>": 257, "<|im_end|>": 258}


def test_tokenized_kk_prompt_decodes_back_exactly(qwen_tokenizer):
    tok, _ = qwen_tokenizer
    ids = tokenize_prompts(tok, [SEED_003_SRC])[0]
    assert ids.count(257) == 3 and ids.count(258) == 2
    assert len(ids) == len(SEED_003_SRC.encode("utf-8")) - 3 * len("<|im_start|>") - 2 * len("<|im_end|>") + 5
    assert tok.decode(ids, clean_up_tokenization_spaces=False) == SEED_003_SRC


def test_special_token_ids_follow_added_tokens(qwen_tokenizer):
    from paddlenlp.transformers import AutoTokenizer

    _, d = qwen_tokenizer
    tok = AutoTokenizer.from_pretrained(str(d))
    assert tokenize_prompts(tok, ["a<tool>"]) == [byte_ids("a<tool>")]
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>", "<tool>"]})
    assert special_token_ids(tok)["<tool>"] == 259
    assert tokenize_prompts(tok, ["a<tool>"]) == [[97, 259]]


def test_whole_text_tokenization_loses_whitespace_next_to_special_tokens(qwen_tokenizer):
    """Why tokenize_prompts cuts at special tokens: paddlenlp 3.0.0b4 on the whole text drops the "\n" before
    <|im_start|> (registered as a plain-string special token; <|im_end|>, the eos token, is an AddedToken without
    stripping). If this starts failing, paddlenlp changed and the workaround may go."""
    tok, _ = qwen_tokenizer
    text = "x\n<|im_end|>\n<|im_start|>y"
    assert tokenize_prompts(tok, [text]) == [[120, 10, 258, 10, 257, 121]]
    assert tokenize_prompts(tok, [text], exact_special_tokens=False) == [[120, 10, 258, 257, 121]]


def test_tokenize_prompts_with_a_directly_constructed_tokenizer(qwen_tokenizer):
    from paddlenlp.transformers import Qwen2Tokenizer

    _, d = qwen_tokenizer
    # Constructed directly, paddlenlp 3.0.0b4 does not treat these as special: "<|im_start|>" becomes 12 byte tokens
    # when the whole text is tokenized; cutting at the vocabulary's markers still gives their single ids.
    tok = Qwen2Tokenizer(str(d / "vocab.json"), str(d / "merges.txt"), unk_token="<|endoftext|>", bos_token=None,
                         eos_token="<|endoftext|>", pad_token="<|endoftext|>",
                         additional_special_tokens=["<|im_start|>", "<|im_end|>"])
    assert tokenize_prompts(tok, ["<|im_start|>x"], exact_special_tokens=False) == [byte_ids("<|im_start|>x")]
    assert tokenize_prompts(tok, ["<|im_start|>x\n<|im_end|>"]) == [[257, 120, 10, 258]]


def test_encode_prompts_templates_tokenizes_and_pads(qwen_tokenizer):
    tok, _ = qwen_tokenizer
    ids, mask, n_trunc = encode_prompts(["hi", "<|im_start|>x"], tok, max_prompt_len=None, chat_template="qwen",
                                        system="")
    first = [257] + byte_ids("user\nhi") + [258] + byte_ids("\n") + [257] + byte_ids("assistant\n")
    second = [257] + byte_ids("x")
    width = len(first)
    assert ids.tolist() == [first, [256] * (width - 2) + second]
    assert mask.tolist() == [[1] * width, [0] * (width - 2) + [1, 1]]
    assert n_trunc == 0
    _, _, n_trunc = encode_prompts(["hi", "<|im_start|>x"], tok, max_prompt_len=4, chat_template="none")
    assert n_trunc == 0
    ids, _, n_trunc = encode_prompts(["hello", "<|im_start|>x"], tok, max_prompt_len=4, chat_template="none")
    assert n_trunc == 1 and ids.tolist() == [byte_ids("ello"), [256, 256, 257, byte_ids("x")[0]]]


def test_auto_mode_uses_the_tokenizers_jinja_template(qwen_tokenizer):
    tok, d = qwen_tokenizer
    from paddlenlp.transformers import AutoTokenizer

    tok2 = AutoTokenizer.from_pretrained(str(d))
    assert tok2.chat_template is None
    assert apply_chat_template("What is 2+2?", tokenizer=tok2) == QWEN_WRAPPED  # no template: built-in Qwen
    tok2.init_chat_template("{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{% endfor %}"
                            "{% if add_generation_prompt %}[assistant]{% endif %}")
    assert apply_chat_template("U", tokenizer=tok2) == "[user]U[assistant]"
    assert apply_chat_template("U", tokenizer=tok2, system="S") == "[system]S[user]U[assistant]"
    assert apply_chat_template("What is 2+2?", tokenizer=tok2, mode="qwen") == QWEN_WRAPPED
    assert apply_chat_template(SEED_003_SRC, tokenizer=tok2) == SEED_003_SRC


# ------------------------------------------------------------------------------------------------ collation

def test_collate_left_pads():
    ids, mask = collate_prompts([[5, 6, 7], [8, 9], [4]], pad_token_id=0, max_prompt_len=None)
    assert ids.dtype == np.int64 and mask.dtype == np.int64
    np.testing.assert_array_equal(ids, [[5, 6, 7], [0, 8, 9], [0, 0, 4]])
    np.testing.assert_array_equal(mask, [[1, 1, 1], [0, 1, 1], [0, 0, 1]])


def test_collate_left_truncates_and_counts():
    ids, mask, n = collate_prompts([[1, 2, 3, 4, 5], [6, 7], [8, 9, 10, 11]], pad_token_id=99, max_prompt_len=3,
                                   return_num_truncated=True)
    np.testing.assert_array_equal(ids, [[3, 4, 5], [99, 6, 7], [9, 10, 11]])
    np.testing.assert_array_equal(mask, [[1, 1, 1], [0, 1, 1], [1, 1, 1]])
    assert n == 2
    # width is the longest prompt after truncation, not max_prompt_len
    ids, mask, n = collate_prompts([[1], [2, 3]], pad_token_id=0, max_prompt_len=8, return_num_truncated=True)
    np.testing.assert_array_equal(ids, [[0, 1], [2, 3]])
    assert n == 0


def test_collate_mask_is_positional_even_when_pad_id_occurs_in_prompts():
    ids, mask = collate_prompts([[2, 2], [7, 2, 2, 2]], pad_token_id=2, max_prompt_len=None)
    np.testing.assert_array_equal(ids, [[2, 2, 2, 2], [7, 2, 2, 2]])
    np.testing.assert_array_equal(mask, [[0, 0, 1, 1], [1, 1, 1, 1]])


def test_collate_matches_a_loop_reference_on_random_batches():
    rng = np.random.default_rng(0)
    for _ in range(50):
        seqs = [list(rng.integers(1, 1000, size=rng.integers(1, 20))) for _ in range(rng.integers(1, 8))]
        limit = int(rng.integers(1, 25))
        ids, mask, n = collate_prompts(seqs, pad_token_id=0, max_prompt_len=limit, return_num_truncated=True)
        kept = [s[max(0, len(s) - limit):] for s in seqs]
        width = max(len(k) for k in kept)
        for row, k in enumerate(kept):
            assert ids[row].tolist() == [0] * (width - len(k)) + k
            assert mask[row].tolist() == [0] * (width - len(k)) + [1] * len(k)
        assert n == sum(len(s) > limit for s in seqs)


def test_collate_errors():
    with pytest.raises(ValueError, match="empty batch"):
        collate_prompts([], 0, 4)
    with pytest.raises(ValueError, match="prompt 1 of the batch has no tokens"):
        collate_prompts([[1], []], 0, 4)
    with pytest.raises(ValueError, match="max_prompt_len must be positive"):
        collate_prompts([[1]], 0, 0)


# ------------------------------------------------------------------------------------------------ sampler

def take(sampler, n):
    return [sampler.next_batch() for _ in range(n)]


def test_sampler_without_shuffle_and_drop_last():
    s = PromptSampler(10, 4, shuffle=False, drop_last=True)
    assert len(s) == 2
    assert take(s, 5) == [[0, 1, 2, 3], [4, 5, 6, 7], [0, 1, 2, 3], [4, 5, 6, 7], [0, 1, 2, 3]]
    assert s.state_dict()["epoch"] == 2 and s.state_dict()["position"] == 4
    s = PromptSampler(10, 4, shuffle=False, drop_last=False)
    assert len(s) == 3
    assert take(s, 4) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9], [0, 1, 2, 3]]
    with pytest.raises(ValueError, match="never yield a batch"):
        PromptSampler(3, 4, drop_last=True)


def test_sampler_shuffles_deterministically_per_epoch():
    a = PromptSampler(23, 5, shuffle=True, seed=7, drop_last=False)
    b = PromptSampler(23, 5, shuffle=True, seed=7, drop_last=False)
    epochs_a = [list(a) for _ in range(3)]
    epochs_b = [list(b) for _ in range(3)]
    assert epochs_a == epochs_b
    for batches in epochs_a:
        assert [len(x) for x in batches] == [5, 5, 5, 5, 3]
        assert sorted(i for x in batches for i in x) == list(range(23))
    assert epochs_a[0] != epochs_a[1] != epochs_a[2]
    c = PromptSampler(23, 5, shuffle=True, seed=8, drop_last=False)
    assert list(c) != epochs_a[0]
    # drop_last: every batch full, each epoch its own order, the dropped tail differs from epoch to epoch
    d = PromptSampler(23, 5, shuffle=True, seed=7, drop_last=True)
    dropped = []
    for _ in range(3):
        batches = list(d)
        assert [len(x) for x in batches] == [5, 5, 5, 5]
        dropped.append(set(range(23)) - {i for x in batches for i in x})
    assert all(len(x) == 3 for x in dropped) and dropped[0] != dropped[1]


def test_sampler_state_round_trip_resumes_identically():
    ref = PromptSampler(17, 4, shuffle=True, seed=3, drop_last=False)
    expected = take(ref, 20)
    for stop in (0, 1, 4, 5, 9, 13):
        s = PromptSampler(17, 4, shuffle=True, seed=3, drop_last=False)
        head = take(s, stop)
        state = json.loads(json.dumps(s.state_dict()))  # checkpoints store it as JSON
        resumed = PromptSampler(17, 4, shuffle=True, seed=3, drop_last=False)
        resumed.set_state_dict(state)
        assert head + take(resumed, 20 - stop) == expected


def test_sampler_iteration_resumes_mid_epoch():
    s = PromptSampler(12, 3, shuffle=True, seed=1)
    full = list(PromptSampler(12, 3, shuffle=True, seed=1))
    first = s.next_batch()
    state = s.state_dict()
    assert state["epoch"] == 0 and state["position"] == 3
    r = PromptSampler(12, 3, shuffle=True, seed=1)
    r.set_state_dict(state)
    assert [first] + list(r) == full
    assert r.state_dict()["epoch"] == 1 and r.state_dict()["position"] == 0


def test_sampler_refuses_a_state_from_other_data():
    s = PromptSampler(10, 2, seed=1)
    for key, value in (("num_records", 11), ("seed", 2), ("shuffle", False)):
        state = dict(s.state_dict(), **{key: value})
        with pytest.raises(ValueError, match=key):
            PromptSampler(10, 2, seed=1).set_state_dict(state)
