"""tools/data/convert_gsm8k.py on the real GSM8K training file (../shared/data/gsm8k/train.jsonl)."""
import json
import re

import pytest

from paddle_grpo.data import DataError, read_jsonl

INSTRUCTION = ("Solve the problem step by step. Then give the final answer as a plain number on its own last line, "
               "in the form \"#### <number>\".")


def test_every_gold_number_is_the_sources_final_answer(load_tool, tmp_path, shared_data):
    source = shared_data / "gsm8k" / "train.jsonl"
    lines = source.read_text(encoding="utf-8").splitlines()
    out, ev = tmp_path / "train.jsonl", tmp_path / "eval.jsonl"
    convert = load_tool("data/convert_gsm8k")
    assert convert.main(["--input", str(source), "--output", str(out), "--eval-fraction", "0.05",
                         "--eval-output", str(ev)]) == 0
    train, evaluation = read_jsonl(out), read_jsonl(ev)
    assert len(train) + len(evaluation) == len(lines) == 7473
    assert len(evaluation) == round(0.05 * 7473)
    assert not {r["src"] for r in train} & {r["src"] for r in evaluation}
    with_commas = 0
    for rec in train + evaluation:
        lineno = int(rec["id"].rsplit(":", 1)[1])
        original = json.loads(lines[lineno - 1])
        final = re.search(r"####\s*(\S+)\s*$", original["answer"]).group(1)
        with_commas += "," in final
        assert rec["tgt"] == final.replace(",", "")
        assert float(rec["tgt"]) == float(final.replace(",", ""))
        assert rec["src"] == ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
                              + original["question"].strip() + "\n\n" + INSTRUCTION
                              + "<|im_end|>\n<|im_start|>assistant\n")
    assert with_commas > 0  # the file does have "#### 1,080"-style answers, so the comma removal was exercised


def test_first_line_exactly(load_tool, tmp_path):
    src = tmp_path / "g.jsonl"
    src.write_text(json.dumps({"question": "How many legs do 3 cats have? ",
                               "answer": "3 * 4 = <<3*4=12>>12\n#### 1,012"}) + "\n", encoding="utf-8")
    out = tmp_path / "o.jsonl"
    load_tool("data/convert_gsm8k").main(["--input", str(src), "--output", str(out)])
    assert json.loads(out.read_text(encoding="utf-8")) == {
        "src": ["<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHow many legs do 3 "
                "cats have?\n\n" + INSTRUCTION + "<|im_end|>\n<|im_start|>assistant\n"],
        "tgt": ["1012"],
        "id": "g.jsonl:1",
    }


@pytest.mark.parametrize("answer,what", [
    ("12", "expected exactly one '####', found 0"),
    ("#### 1 #### 2", "expected exactly one '####', found 2"),
    ("so #### twelve", "'#### twelve' is not a plain number"),
])
def test_bad_answers_name_file_and_line(load_tool, tmp_path, answer, what):
    src = tmp_path / "g.jsonl"
    src.write_text(json.dumps({"question": "q", "answer": "#### 1"}) + "\n\n"
                   + json.dumps({"question": "q2", "answer": answer}) + "\n", encoding="utf-8")
    with pytest.raises(DataError) as err:
        load_tool("data/convert_gsm8k").main(["--input", str(src), "--output", str(tmp_path / "o.jsonl")])
    assert str(err.value) == f"{src}:3: key 'answer': {what}"
