"""Convert Knights-and-Knaves parquet files into src/tgt JSONL for training (PaddleNLP's protocol, seed 003).

    python tools/data/convert_kk.py --input ../shared/data/kk/3ppl/train.parquet,../shared/data/kk/4ppl/train.parquet \
        --output kk_train.jsonl [--limit N] [--seed S] [--eval-fraction F --eval-output kk_eval.jsonl]

Reads the columns `quiz`, `names`, `solution` and `statements` of the K&K dataset's parquet files. Each output line:
- `src`: [the K&K system prompt + the quiz as the user turn + `<|im_start|>assistant\\n<think>`] (seed 003's format,
  built by `paddle_grpo.recipes.kk_puzzles.build_kk_prompt`, identical to the dataset's own `prompt` column);
- `tgt`: ["(1) Name is a knight\\n(2) Name is a knave..."] in the order of `names`;
- `solution`: the list of booleans (True = knight), `id`: "<dir>/<file>:<0-based row>".

Every puzzle's ground truth is checked before it is written: the answer built from `solution` must equal the
dataset's `solution_text_format` (when present), and the brute-force solver must find exactly one assignment of the
`statements` (when present), equal to `solution`. A mismatch stops the conversion with the file and row.

Rows are shuffled with `--seed` (default 0), duplicates of a quiz are dropped, then `--limit` keeps the first N and
`--eval-fraction` moves round(F * N) of them to `--eval-output`, so the two outputs never share a puzzle.

Left out on purpose: the dataset's chain-of-thought columns (`cot_*`) and its own `prompt` column (rebuilt from
`quiz` so that every K&K source of the project goes through one prompt builder); no tokenization or length filter.
"""
from __future__ import annotations

import os
import sys

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _REPO not in sys.path:
    sys.path.insert(0, _REPO)

from paddle_grpo.recipes.convert import conversion_main  # noqa: E402
from paddle_grpo.recipes.kk_puzzles import build_kk_prompt, format_kk_solution, parse_statements, solve  # noqa: E402


class ConversionError(ValueError):
    pass


def _row_id(path: str, row: int) -> str:
    return f"{os.path.basename(os.path.dirname(os.path.abspath(path)))}/{os.path.basename(path)}:{row}"


def load_puzzles(path: str):
    """One parquet file -> list of output records, each puzzle's ground truth verified."""
    import pandas as pd

    df = pd.read_parquet(path)
    missing = [c for c in ("quiz", "names", "solution") if c not in df.columns]
    if missing:
        raise ConversionError(f"{path}: missing column(s) {missing}; columns present: {list(df.columns)}")
    out = []
    for row, rec in enumerate(df.to_dict(orient="records")):
        where = f"{path}: row {row}"
        names = [str(n) for n in rec["names"]]
        solution = [bool(s) for s in rec["solution"]]
        if len(names) != len(solution) or len(set(names)) != len(names):
            raise ConversionError(f"{where}: names {names} do not match solution {solution}")
        tgt = format_kk_solution(names, solution)
        given = rec.get("solution_text_format")
        if isinstance(given, str) and given.strip() != tgt:
            raise ConversionError(f"{where}: solution_text_format {given!r} disagrees with solution -> {tgt!r}")
        if isinstance(rec.get("statements"), str):
            found = solve(parse_statements(rec["statements"]), len(names))
            if found != [tuple(solution)]:
                raise ConversionError(f"{where}: the statements have solutions {found}, expected exactly "
                                      f"{tuple(solution)}")
        out.append({"src": [build_kk_prompt(rec["quiz"])], "tgt": [tgt], "solution": solution,
                    "id": _row_id(path, row)})
    return out


def main(argv=None) -> int:
    return conversion_main(argv, __doc__.split("\n")[0], load_puzzles, "puzzles")


if __name__ == "__main__":
    sys.exit(main())
