"""Write the quickstart's prompt files: two-digit addition problems as src/tgt JSONL.

    python tools/data/gen_quickstart_data.py [--train-num 2000 --seed 1 --out-dir data]

`data/quickstart_train.jsonl`: `--train-num` distinct problems drawn with `--seed` (the GRPO prompts);
`data/quickstart_eval.jsonl`: the fixed held-out set `paddle_grpo.recipes.quickstart.eval_problems()` (never in the train
file, nor in the policy's SFT data). Rows: `src` (the chat-templated prompt, used verbatim by the trainer), `tgt`
(the sum), `a`, `b`. Only `random.Random(seed)` is used, so a seed always gives the same bytes.
Left out: any other task; the SFT data, which the policy builder draws on the fly.
"""
from __future__ import annotations

import argparse
import os
import sys

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _REPO not in sys.path:
    sys.path.insert(0, _REPO)

from paddle_grpo.data import write_jsonl  # noqa: E402
from paddle_grpo.recipes.quickstart import eval_problems, record, train_problems  # noqa: E402


def distinct_train_problems(n, seed):
    """`n` distinct training problems (drawn with `seed`, none held out), in draw order."""
    out, seen, k = [], set(), 0
    while len(out) < n:
        k += 1
        for p in train_problems(n * k, seed=seed):
            if p not in seen:
                seen.add(p)
                out.append(p)
                if len(out) == n:
                    break
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train-num", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out-dir", default=os.path.join(_REPO, "data"))
    args = parser.parse_args(argv)
    train = [dict(record(a, b), a=a, b=b) for a, b in distinct_train_problems(args.train_num, args.seed)]
    held_out = [dict(record(a, b), a=a, b=b) for a, b in eval_problems()]
    write_jsonl(os.path.join(args.out_dir, "quickstart_train.jsonl"), train)
    write_jsonl(os.path.join(args.out_dir, "quickstart_eval.jsonl"), held_out)
    print(f"wrote {len(train)} train and {len(held_out)} eval problems to {args.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
