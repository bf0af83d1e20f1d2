"""tools/data/convert_kk.py on the real K&K parquet files (../shared/data/kk), checked against the files' own
columns."""
import ast
import itertools
import json

import pandas as pd
import pytest

from paddle_grpo.data import read_jsonl

# Seed 003's prompt around the quiz, verbatim.
PREFIX = (
    "<|im_start|>system\nYou are a helpful assistant. The assistant first thinks about the reasoning process in the "
    "mind and then provides the user with the answer. The reasoning process and answer are enclosed within <think> "
    "</think> and<answer> </answer> tags, respectively, i.e., <think> reasoning process here </think><answer> answer "
    "here </answer>.  Now the user asks you to solve a logical reasoning problem. After thinking, when you finally "
    "reach a conclusion, clearly state the identity of each character within <answer> </answer> tags. i.e., <answer> "
    "(1) Zoey is a knight\n(2) ... </answer>.\n<|im_end|>\n<|im_start|>user\n"
)
SUFFIX = "\n<|im_end|>\n<|im_start|>assistant\n<think>"

PPL = ("3ppl", "4ppl", "5ppl")


@pytest.fixture(scope="module")
def parquet_rows(shared_data):
    """id ("3ppl/train.parquet:<row>") -> row of the real files."""
    rows = {}
    for d in PPL:
        df = pd.read_parquet(shared_data / "kk" / d / "train.parquet")
        for i, rec in enumerate(df.to_dict(orient="records")):
            rows[f"{d}/train.parquet:{i}"] = rec
    return rows


def expected_tgt(names, solution):
    return "\n".join(f"({i + 1}) {name} is a {'knight' if knight else 'knave'}"
                     for i, (name, knight) in enumerate(zip(names, solution)))


def truth(stmt, knight):
    """A second evaluator of the dataset's statement tuples, written apart from paddle_grpo.recipes.kk_puzzles."""
    op, args = stmt[0], stmt[1:]
    table = {
        "telling-truth": lambda: knight[args[0]],
        "lying": lambda: not knight[args[0]],
        "not": lambda: not truth(args[0], knight),
        "and": lambda: all(truth(a, knight) for a in args),
        "or": lambda: any(truth(a, knight) for a in args),
        "->": lambda: truth(args[1], knight) if truth(args[0], knight) else True,
        "<=>": lambda: truth(args[0], knight) is truth(args[1], knight),
    }
    return bool(table[op]())


def test_real_statements_have_the_dataset_solution_as_only_solution(parquet_rows):
    """The reference evaluator above agrees with the dataset's own solution column on every puzzle."""
    for rid, row in parquet_rows.items():
        stmts = ast.literal_eval(row["statements"])
        n = len(row["names"])
        sols = [k for k in itertools.product([False, True], repeat=n)
                if all(truth(s, k) == k[i] for i, s in enumerate(stmts))]
        assert sols == [tuple(bool(x) for x in row["solution"])], rid


def run(load_tool, tmp_path, shared_data, *extra):
    convert = load_tool("data/convert_kk")
    inputs = ",".join(str(shared_data / "kk" / d / "train.parquet") for d in PPL)
    out = tmp_path / "train.jsonl"
    assert convert.main(["--input", inputs, "--output", str(out), *extra]) == 0
    return out


def test_convert_limit_and_eval_split(load_tool, tmp_path, shared_data, parquet_rows):
    ev = tmp_path / "eval.jsonl"
    out = run(load_tool, tmp_path, shared_data, "--limit", "100", "--seed", "3", "--eval-fraction", "0.2",
              "--eval-output", str(ev))
    train, evaluation = read_jsonl(out), read_jsonl(ev)
    assert len(train) == 80 and len(evaluation) == 20
    for rec in train + evaluation:
        row = parquet_rows[rec["id"]]
        assert rec["src"].startswith("<|im_start|>system\n") and rec["src"].endswith("<|im_start|>assistant\n<think>")
        assert rec["src"] == PREFIX + row["quiz"] + SUFFIX
        assert rec["src"] == row["prompt"][0]["content"]  # identical to the dataset's own templated prompt
        assert rec["tgt"] == expected_tgt(row["names"], row["solution"]) == row["solution_text_format"]
        assert rec["solution"] == [bool(x) for x in row["solution"]]
    assert not {r["src"] for r in train} & {r["src"] for r in evaluation}
    assert len({r["id"] for r in train + evaluation}) == 100
    # the seeded shuffle mixes the three files
    assert {r["id"].split("/")[0] for r in train} == set(PPL)
    # raw lines are seed 003's protocol: one-element lists
    first = json.loads(out.read_text(encoding="utf-8").splitlines()[0])
    assert isinstance(first["src"], list) and len(first["src"]) == 1 and isinstance(first["tgt"], list)


def test_convert_is_deterministic_per_seed(load_tool, tmp_path, shared_data):
    a = run(load_tool, tmp_path / "a", shared_data, "--limit", "30", "--seed", "5").read_bytes()
    b = run(load_tool, tmp_path / "b", shared_data, "--limit", "30", "--seed", "5").read_bytes()
    c = run(load_tool, tmp_path / "c", shared_data, "--limit", "30", "--seed", "6").read_bytes()
    assert a == b and a != c


def test_convert_everything(load_tool, tmp_path, shared_data, parquet_rows):
    records = read_jsonl(run(load_tool, tmp_path, shared_data))
    assert len(records) == len(parquet_rows) == 2700
    assert {r["id"] for r in records} == set(parquet_rows)


def small_copy(shared_data, tmp_path, edit):
    df = pd.read_parquet(shared_data / "kk" / "3ppl" / "train.parquet").head(5).copy()
    edit(df)
    path = tmp_path / "bad.parquet"
    df.to_parquet(path)
    return path


def flip(values):
    return [not bool(v) for v in values]


def test_a_wrong_solution_column_stops_the_conversion(load_tool, tmp_path, shared_data):
    convert = load_tool("data/convert_kk")

    def wrong_solution(df):
        df.at[2, "solution"] = flip(df.at[2, "solution"])

    bad = small_copy(shared_data, tmp_path, wrong_solution)
    with pytest.raises(convert.ConversionError, match=r"bad\.parquet: row 2: solution_text_format"):
        convert.main(["--input", str(bad), "--output", str(tmp_path / "o.jsonl")])

    def wrong_solution_and_text(df):
        df.at[3, "solution"] = flip(df.at[3, "solution"])
        df.at[3, "solution_text_format"] = expected_tgt(df.at[3, "names"], df.at[3, "solution"])

    bad = small_copy(shared_data, tmp_path, wrong_solution_and_text)
    with pytest.raises(convert.ConversionError, match=r"bad\.parquet: row 3: the statements have solutions"):
        convert.main(["--input", str(bad), "--output", str(tmp_path / "o.jsonl")])


def test_cli_errors(load_tool, tmp_path):
    convert = load_tool("data/convert_kk")
    with pytest.raises(SystemExit):
        convert.main(["--input", "x.parquet", "--output", str(tmp_path / "o.jsonl"), "--eval-fraction", "0.1"])
    with pytest.raises(SystemExit):
        convert.main(["--input", "x.parquet", "--output", str(tmp_path / "o.jsonl"), "--limit", "0"])
