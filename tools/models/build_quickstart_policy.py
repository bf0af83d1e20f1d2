"""Build the quickstart policy (tokenizer + tiny Qwen2 with brief SFT on two-digit addition) into a directory.

    python tools/models/build_quickstart_policy.py build/quickstart_policy [--seed 42] [--max-steps 1000] \
        [--target-loss 0.3]

`python run_rl.py configs/quickstart.yaml` does this by itself when the directory is missing
(`build_actor_if_missing: quickstart`); this tool is for building ahead of time or with other SFT settings.
Prints the SFT statistics as one JSON line. Everything is in `paddle_grpo.recipes.quickstart.build_quickstart_policy`.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _REPO not in sys.path:
    sys.path.insert(0, _REPO)

from paddle_grpo.recipes.quickstart import build_quickstart_policy  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir")
    parser.add_argument("--seed", type=int, default=42, help="the trainer's default seed")
    parser.add_argument("--max-steps", type=int, default=None, help="SFT step cap")
    parser.add_argument("--target-loss", type=float, default=None, help="stop SFT at this validation loss")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    stats = build_quickstart_policy(args.out_dir, seed=args.seed, max_steps=args.max_steps,
                                    target_loss=args.target_loss)
    print(json.dumps(stats))
    return 0


if __name__ == "__main__":
    sys.exit(main())
