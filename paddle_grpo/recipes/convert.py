"""The shared command line of the dataset converters (tools/data/convert_kk.py, tools/data/convert_gsm8k.py).

`conversion_main(argv, description, load_file, noun)`: read every `--input` file with `load_file(path) -> records`,
shuffle with `--seed`, keep `--limit`, split off `--eval-fraction` into `--eval-output`, write src/tgt JSONL.
"""
from __future__ import annotations

import argparse
import sys
from typing import Any, Callable, Dict, Iterable, Optional, Sequence

from ..data import shuffle_split, split_paths, write_jsonl


def conversion_main(argv: Optional[Sequence[str]], description: str,
                    load_file: Callable[[str], Iterable[Dict[str, Any]]], noun: str) -> int:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--input", required=True, help="input file, or several separated by commas")
    parser.add_argument("--output", required=True, help="output JSONL (training part)")
    parser.add_argument("--limit", type=int, default=None, help="keep at most N rows (after shuffling)")
    parser.add_argument("--seed", type=int, default=0, help="shuffling seed (default 0)")
    parser.add_argument("--eval-fraction", type=float, default=0.0,
                        help="fraction of the rows written to --eval-output")
    parser.add_argument("--eval-output", default=None, help="output JSONL for the evaluation part")
    args = parser.parse_args(argv)
    if args.limit is not None and args.limit <= 0:
        parser.error("--limit must be positive")
    if not 0.0 <= args.eval_fraction < 1.0:
        parser.error("--eval-fraction must be in [0, 1)")
    if (args.eval_fraction > 0) != (args.eval_output is not None):
        parser.error("--eval-fraction and --eval-output go together")

    records = []
    for path in split_paths(args.input):
        records.extend(load_file(path))
    train, evaluation = shuffle_split(records, args.seed, args.limit, args.eval_fraction)
    write_jsonl(args.output, train)
    msg = f"wrote {len(train)} {noun} to {args.output}"
    if args.eval_output:
        write_jsonl(args.eval_output, evaluation)
        msg += f" and {len(evaluation)} to {args.eval_output}"
    print(msg, file=sys.stderr)
    return 0
