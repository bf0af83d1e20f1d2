"""tools/eval/eval_gsm8k.py: lm-eval's gsm8k filters, normalisation, stderr, table layout, and end-to-end runs."""
import json
import math
import re

import numpy as np
import pytest

INVALID = "[invalid]"


@pytest.fixture(scope="module")
def ev(load_tool):
    return load_tool("eval/eval_gsm8k")


# ---------------------------------------------------------------------------------------------- extraction

@pytest.mark.parametrize("completion,strict,flexible", [
    ("48/2 = 24 clips in May.\n48+24 = 72 clips in total.\n#### 72", "72", "72"),
    ("The answer is $1,080.", INVALID, "$1,080."),                 # $ , . are part of lm-eval's flexible class
    ("#### 18.0\nSo 18 apples, not 20.", "18.0", "20."),            # flexible takes the last match
    ("####42", INVALID, "42"),                                       # strict needs "#### " with the space
    ("#### -3 and then #### 5", "-3", "5"),                          # strict takes the first match
    ("#### $5", INVALID, "$5"),                                      # strict has no $ in its class
    ("Answer: 7", INVALID, "7"),                                     # one digit: the second alternative
    ("12, 13, 14", INVALID, "14"),
    ("It is 4. I think...", INVALID, "..."),                         # lm-eval quirk: punctuation runs match
    ("no numbers here", INVALID, INVALID),
    ("", INVALID, INVALID),
])
def test_extraction_matches_lm_eval_filters(ev, completion, strict, flexible):
    assert ev.extract_strict(completion) == strict
    assert ev.extract_flexible(completion) == flexible


@pytest.mark.parametrize("extracted,gold,expected", [
    ("72", "72", True),
    ("$1,080.", "1080", True),        # commas, $ and one trailing dot dropped
    ("18.0", "18", True),             # both numbers: compared as numbers (lm-eval would say False)
    ("18.", "18", True),
    ("018", "18", True),
    ("18..", "18", True),             # one trailing dot dropped, then "18." is the number 18
    ("18...", "18", False),           # "18.." is not a number
    ("18.5", "18", False),
    ("-3", "3", False),
    ("1,2", "12", True),              # lm-eval drops every comma, wherever it is
    ("72", "Natalia sold 72 clips.\n#### 72", True),   # a full GSM8K answer as gold: text up to "#### " dropped
    ("...", "0", False),
    ("1/2", "0.5", False),            # no math-verify here: a fraction is not a decimal
    (INVALID, INVALID, False),        # "no answer" is never correct, whatever the gold says
])
def test_answers_match(ev, extracted, gold, expected):
    assert ev.answers_match(extracted, gold) is expected


def test_normalise(ev):
    assert ev.normalise("$1,080.") == "1080"
    assert ev.normalise("Step 1\n#### 1,234.") == "1234"
    assert ev.normalise(" ABC ") == "abc"


def test_score_one_completion(ev):
    assert ev.score("so 3 + 4 = 7\n#### 7.", "7") == {"flexible-extract": ("7.", 1), "strict-match": ("7.", 1)}
    assert ev.score("#### 7\nbut wait, 8", "7") == {"flexible-extract": ("8", 0), "strict-match": ("7", 1)}


# ------------------------------------------------------------------------------------------ stderr and table

def test_mean_stderr_hand_computed(ev):
    # mean 0.6; sample variance (3 * 0.4^2 + 2 * 0.6^2) / 4 = 0.3; stderr sqrt(0.3 / 5) = sqrt(0.06)
    # float64: a sum of 5 values and a square root, a few u64 = 1.1e-16 roundings of values < 1
    assert ev.mean_stderr([1, 0, 0, 1, 1]) == pytest.approx(0.24494897427831780, abs=1e-15)
    assert ev.mean_stderr([1, 1]) == 0.0
    assert ev.mean_stderr([1]) is None


