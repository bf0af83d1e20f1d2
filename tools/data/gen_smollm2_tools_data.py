"""Write the SmolLM2 tool recipe's prompt files: 3-digit by 2-digit products asked in plain language, src/tgt JSONL.

    python tools/data/gen_smollm2_tools_data.py [--out-dir data/smollm2_tools]

`train.jsonl`: 1000 problems; `eval.jsonl`: 200 held out, none sharing its operands-and-operator combination with a
training problem in either order (`paddle_grpo.recipes.smollm2_tools.split_problems()`: one fixed draw, the same for
every run seed). Rows: `src` (the prompt in SmolLM2's chat template with a note on the calculator in the system
turn, used verbatim by the trainer), `tgt` (the product), `a`, `b`, `phrasing`. `train_plain.jsonl` and
`eval_plain.jsonl`: the same rows with `src` the question without tools (SmolLM2's template with its default system
turn), for the runs with the tools off. Only `random.Random(0)` is used, so the files are always the same bytes.
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
from paddle_grpo.recipes.smollm2_tools import record, split_problems  # noqa: E402


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", default=os.path.join(_REPO, "data", "smollm2_tools"))
    args = parser.parse_args(argv)
    train, held_out = split_problems()
    for suffix, tools in (("", True), ("_plain", False)):
        write_jsonl(os.path.join(args.out_dir, f"train{suffix}.jsonl"), [record(p, tools) for p in train])
        write_jsonl(os.path.join(args.out_dir, f"eval{suffix}.jsonl"), [record(p, tools) for p in held_out])
    print(f"wrote {len(train)} train and {len(held_out)} held-out problems to {args.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
