"""Format rewards for an answer wrapped in `<answer>...</answer>` (seed 001's loose and strict rewards).

loose  : somewhere in the completion an opening tag is followed, later, by a closing tag with at least one
         character between them (seed 001: `^.*<answer>(.+)</answer>.*$`, any text around it).
strict : the whole completion, ignoring surrounding whitespace, is one `<answer>X</answer>` whose X is not blank,
         and each tag occurs once.
Seed 001's regexes had no DOTALL, so any completion with a newline (a multi-line answer, reasoning on the line
before, a trailing newline) failed both; that looks accidental, and here newlines are ordinary characters.
Seed 001 paid 5 (loose) and 10 (strict); the registered defaults pay 1.0 / 0.0 so they mix with weights, and
`make_tag_format_reward(match_score=5)` reproduces the seed.
"""
from typing import Any, List, Sequence

from .base import Completion, RewardFn, completion_text
from .registry import register_reward


def loose_match(text: str, open_tag: str, close_tag: str) -> bool:
    """An opening tag, later a closing tag, at least one character between them."""
    start = text.find(open_tag)
    return start >= 0 and text.rfind(close_tag) > start + len(open_tag)


def strict_match(text: str, open_tag: str, close_tag: str) -> bool:
    """The whole (stripped) text is one `<tag>X</tag>` with a non-blank X."""
    text = text.strip()
    return (text.startswith(open_tag) and text.endswith(close_tag) and text.count(open_tag) == 1
            and text.count(close_tag) == 1 and bool(text[len(open_tag):-len(close_tag)].strip()))


def make_tag_format_reward(tag: str = "answer", strict: bool = False, match_score: float = 1.0,
                           miss_score: float = 0.0) -> RewardFn:
    """A reward paying `match_score` when a completion has the `<tag>...</tag>` format, else `miss_score`."""
    if not isinstance(tag, str) or not tag or any(c in tag for c in "<>/ \n\t"):
        raise ValueError(f"tag must be a bare tag name like 'answer', got {tag!r}")
    open_tag, close_tag = f"<{tag}>", f"</{tag}>"
    match = strict_match if strict else loose_match

    def tag_format(prompts: Sequence[Any], completions: Sequence[Completion], **kwargs: Any) -> List[float]:
        return [float(match_score) if match(completion_text(c), open_tag, close_tag) else float(miss_score)
                for c in completions]

    tag_format.__name__ = "tag_format_strict" if strict else "tag_format"
    tag_format.max_score = float(max(match_score, miss_score))
    tag_format.__doc__ = (f"{'Strict' if strict else 'Loose'} <{tag}> format reward: "
                          f"{match_score} when it matches, else {miss_score}.")
    return tag_format


tag_format = register_reward("tag_format")(make_tag_format_reward())
tag_format_strict = register_reward("tag_format_strict")(make_tag_format_reward(strict=True))
