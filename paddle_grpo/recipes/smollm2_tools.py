"""A real model and a tool: SmolLM2-135M-Instruct, a calculator, and products it cannot work out alone.

Task: the product of a 3-digit and a 2-digit number (A in 100..999, B in 10..99), asked in plain language in one of
`PHRASINGS` ("What is 412 times 37?", "A box holds 37 pencils. How many pencils are in 412 boxes?", ...). Alone the
135 M model is almost never right; with the `calculator` tool it only has to copy the two numbers into a call and
the result into its answer.

The tool format (docs/smollm2_tools.md shows the bytes): SmolLM2's ChatML template has no tool role and no tool
tokens, so the calls are Hermes text in the assistant turn (`<tool_call>\\n{"name": "calculator", "arguments":
{"expression": "412*37"}}\\n</tool_call>`) and the result comes back in a user turn, `<tool_response>\\nP\\n
</tool_response>`, which the template renders like any user turn: `HermesFormat` with SmolLM2's default system text.
`</tool_call>` is several tokens in SmolLM2's vocabulary, so an assistant turn ends at `<|im_end|>` only; the calls
in it run once it has ended. The prompt's system turn is SmolLM2's default one, the tool listing of Qwen2.5's
template (`HermesFormat.tools_system_text`) and, with `examples=True`, worked examples of a call and its answer
(`EXAMPLES`: problems of another shape, never one of the task's). The prompt is written into the data file (`src`),
so the trainer feeds it verbatim; the `*_plain.jsonl` files hold the same questions without tools (SmolLM2's template
with its default system turn), for runs and baselines with the tools off.

Reward `smollm2_tools_final_answer` (`final_answer_reward`): 1.0 when the last number of the final assistant turn
(thousands separators allowed) is the product, else 0.0: a right answer counts with or without the tool.

Split (`split_problems`): held-out problems share no operands-and-operator combination with training in either
order (A*B and B*A are one combination), whatever the run's seed.
"""
from __future__ import annotations

import json
import random
import re
from typing import Any, Dict, FrozenSet, List, Optional, Sequence, Tuple

from ..rewards.base import Completion, completion_text, references
from ..rewards.registry import register_reward
from .smollm2 import IMPORT_COMMAND, MODEL_DIR, SYSTEM

__all__ = ["IMPORT_COMMAND", "MODEL_DIR", "A_RANGE", "B_RANGE", "PHRASINGS", "Problem", "question", "prompt",
           "plain_prompt", "record", "combination", "split_problems", "final_number", "final_answer",
           "final_answer_reward"]

Problem = Tuple[int, int, int]  # (a, b, phrasing index): the question is PHRASINGS[phrasing].format(a=a, b=b)

A_RANGE, B_RANGE = (100, 999), (10, 99)
TRAIN_SIZE, EVAL_SIZE = 1000, 200
SPLIT_SEED = 0
TOOL = "calculator"
PHRASINGS = (
    "What is {a} times {b}?",
    "Multiply {a} by {b}.",
    "A box holds {b} pencils. How many pencils are in {a} boxes?",
    "A ticket costs {b} dollars. How many dollars do {a} tickets cost?",
)
# Worked examples for the system turn: a call and the answer after its result. Sums and differences of other
# sizes, so that no example is a problem of the task (nor teaches a product).
EXAMPLES = (("What is 5812 plus 2379?", "5812+2379", "8191"),
            ("A tank holds 9204 liters. 3786 liters are drained. How many liters are left?", "9204-3786", "5418"))

_NUMBER = re.compile(r"-?\d[\d,]*")


def question(a: int, b: int, phrasing: int = 0) -> str:
    return PHRASINGS[phrasing].format(a=a, b=b)


def _format():
    from ..environment import HermesFormat

    return HermesFormat(default_system=SYSTEM)


def _schema() -> Dict[str, Any]:
    from ..environment import get_tool

    return get_tool(TOOL).schema


def call_text(expression: str) -> str:
    """A Hermes call to the calculator, as the assistant writes it."""
    fmt = _format()
    return f"{fmt.call_start}\n" + json.dumps({"name": TOOL, "arguments": {"expression": expression}}) + \
        f"\n{fmt.call_end}"


def tool_turn_text(result: str) -> str:
    """What the environment appends after an assistant turn with a call (ended at `<|im_end|>`, which SmolLM2's
    vocabulary has as its EOS): the result as a user turn in `<tool_response>` tags, the next assistant turn
    opened (`HermesFormat.tool_turn_text`)."""
    from ..environment import ToolResult

    return _format().tool_turn_text([ToolResult(TOOL, result)], ended_by_call_end=False)