@pytest.mark.parametrize("correct,value,stderr", [
    # the lm_eval tables of seed 002 (GSM8K test set, n = 1319): the formula reproduces their Stderr column
    (569, "0.4314", "0.0136"), (1, "0.0008", "0.0008"), (676, "0.5125", "0.0138"), (11, "0.0083", "0.0025"),
])
def test_stderr_reproduces_lm_eval_tables(ev, correct, value, stderr):
    values = [1] * correct + [0] * (1319 - correct)
    assert f"{sum(values) / 1319:.4f}" == value
    assert f"{ev.mean_stderr(values):.4f}" == stderr
    p = correct / 1319
    # float64 sums of 1319 zeros and ones are exact; a few roundings after that (u64 = 1.1e-16)
    assert ev.mean_stderr(values) == pytest.approx(math.sqrt(p * (1 - p) / 1318), rel=1e-12)


def test_table_layout(ev):
    table = ev.format_table({"flexible-extract": (569 / 1319, 0.01364), "strict-match": (1 / 1319, None)})
    assert table == (
        "|Tasks|Version|     Filter     |n-shot|  Metric   |   |Value |   |Stderr|\n"
        "|-----|------:|----------------|-----:|-----------|---|-----:|---|-----:|\n"
        "|gsm8k|      1|flexible-extract|     0|exact_match|↑  |0.4314|±  |0.0136|\n"
        "|     |       |strict-match    |     0|exact_match|↑  |0.0008|±  |   N/A|")


# ----------------------------------------------------------------------------------------------- end to end

PROBLEMS = [  # raw GSM8K rows and src/tgt rows may share a file
    {"question": "Tom has 3 apples and buys 4 more. How many apples does he have?", "answer": "3+4=7\n#### 7"},
    {"question": "A box holds 12 eggs. How many eggs are in 5 boxes?", "answer": "12*5=60\n#### 60"},
    {"src": "What is 12 + 35?", "tgt": "47"},
    {"question": "Sara had 1,200 dollars and spent 200. How much is left?", "answer": "#### 1,000"},
    {"src": ["<|im_start|>user\nWhat is 9 - 10?<|im_end|>\n<|im_start|>assistant\n"], "tgt": ["-1"]},
]
TABLE_ROW = re.compile(r"^\|(gsm8k|     )\|( {6}1| {7})\|(flexible-extract|strict-match    )\|     0\|"
                       r"exact_match\|↑  \|(\d\.\d{4})\|±  \|(\d\.\d{4})\|$")


