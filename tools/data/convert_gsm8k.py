"""Convert GSM8K JSONL (`question`, `answer` ending in `#### N`) into src/tgt JSONL for training.

    python tools/data/convert_gsm8k.py --input ../shared/data/gsm8k/train.jsonl --output gsm8k_train.jsonl \
        [--limit N] [--seed S] [--eval-fraction F --eval-output gsm8k_eval.jsonl]

Each output line:
- `src`: [a Qwen chat-templated prompt: default system turn, the question plus INSTRUCTION (step-by-step reasoning,
  final answer on a line `#### <number>`), and the assistant turn opened];
- `tgt`: [the gold final answer only, e.g. "72"]: the number after `####` with thousands separators removed
  ("1,080" -> "1080"). Only the number, because that is all the `gsm8k` reward compares, a bare number is what
  PaddleNLP-style reward servers get as `tgt`, and it keeps the reward request small;
- `id`: "<file>:<1-based line>".

Rows are shuffled with `--seed` (default 0), repeated questions are dropped, then `--limit` keeps the first N and
`--eval-fraction` moves round(F * N) of them to `--eval-output` (no question in both files).

Left out on purpose: the reference solution text and its `<<calculator>>` annotations (not needed by any reward),
few-shot examples, and `<think>` prefixes (GSM8K prompts are plain chat turns). A line whose answer has no single
`#### N` with a plain number N stops the conversion with the file and line.
"""
from __future__ import annotations

import os
import re
import sys

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _REPO not in sys.path:
    sys.path.insert(0, _REPO)

from paddle_grpo.recipes.convert import conversion_main  # noqa: E402
from paddle_grpo.data import DataError, format_qwen_chat, iter_json_lines  # noqa: E402

INSTRUCTION = ("Solve the problem step by step. Then give the final answer as a plain number on its own last line, "
               "in the form \"#### <number>\".")

_NUMBER = re.compile(r"[-+]?\d+(\.\d+)?")


def gold_answer(answer: str, where: str) -> str:
    """The number after the single `####` of a GSM8K answer, without thousands separators."""
    parts = answer.split("####")
    if len(parts) != 2:
        raise DataError(f"{where}: key 'answer': expected exactly one '####', found {len(parts) - 1}")
    number = parts[1].strip().replace(",", "")
    if not _NUMBER.fullmatch(number):
        raise DataError(f"{where}: key 'answer': '#### {parts[1].strip()}' is not a plain number")
    return number


def build_prompt(question: str) -> str:
    return format_qwen_chat(f"{question.strip()}\n\n{INSTRUCTION}")


def load_problems(path: str):
    out = []
    for where, obj in iter_json_lines(path, "a JSON object with keys 'question' and 'answer'"):
        for key in ("question", "answer"):
            if not isinstance(obj, dict) or not isinstance(obj.get(key), str):
                raise DataError(f"{where}: key {key!r}: missing or not a string")
        out.append({"src": [build_prompt(obj["question"])], "tgt": [gold_answer(obj["answer"], where)],
                    "id": os.path.basename(where)})
    return out


def main(argv=None) -> int:
    return conversion_main(argv, __doc__.split("\n")[0], load_problems, "problems")


if __name__ == "__main__":
    sys.exit(main())
