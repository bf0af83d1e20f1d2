"""GSM8K final-answer reward: 1.0 when the completion's final answer equals the reference, else 0.0.

Reference (`tgt`): the line after the last `####` (GSM8K's answer format) or, without one, the whole string (a bare
number). Completion's answer, first that applies: the line after the last `####`; the last `\\boxed{...}`; the
last number in the text ("... the answer is 42."). A plain number is passed on with its thousands separators
dropped ("1,000" == 1000); anything else goes to math-verify as text, which extracts the expression. The two are
compared with math-verify (`parse`, `verify`), so "0.5", "1/2" and "\\frac{1}{2}" agree.

A completion with no answer at all scores 0.0 (a wrong answer, not "cannot judge"). Each check runs in a killable
child process with a time limit (`math_verify_pool.py`); a check that exceeds it gives None with the reason, which
counts as a failure (the sample's combined reward is None, see base.py), not as an abstention.
"""
import re
from typing import Any, List, Optional, Sequence

from .base import Completion, RewardFn, Scores, completion_text, references
from .math_verify_pool import MathVerifyPool, default_pool
from .registry import register_reward

DEFAULT_TIMEOUT_S = 5.0
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def _normalise_number(text):
    return text.replace(",", "").rstrip(".")


def gold_answer(tgt: str) -> str:
    """The reference answer as a string for math-verify; ValueError when there is none."""
    text = tgt.rsplit("####", 1)[-1].strip()
    text = text.splitlines()[0].strip() if text else ""
    number = _NUMBER.fullmatch(text.replace("$", "").strip())
    if number:
        return _normalise_number(number.group(0))
    if not text:
        raise ValueError(f"gsm8k: no answer in the reference {tgt[-200:]!r}")
    return text  # an expression: math-verify finds it in the text ("1/2", "\\frac{1}{2}", "$x=5$")


def last_boxed(text: str) -> Optional[str]:
    """The content of the last `\\boxed{...}` (balanced braces), or None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 0, start + len("\\boxed")
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1:j]
    return None  # unbalanced: treat as no boxed answer


def completion_answer(text: str) -> Optional[str]:
    """The completion's final answer as a string for math-verify, or None when it gives none."""
    if "####" in text:
        tail = text.rsplit("####", 1)[1].strip()
        line = tail.splitlines()[0].strip() if tail else ""
        number = _NUMBER.fullmatch(line.replace("$", "").strip().rstrip("."))
        if number:
            return _normalise_number(number.group(0))
        return line or None  # "72 apples", "1/2": math-verify extracts the expression from the text
    boxed = last_boxed(text)
    if boxed is not None and boxed.strip():
        number = _NUMBER.fullmatch(boxed.replace("\\$", "").replace("$", "").strip())
        return _normalise_number(number.group(0)) if number else f"\\boxed{{{boxed}}}"
    numbers = _NUMBER.findall(text)
    return _normalise_number(numbers[-1]) if numbers else None


def gsm8k_answers(prompts: Sequence[Any], completions: Sequence[Completion], **kwargs: Any) -> List[Optional[str]]:
    """The final answer `gsm8k` compares in each completion (`completion_answer`; None: it gives none): its
    `extract_answer`, for the evaluation's majority vote. Equal strings are equal answers ("0.5" and "1/2" vote
    apart, though math-verify would score both right)."""
    return [completion_answer(completion_text(c)) for c in completions]


def make_gsm8k_reward(timeout_s: float = DEFAULT_TIMEOUT_S, pool: Optional[MathVerifyPool] = None) -> RewardFn:
    """A GSM8K reward with a per-sample time limit of `timeout_s` seconds; `pool` defaults to the shared one."""

    def gsm8k(prompts: Sequence[Any], completions: Sequence[Completion], tgt: Optional[Sequence[str]] = None,
              **kwargs: Any) -> Scores:
        refs = references(tgt, completions, "gsm8k")
        golds = [gold_answer(ref) for ref in refs]
        preds = [completion_answer(completion_text(c)) for c in completions]
        todo = [i for i, pred in enumerate(preds) if pred is not None]
        values, errors = [0.0] * len(preds), [None] * len(preds)
        if todo:
            checked = (pool or default_pool()).verify_many([(golds[i], preds[i]) for i in todo], timeout_s)
            for i, (ok, reason) in zip(todo, checked):
                values[i] = None if ok is None else float(ok)
                errors[i] = reason
        return Scores(values, errors)

    gsm8k.__doc__ = f"GSM8K final-answer reward via math-verify: 1.0 / 0.0, {timeout_s:g} s limit per sample."
    gsm8k.extract_answer = gsm8k_answers
    return gsm8k


gsm8k = register_reward("gsm8k", max_score=1.0)(make_gsm8k_reward())

_FORMAT_LINE = re.compile(r"####\s*\$?-?\d[\d,]*(?:\.\d+)?\.?\s*")


@register_reward("gsm8k_format", max_score=1.0)
def gsm8k_format(prompts: Sequence[Any], completions: Sequence[Completion], **kwargs: Any) -> List[float]:
    """1.0 when the completion's last non-empty line is `#### <number>` (the strict-match format of GSM8K
    evaluation), else 0.0. The `gsm8k` reward also accepts a bare last number, so on its own it never teaches the
    format; combined with a small weight (`reward_funcs: gsm8k,gsm8k_format`, `reward_weights: [1.0, 0.2]`) it does."""
    out = []
    for c in completions:
        lines = [line for line in completion_text(c).splitlines() if line.strip()]
        out.append(1.0 if lines and _FORMAT_LINE.fullmatch(lines[-1].strip()) else 0.0)
    return out