def write_lines(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def run(ev, capsys, model, data, out, *extra):
    assert ev.main(["--model", model, "--data", str(data), "--output", str(out), "--max-new-tokens", "24",
                    "--batch-size", "2", *extra]) == 0
    stdout = capsys.readouterr().out.splitlines()
    preds = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    return stdout, preds


def parse_table(ev, stdout, n):
    """{filter: (value, stderr)} from the printed table, after checking its layout and the n on the header line."""
    assert f", n: {n}," in stdout[0]
    assert stdout[1:3] == ["|Tasks|Version|     Filter     |n-shot|  Metric   |   |Value |   |Stderr|",
                           "|-----|------:|----------------|-----:|-----------|---|-----:|---|-----:|"]
    rows = [TABLE_ROW.match(line) for line in stdout[3:]]
    assert len(rows) == 2 and all(rows), stdout
    assert [r.group(1) for r in rows] == ["gsm8k", "     "]
    return {r.group(3).strip(): (r.group(4), r.group(5)) for r in rows}


def recompute(preds):
    """The table's numbers recomputed from the predictions file with numpy (sample std, ddof=1)."""
    out = {}
    for name in ("flexible-extract", "strict-match"):
        x = np.array([p[name]["exact_match"] for p in preds], dtype=float)
        out[name] = (f"{x.mean():.4f}", f"{x.std(ddof=1) / np.sqrt(len(x)):.4f}")
    return out


def test_end_to_end_handwritten_problems(ev, capsys, tiny_policy_dir, tmp_path):
    data = write_lines(tmp_path / "problems.jsonl", PROBLEMS)
    stdout, preds = run(ev, capsys, tiny_policy_dir, data, tmp_path / "pred.jsonl")
    assert [p["gold"] for p in preds] == ["7", "60", "47", "1000", "-1"]
    assert [p["id"] for p in preds] == [f"problems.jsonl:{i}" for i in range(1, 6)]
    assert preds[0]["prompt"].startswith("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>"
                                         "user\nTom has 3 apples")  # convert_gsm8k's training prompt
    for p in preds:
        assert 0 < p["num_tokens"] <= 24 and (not p["truncated"] or p["num_tokens"] == 24)
        for name in ("flexible-extract", "strict-match"):
            x = p[name]["extracted"]
            assert p[name]["exact_match"] == int(ev.answers_match(x, p["gold"]))
            assert x == INVALID or x in p["completion"]
    assert parse_table(ev, stdout, 5) == recompute(preds)

    # A random model rarely gets one right, so make the metric non-trivial: turn some golds into the answers the
    # first run extracted. Greedy decoding of unchanged prompts gives the same completions, so exactly those rows
    # (plus any that were already right) must now be counted correct.
    hits = [i for i, p in enumerate(preds) if p["flexible-extract"]["extracted"] != INVALID][:3]
    assert hits, "the tiny model produced no number at all; the second run would test nothing"
    rows = [{"src": p["prompt"], "tgt": p["flexible-extract"]["extracted"] if i in hits else p["gold"]}
            for i, p in enumerate(preds)]
    stdout2, preds2 = run(ev, capsys, tiny_policy_dir, write_lines(tmp_path / "again.jsonl", rows),
                          tmp_path / "pred2.jsonl")
    assert [p["completion"] for p in preds2] == [p["completion"] for p in preds]
    expected = [1 if i in hits else p["flexible-extract"]["exact_match"] for i, p in enumerate(preds)]
    assert [p["flexible-extract"]["exact_match"] for p in preds2] == expected
    table = parse_table(ev, stdout2, 5)
    assert table == recompute(preds2)
    assert table["flexible-extract"][0] == f"{sum(expected) / 5:.4f}" != "0.0000"


def test_completions_end_before_the_stop_token(ev, tiny_policy_dir, monkeypatch):
    from paddle_grpo.data import apply_chat_template, tokenize_prompts
    from paddle_grpo.policy import load_tokenizer
    from paddle_grpo.policy.causal import generate, load_causal_lm

    tok, model = load_tokenizer(tiny_policy_dir), load_causal_lm(tiny_policy_dir, trainable=False)
    assert ev.stop_token_ids(tok, model) == [tok.convert_tokens_to_ids("<|im_end|>")]  # the tiny model's EOS
    prompt = "What is 12 + 35?"
    ids = tokenize_prompts(tok, [apply_chat_template(prompt, tok)])
    greedy = generate(model, ids, [[1] * len(ids[0])], max_new_tokens=6, eos_token_ids=ev.stop_token_ids(tok, model),
                      pad_token_id=tok.pad_token_id, do_sample=False).completion_ids.numpy()[0].tolist()
    free = ev.generate_completions(model, tok, [prompt], batch_size=1, max_new_tokens=6)[0]
    assert free == {"completion": tok.decode(greedy, skip_special_tokens=False, clean_up_tokenization_spaces=False),
                    "num_tokens": 6, "truncated": True}
    # Declare the first greedy token not seen before it a stop token: generation ends there, the text before it.
    k = next(k for k in range(1, 6) if greedy[k] not in greedy[:k])
    monkeypatch.setattr(ev, "stop_token_ids", lambda tokenizer, model: [tokenizer.eos_token_id, greedy[k]])
    stopped = ev.generate_completions(model, tok, [prompt], batch_size=1, max_new_tokens=6)[0]
    assert stopped == {"completion": tok.decode(greedy[:k], skip_special_tokens=False,
                                                clean_up_tokenization_spaces=False),
                       "num_tokens": k + 1, "truncated": False}


def test_real_gsm8k_rows_raw_and_converted_agree(ev, load_tool, capsys, tiny_policy_dir, tmp_path, shared_data):
    source = shared_data / "gsm8k" / "train.jsonl"
    originals = [json.loads(line) for line in source.read_text(encoding="utf-8").splitlines()[:4]]
    stdout, raw = run(ev, capsys, tiny_policy_dir, source, tmp_path / "raw.jsonl", "--limit", "4",
                      "--max-new-tokens", "12")
    assert [p["gold"] for p in raw] == [o["answer"].rsplit("#### ", 1)[1].replace(",", "") for o in originals]
    assert parse_table(ev, stdout, 4) == recompute(raw)

    head = write_lines(tmp_path / "head.jsonl", originals)
    converted = tmp_path / "converted.jsonl"
    assert load_tool("data/convert_gsm8k").main(["--input", str(head), "--output", str(converted)]) == 0
    capsys.readouterr()
    _, conv = run(ev, capsys, tiny_policy_dir, converted, tmp_path / "conv.jsonl", "--max-new-tokens", "12")
    by_prompt = {p["prompt"]: p for p in conv}  # convert_gsm8k shuffles; match rows by prompt
    assert set(by_prompt) == {p["prompt"] for p in raw}
    for p in raw:
        q = by_prompt[p["prompt"]]
        assert (q["gold"], q["completion"], q["flexible-extract"], q["strict-match"]) == \
            (p["gold"], p["completion"], p["flexible-extract"], p["strict-match"])


# -------------------------------------------------------------------------------------------------- errors

def test_missing_model_dir(ev, capsys, tmp_path):
    data = write_lines(tmp_path / "d.jsonl", PROBLEMS[:1])
    assert ev.main(["--model", str(tmp_path / "nope"), "--data", str(data)]) == 2
    assert f"--model: '{tmp_path / 'nope'}' is not a directory" in capsys.readouterr().err
    assert ev.main(["--model", str(tmp_path), "--data", str(data)]) == 2
    assert "has no config.json" in capsys.readouterr().err


@pytest.mark.parametrize("line,message", [
    ("{not json", "invalid JSON"),
    (json.dumps({"question": "q", "answer": "no final answer"}), "key 'answer': expected exactly one '####', found 0"),
    (json.dumps({"question": "q"}), "key 'answer': expected a non-empty string"),
    (json.dumps({"src": "q", "tgt": ""}), "key 'tgt': expected a non-empty string"),
    (json.dumps({"src": "q", "tgt": ",$"}), "key 'tgt': ',$' has no answer left after normalisation"),
    (json.dumps({"prompt": "q"}), "expected 'question'/'answer' (GSM8K) or 'src'/'tgt' keys, got ['prompt']"),
])
def test_bad_data_line_names_file_and_line(ev, capsys, tiny_policy_dir, tmp_path, line, message):
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps(PROBLEMS[0]) + "\n\n" + line + "\n", encoding="utf-8")
    assert ev.main(["--model", tiny_policy_dir, "--data", str(data)]) == 2
    err = capsys.readouterr().err
    assert f"eval_gsm8k.py: error: {data}:3: " in err and message in err


