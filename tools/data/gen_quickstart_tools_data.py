"""Write the tool quickstart's prompt files: 3-digit by 2-digit multiplication problems as src/tgt JSONL.

    python tools/data/gen_quickstart_tools_data.py [--train-num 2000 --seed 1 --out-dir data]

`data/quickstart_tools_train.jsonl`: `--train-num` distinct problems drawn with `--seed` (the RL prompts);
`data/quickstart_tools_eval.jsonl`: the fixed held-out set `paddle_grpo.recipes.quickstart_tools.eval_problems()`
(never in the train file, nor in the policy's SFT data). Rows: `src` (the chat-templated prompt with the
calculator listed in its system turn, used verbatim by the trainer), `tgt` (the product), `a`, `b`. Only
`random.Random(seed)` is used, so a seed always gives the same bytes.
Left out: the SFT data, which the policy builder draws on the fly.
"""
from __future__ import annotations

import argparse
import os
import sys

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _REPO not in sys.path:
    sys.path.insert(0, _REPO)

from paddle_grpo.data import write_jsonl  # noqa: E402
from paddle_grpo.recipes.quickstart_tools import eval_problems, record, train_problems  # noqa: E402


def distinct_train_problems(n, seed):
    """`n` distinct training problems (drawn with `seed`, none held out), in draw order."""
    out, seen = [], set()
    for p in train_problems(4 * n, seed=seed):  # 81,000 possible problems: 4n draws hold n distinct ones
        if p not in seen:
            seen.add(p)
            out.append(p)
            if len(out) == n:
                return out
    raise ValueError(f"fewer than {n} distinct problems in {4 * n} draws")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train-num", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out-dir", default=os.path.join(_REPO, "data"))
    args = parser.parse_args(argv)
    train = [dict(record(a, b), a=a, b=b) for a, b in distinct_train_problems(args.train_num, args.seed)]
    held_out = [dict(record(a, b), a=a, b=b) for a, b in eval_problems()]
    write_jsonl(os.path.join(args.out_dir, "quickstart_tools_train.jsonl"), train)
    write_jsonl(os.path.join(args.out_dir, "quickstart_tools_eval.jsonl"), held_out)
    print(f"wrote {len(train)} train and {len(held_out)} eval problems to {args.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