def system_text(listing: str = "short") -> str:
    """The system turn's content: SmolLM2's default system text, then the calculator. `listing="short"` (the
    recipe's): three lines saying how to call it (a prompt of 105-113 tokens instead of about 240, which every
    rollout and training pass pays for); `"qwen"`: the tool listing of Qwen2.5's template with the JSON schema
    (`HermesFormat.tools_system_text`)."""
    fmt = _format()
    if listing == "qwen":
        return fmt.tools_system_text([_schema()], SYSTEM)
    if listing != "short":
        raise ValueError(f"unknown listing {listing!r}; expected short or qwen")
    return (f"{SYSTEM}\n\nYou have a calculator. To use it, write\n{call_text('12+34')}\n"
            f"and its result comes back between {fmt.response_start} and {fmt.response_end}.")


def example_turns() -> str:
    """Worked examples as chat turns (`EXAMPLES`): each a user question, the assistant's call, the tool's turn
    and the assistant's answer, as the rollout renders them."""
    out = []
    for q, expr, result in EXAMPLES:
        out.append(f"<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n{call_text(expr)}<|im_end|>"
                   f"{tool_turn_text(result)}The answer is {result}.<|im_end|>\n")
    return "".join(out)


def prompt(a: int, b: int, phrasing: int = 0, listing: str = "short", examples: bool = False) -> str:
    """The templated prompt with the calculator (`src`), as SmolLM2's template renders a system and a user turn
    with the assistant's opened; `examples`: worked examples (`example_turns`) between the two."""
    head = f"<|im_start|>system\n{system_text(listing)}<|im_end|>\n" + (example_turns() if examples else "")
    return f"{head}<|im_start|>user\n{question(a, b, phrasing)}<|im_end|>\n<|im_start|>assistant\n"


def plain_prompt(a: int, b: int, phrasing: int = 0) -> str:
    """The question without tools (`src` of the `*_plain.jsonl` files): SmolLM2's template, its default system turn."""
    from ..data import format_qwen_chat

    return format_qwen_chat(question(a, b, phrasing), system=SYSTEM)


def record(problem: Problem, tools: bool = True) -> Dict[str, Any]:
    """A dataset row: `src` (the prompt with the calculator, or without it: `plain_prompt`), `tgt` (the product),
    the operands and the phrasing."""
    a, b, k = problem
    return {"src": prompt(a, b, k) if tools else plain_prompt(a, b, k), "tgt": str(a * b), "a": a, "b": b,
            "phrasing": k}


def combination(a: int, b: int, operator: str = "*") -> Tuple[str, FrozenSet[int]]:
    """The operands-and-operator combination of a problem, the same for A*B and B*A."""
    return operator, frozenset((a, b))


def split_problems(train_size: int = TRAIN_SIZE, eval_size: int = EVAL_SIZE,
                   seed: int = SPLIT_SEED) -> Tuple[List[Problem], List[Problem]]:
    """(train, held_out): distinct operand pairs drawn with `seed`, the first `eval_size` held out, the next
    `train_size` for training, each with a phrasing drawn too. No combination (`combination`) is on both sides, and
    none repeats on a side. Fixed for every run seed."""
    rng = random.Random(seed)
    seen = {combination(123, 45)}  # the calculator schema's own example (`e.g. 123*45`) is no problem of the task
    out: List[Problem] = []
    while len(out) < eval_size + train_size:
        a, b = rng.randint(*A_RANGE), rng.randint(*B_RANGE)
        key = combination(a, b)
        phrasing = rng.randrange(len(PHRASINGS))
        if key not in seen:
            seen.add(key)
            out.append((a, b, phrasing))
    return out[eval_size:], out[:eval_size]


def final_number(text: str) -> Optional[int]:
    """The last number in `text` (thousands separators dropped, a leading minus kept), None when there is none."""
    found = _NUMBER.findall(text)
    if not found:
        return None
    digits = found[-1].rstrip(",").replace(",", "")
    return int(digits) if digits not in ("", "-") else None


def final_answer(prompts: Sequence[Any], completions: Sequence[Completion], **kwargs: Any) -> List[Optional[str]]:
    """The answer `final_answer_reward` compares: the last number of the final answer (None: it has none); its
    `extract_answer`, for the evaluation's majority vote and eval_per_problem.jsonl."""
    return [None if (n := final_number(completion_text(c))) is None else str(n) for c in completions]


@register_reward("smollm2_tools_final_answer", max_score=1.0, extract_answer=final_answer)
def final_answer_reward(prompts: Sequence[Any], completions: Sequence[Completion],
                        tgt: Optional[Sequence[Any]] = None, **kwargs: Any) -> List[float]:
    """1.0 when the last number of the final answer (the last assistant turn's content) is the reference, else 0.0.
    A trajectory's tool calls (`turns`) do not count: a right answer scores with or without the tool."""
    refs = references(tgt, completions, "smollm2_tools_final_answer")
    return [1.0 if final_number(completion_text(c)) == int(str(r).strip()) else 0.0
            for c, r in zip(completions, refs)]