def test_missing_and_empty_data_file(ev, capsys, tiny_policy_dir, tmp_path):
    assert ev.main(["--model", tiny_policy_dir, "--data", str(tmp_path / "none.jsonl")]) == 2
    assert "none.jsonl: data file not found" in capsys.readouterr().err
    (tmp_path / "empty.jsonl").write_text("\n", encoding="utf-8")
    assert ev.main(["--model", tiny_policy_dir, "--data", str(tmp_path / "empty.jsonl")]) == 2
    assert "empty.jsonl: no records" in capsys.readouterr().err


def test_recipes_doc_shows_the_tools_table_and_names_existing_files(ev, repo_root):
    doc = (repo_root / "docs" / "recipes.md").read_text(encoding="utf-8")
    assert ev.format_table({"flexible-extract": (0.0, 0.0), "strict-match": (0.0, 0.0)}) in doc
    available = doc.split("## 3. ")[0]  # sections 3 and 4 describe files still to come
    for path in set(re.findall(r"\b((?:configs|docs|tools)/[\w./-]+\.(?:yaml|md|py))", available)):
        assert (repo_root / path).exists(), path


def test_sampled_completions_reproducible_by_seed_and_unlike_greedy(ev, capsys, tiny_policy_dir, tmp_path):
    """--temperature samples through the rollout's keyed sampler: the same seed gives the same completions whatever
    the batch size (keys follow the problem's index in the file), another seed or greedy decoding other ones."""
    data = write_lines(tmp_path / "problems.jsonl", PROBLEMS)
    greedy_out, greedy = run(ev, capsys, tiny_policy_dir, data, tmp_path / "greedy.jsonl")
    assert greedy_out[0].endswith(", greedy, float32 products")
    sampled_out, first = run(ev, capsys, tiny_policy_dir, data, tmp_path / "a.jsonl", "--temperature", "1",
                             "--seed", "7")
    assert sampled_out[0].endswith(", sampled at temperature 1.0, seed 7, float32 products")
    assert parse_table(ev, sampled_out, 5) == recompute(first)
    # run() uses batches of 2; batches of 5 put every problem in another batch position with other neighbours.
    assert ev.main(["--model", tiny_policy_dir, "--data", str(data), "--output", str(tmp_path / "b.jsonl"),
                    "--max-new-tokens", "24", "--batch-size", "5", "--temperature", "1", "--seed", "7"]) == 0
    capsys.readouterr()
    again = [json.loads(line) for line in (tmp_path / "b.jsonl").read_text(encoding="utf-8").splitlines()]
    _, other_seed = run(ev, capsys, tiny_policy_dir, data, tmp_path / "c.jsonl", "--temperature", "1", "--seed", "8")
    texts = lambda preds: [p["completion"] for p in preds]  # noqa: E731
    assert texts(again) == texts(first)
    # A random tiny model at T=1 over a vocabulary of hundreds of tokens: 24-token samples that all coincide with
    # greedy (or with another seed's) would mean the sampler was not used.
    assert texts(first) != texts(greedy)
    assert texts(other_seed) != texts(first)


