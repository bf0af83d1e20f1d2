"""Knights-and-Knaves puzzles: the statement model, a brute-force solver, and the prompt/answer format.

Shared by `tools/data/convert_kk.py` (which checks every converted puzzle's ground truth with the solver) and
`tools/data/gen_kk.py` (which generates puzzles and keeps only those with exactly one solution).

Statements use the nested-tuple form of the K&K dataset's `statements` column, so both sources go through the same
solver. Person `i` is a knight (truthful) when `assignment[i]` is True and a knave (liar) otherwise:

    ("telling-truth", i)    person i is a knight
    ("lying", i)            person i is a knave
    ("not", s)              s is false
    ("and", s, t, ...)      all true             ("or", s, t, ...)   at least one true
    ("->", s, t)            if s then t          ("<=>", s, t)       s if and only if t

A puzzle is a list with one statement per person (None: that person says nothing). An assignment is consistent
when every speaker's statement is true exactly when the speaker is a knight.

Left out: rendering statements into English and random generation (they live in `tools/data/gen_kk.py`), and answer
parsing/scoring (that is the `kk` reward's job).
"""
from __future__ import annotations

import ast
import itertools
from typing import List, Optional, Sequence, Tuple

from ..data import format_qwen_chat

__all__ = ["KK_SYSTEM_PROMPT", "build_kk_prompt", "format_kk_solution", "evaluate", "is_consistent", "solve",
           "parse_statements", "statements_to_text", "MAX_PEOPLE"]

# The system prompt of seed 003's K&K example (PaddleNLP's K&K data protocol), reproduced exactly so that prompts
# made here are interchangeable with the data PaddleNLP users already have.
KK_SYSTEM_PROMPT = (
    "You are a helpful assistant. The assistant first thinks about the reasoning process in the mind and then "
    "provides the user with the answer. The reasoning process and answer are enclosed within <think> </think> "
    "and<answer> </answer> tags, respectively, i.e., <think> reasoning process here </think><answer> answer here "
    "</answer>.  Now the user asks you to solve a logical reasoning problem. After thinking, when you finally reach "
    "a conclusion, clearly state the identity of each character within <answer> </answer> tags. i.e., <answer> (1) "
    "Zoey is a knight\n(2) ... </answer>.\n"
)

MAX_PEOPLE = 12  # 2^12 assignments; the solver is brute force

Statement = tuple


def build_kk_prompt(quiz: str) -> str:
    """The templated `src` of a K&K puzzle, exactly as in seed 003: system prompt, the quiz as the user turn, and
    the assistant turn opened with `<think>`."""
    return format_qwen_chat(quiz.strip() + "\n", system=KK_SYSTEM_PROMPT, assistant_prefix="<think>")


def format_kk_solution(names: Sequence[str], solution: Sequence[bool]) -> str:
    """The `tgt` of a K&K puzzle: `(1) Name is a knight\\n(2) Name is a knave...` in the order of `names`."""
    if len(names) != len(solution):
        raise ValueError(f"format_kk_solution: {len(names)} names but {len(solution)} truth values")
    return "\n".join(f"({i}) {name} is a {'knight' if knight else 'knave'}"
                     for i, (name, knight) in enumerate(zip(names, solution), start=1))


def evaluate(stmt: Statement, assignment: Sequence[bool]) -> bool:
    """Truth value of `stmt` when person i is a knight iff `assignment[i]`."""
    op = stmt[0]
    if op == "telling-truth":
        return bool(assignment[stmt[1]])
    if op == "lying":
        return not assignment[stmt[1]]
    if op == "not":
        if len(stmt) != 2:
            raise ValueError(f"'not' takes one operand: {stmt!r}")
        return not evaluate(stmt[1], assignment)
    if op == "and":
        return all(evaluate(s, assignment) for s in stmt[1:])
    if op == "or":
        return any(evaluate(s, assignment) for s in stmt[1:])
    if op == "->":
        if len(stmt) != 3:
            raise ValueError(f"'->' takes two operands: {stmt!r}")
        return (not evaluate(stmt[1], assignment)) or evaluate(stmt[2], assignment)
    if op == "<=>":
        if len(stmt) != 3:
            raise ValueError(f"'<=>' takes two operands: {stmt!r}")
        return evaluate(stmt[1], assignment) == evaluate(stmt[2], assignment)
    raise ValueError(f"unknown statement operator {op!r} in {stmt!r}")


def is_consistent(statements: Sequence[Optional[Statement]], assignment: Sequence[bool]) -> bool:
    """True when every speaker tells the truth exactly when a knight."""
    return all(stmt is None or evaluate(stmt, assignment) == bool(assignment[i])
               for i, stmt in enumerate(statements))


def solve(statements: Sequence[Optional[Statement]], num_people: Optional[int] = None) -> List[Tuple[bool, ...]]:
    """All consistent assignments, by trying the 2^N of them (N = `num_people`, default `len(statements)`).

    Returns tuples of bools (True = knight) in the order of `itertools.product([True, False], ...)`; a well-posed
    puzzle has exactly one.
    """
    n = len(statements) if num_people is None else int(num_people)
    if len(statements) > n:
        raise ValueError(f"solve: {len(statements)} statements for {n} people")
    if not 1 <= n <= MAX_PEOPLE:
        raise ValueError(f"solve: number of people must be within 1..{MAX_PEOPLE}, got {n}")
    padded = list(statements) + [None] * (n - len(statements))
    return [a for a in itertools.product((True, False), repeat=n) if is_consistent(padded, a)]


def parse_statements(text: str) -> List[Statement]:
    """The K&K dataset's `statements` column (a Python tuple literal) -> list of statements."""
    value = ast.literal_eval(text)
    if not isinstance(value, tuple) or not all(isinstance(s, tuple) for s in value):
        raise ValueError(f"not a tuple of statements: {text[:80]!r}")
    return list(value)


def statements_to_text(statements: Sequence[Statement]) -> str:
    """Inverse of `parse_statements`, in the same literal form as the K&K dataset's column."""
    return repr(tuple(statements))
