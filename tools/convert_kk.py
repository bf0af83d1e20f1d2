"""Convert Knights-and-Knaves parquet files into src/tgt JSONL for training (PaddleNLP's protocol, seed 003).

    python tools/convert_kk.py --input ../shared/data/kk/3ppl/train.parquet,../shared/data/kk/4ppl/train.parquet \
        --output kk_train.jsonl [--limit N] [--seed S] [--eval-fraction F --eval-output kk_eval.jsonl]

Reads the columns `quiz`, `names`, `solution` and `statements` of the K&K dataset's parquet files. Each output line:
- `src`: [the K&K system prompt + the quiz as the user turn + `<|im_start|>assistant\\n<think>`] (seed 003's format,
  built by `paddle_grpo.kk_puzzles.build_kk_prompt`, identical to the dataset's own `prompt` column);
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

import argparse
import os
import sys

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _REPO not in sys.path:
    sys.path.insert(0, _REPO)

from paddle_grpo.data import shuffle_split, split_paths, write_jsonl  # noqa: E402
from paddle_grpo.kk_puzzles import build_kk_prompt, format_kk_solution, parse_statements, solve  # noqa: E402


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


def add_common_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--input", required=True, help="input file, or several separated by commas")
    parser.add_argument("--output", required=True, help="output JSONL (training part)")
    parser.add_argument("--limit", type=int, default=None, help="keep at most N rows (after shuffling)")
    parser.add_argument("--seed", type=int, default=0, help="shuffling seed (default 0)")
    parser.add_argument("--eval-fraction", type=float, default=0.0,
                        help="fraction of the rows written to --eval-output")
    parser.add_argument("--eval-output", default=None, help="output JSONL for the evaluation part")


def check_common_args(parser: argparse.ArgumentParser, args) -> None:
    if args.limit is not None and args.limit <= 0:
        parser.error("--limit must be positive")
    if not 0.0 <= args.eval_fraction < 1.0:
        parser.error("--eval-fraction must be in [0, 1)")
    if (args.eval_fraction > 0) != (args.eval_output is not None):
        parser.error("--eval-fraction and --eval-output go together")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_common_args(parser)
    args = parser.parse_args(argv)
    check_common_args(parser, args)
    records = []
    for path in split_paths(args.input):
        records.extend(load_puzzles(path))
    train, evaluation = shuffle_split(records, args.seed, args.limit, args.eval_fraction)
    write_jsonl(args.output, train)
    msg = f"wrote {len(train)} puzzles to {args.output}"
    if args.eval_output:
        write_jsonl(args.eval_output, evaluation)
        msg += f" and {len(evaluation)} to {args.eval_output}"
    print(msg, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