def test_bfloat16_products_are_named_and_scored(ev, capsys, tiny_policy_dir, tmp_path):
    """--precision bfloat16 decodes through the engine's bf16 products (where this CPU has them): the summary line
    says so, and its table is the score of its own predictions (tests/policy/test_decode_engine.py bounds the bf16
    logits against float32)."""
    from paddle_grpo.kernels import gemm

    try:
        gemm.best_backend("bfloat16")
    except ValueError as e:
        pytest.skip(f"no bfloat16 GEMM on this CPU: {e}")
    data = write_lines(tmp_path / "problems.jsonl", PROBLEMS)
    out, bf16 = run(ev, capsys, tiny_policy_dir, data, tmp_path / "bf16.jsonl", "--precision", "bfloat16")
    assert out[0].endswith(", greedy, bfloat16 products")
    assert len(bf16) == 5
    assert parse_table(ev, out, 5) == recompute(bf16)


@pytest.mark.parametrize("value", ["0", "-1", "nan"])
def test_bad_temperature(ev, capsys, tiny_policy_dir, tmp_path, value):
    data = write_lines(tmp_path / "problems.jsonl", PROBLEMS[:1])
    with pytest.raises(SystemExit):
        ev.main(["--model", tiny_policy_dir, "--data", str(data), "--temperature", value])
    assert "--temperature must be a positive number" in capsys.readouterr().err
