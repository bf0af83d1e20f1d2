"""Write the SmolLM2 recipe's prompt files: `What is a + b?` (a, b in 1..20) as src/tgt JSONL.

    python tools/data/gen_smollm2_data.py [--out-dir data/smollm2_add]

`train.jsonl`: 300 pairs; `eval.jsonl`: the other 100 pairs of 1..20, held out (the split of
`paddle_grpo.recipes.smollm2.split_pairs()`: one fixed shuffle, the same for every run seed). Rows: `src` (the prompt
in SmolLM2's chat template, used verbatim by the trainer), `tgt` (the sum), `a`, `b`. Only `random.Random(0)` is
used, so the files are always the same bytes.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import List, Optional

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _REPO not in sys.path:
    sys.path.insert(0, _REPO)

from paddle_grpo.data import write_jsonl  # noqa: E402
from paddle_grpo.recipes.smollm2 import record, split_pairs  # noqa: E402


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", default=os.path.join(_REPO, "data", "smollm2_add"))
    args = parser.parse_args(argv)
    train, held_out = split_pairs()
    os.makedirs(args.out_dir, exist_ok=True)
    write_jsonl(os.path.join(args.out_dir, "train.jsonl"), [record(a, b) for a, b in train])
    write_jsonl(os.path.join(args.out_dir, "eval.jsonl"), [record(a, b) for a, b in held_out])
    print(f"wrote {len(train)} train and {len(held_out)} held-out problems to {args.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
