"""Build a tiny random reward model (one-label Qwen2ForSequenceClassification + tokenizer) into a directory.

    python tools/models/build_tiny_reward_model.py OUT_DIR [--seed 0]

For trying `reward_model_name_or_path` or `python -m reward_server --reward-model OUT_DIR` without a real model:
its scores are seeded and deterministic but meaningless. Built locally in seconds, nothing is downloaded.
Everything is in `paddle_grpo.recipes.tiny.build_reward_model`.
"""
from __future__ import annotations

import argparse
import os
import sys

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _REPO not in sys.path:
    sys.path.insert(0, _REPO)

from paddle_grpo.recipes.tiny import build_reward_model  # noqa: E402

# The tokenizer's training texts: chat-formatted prompts and answers like the examples' (docs/rewards.md).
CORPUS = [
    "<|im_start|>user\nWhat is 12 + 35?<|im_end|>\n<|im_start|>assistant\nThe answer is 47. #### 47<|im_end|>",
    "Summarize: the cat sat on the mat. A cat sat on a mat. Knights always tell the truth, knaves always lie.",
] * 10


def main(argv: list[str] | None = None) -> int:
    """Build the model into OUT_DIR; prints the directory. Returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir")
    parser.add_argument("--seed", type=int, default=0, help="weight initialisation seed (default 0)")
    args = parser.parse_args(argv)
    from paddlenlp.utils.log import logger as paddlenlp_logger

    paddlenlp_logger.set_level("WARNING")  # not one INFO line per file written
    build_reward_model(args.out_dir, CORPUS, seed=args.seed)
    print(f"tiny reward model written to {args.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
