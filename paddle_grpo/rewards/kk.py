"""Knights-and-Knaves reward, scored exactly as PaddleNLP's reward server scores it.

    format  +1   `<think>`, `</think>`, `<answer>`, `</answer>` each occur exactly once, in that order; else -1
    answer  +2   every person's knight/knave status in the last `<answer>` block matches the ground truth
            -1.5 the answer parses (every person has one status) but does not match
            -2   the answer cannot be parsed, there is none, or the format failed
    total = format + answer: 3, -0.5, -1 or -3.

The K&K prompts end inside the think block (`...<|im_start|>assistant\\n<think>`), so a response without `<think>`
gets it prepended before the format check, as PaddleNLP does.

The ground truth comes from `tgt` ("(1) Michael is a knight\\n(2) Zoey is a knave", or the one-line
"Michael is a knight, and Zoey is a knave."). Reading the answer: for every occurrence of a person's name (whole
word, any capitalisation), the first "knight"/"knave" after it and before the next name is that person's status; so
order, numbering, capitals and whitespace do not matter. A person never given a status, or given two different
ones, makes the answer unparseable. Negations ("X is not a knight") are not understood: the model is asked for
"X is a knight/knave" statements.
"""
import re
from typing import Any, Dict, Iterable, List, Optional, Sequence

from .base import Completion, completion_text, references
from .registry import register_reward

FORMAT_OK, FORMAT_BAD = 1.0, -1.0
ANSWER_CORRECT, ANSWER_WRONG, ANSWER_UNPARSED = 2.0, -1.5, -2.0
TAGS = ("<think>", "</think>", "<answer>", "</answer>")

_TRUTH = re.compile(r"([^\W\d_][\w'-]*)\s+is\s+an?\s+(knight|knave)\b", re.IGNORECASE)
_ROLE = re.compile(r"\b(knight|knave)s?\b", re.IGNORECASE)


def parse_ground_truth(tgt: str) -> Dict[str, str]:
    """{lowercased name: "knight" | "knave"} from a reference; ValueError when it names nobody or contradicts itself."""
    truth = {}
    for name, role in _TRUTH.findall(tgt):
        name, role = name.lower(), role.lower()
        if truth.setdefault(name, role) != role:
            raise ValueError(f"the reference gives {name!r} two statuses: {tgt!r}")
    if not truth:
        raise ValueError(f"cannot read any 'NAME is a knight/knave' from the reference {tgt[:200]!r}")
    return truth


def format_ok(text: str) -> bool:
    """True when each of the four tags occurs exactly once and they come in order."""
    positions = []
    for tag in TAGS:
        if text.count(tag) != 1:
            return False
        positions.append(text.index(tag))
    return positions == sorted(positions)


def last_answer(text: str) -> Optional[str]:
    """The text inside the last `<answer>...</answer>` block, or None."""
    start = text.rfind("<answer>")
    if start < 0:
        return None
    start += len("<answer>")
    end = text.find("</answer>", start)
    return None if end < 0 else text[start:end]


def parse_answer(answer: str, names: Iterable[str]) -> Optional[Dict[str, str]]:
    """{name: role} for every name in `names` (lowercase) read from the answer text, or None when some person has
    no status or two different ones."""
    occurrences = []
    for name in names:
        pattern = r"(?<!\w)" + re.escape(name) + r"(?!\w)"
        occurrences += [(m.start(), m.end(), name) for m in re.finditer(pattern, answer, re.IGNORECASE)]
    occurrences.sort()
    roles = {}
    for i, (_, end, name) in enumerate(occurrences):
        window_end = occurrences[i + 1][0] if i + 1 < len(occurrences) else len(answer)
        match = _ROLE.search(answer, end, window_end)
        if match:
            roles.setdefault(name, set()).add(match.group(1).lower())
    if any(len(roles.get(name, ())) != 1 for name in names):
        return None
    return {name: next(iter(roles[name])) for name in names}


def kk_score(response: str, tgt: str) -> float:
    """PaddleNLP's K&K score of one response against one reference: 3, -0.5, -1 or -3."""
    truth = parse_ground_truth(tgt)
    text = response if "<think>" in response else "<think>" + response
    if not format_ok(text):
        return FORMAT_BAD + ANSWER_UNPARSED
    answer = last_answer(text)
    parsed = None if answer is None else parse_answer(answer, truth)
    if parsed is None:
        return FORMAT_OK + ANSWER_UNPARSED
    return FORMAT_OK + (ANSWER_CORRECT if parsed == truth else ANSWER_WRONG)


def kk_answers(prompts: Sequence[Any], completions: Sequence[Completion], tgt: Optional[Sequence[str]] = None,
               **kwargs: Any) -> List[Optional[str]]:
    """The answer `kk` reads in each completion, as `"ann is a knight; bob is a knave"` (the reference's people,
    by name), or None where it reads none (the format failed, or the answer gives someone no status or two): its
    `extract_answer`, for the evaluation's majority vote."""
    refs = references(tgt, completions, "kk")
    out: List[Optional[str]] = []
    for c, ref in zip(completions, refs):
        text = completion_text(c)
        text = text if "<think>" in text else "<think>" + text
        answer = last_answer(text) if format_ok(text) else None
        parsed = None if answer is None else parse_answer(answer, parse_ground_truth(ref))
        out.append(None if parsed is None else "; ".join(f"{name} is a {parsed[name]}" for name in sorted(parsed)))
    return out


@register_reward("kk", max_score=3.0, extract_answer=kk_answers)
def kk(prompts: Sequence[Any], completions: Sequence[Completion], tgt: Optional[Sequence[str]] = None,
       **kwargs: Any) -> List[float]:
    """Knights-and-Knaves reward (PaddleNLP's rules): 3, -0.5, -1 or -3 per completion."""
    refs = references(tgt, completions, "kk")
    return [kk_score(completion_text(c), ref) for c, ref in zip(completions, refs)]
