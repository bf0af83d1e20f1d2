"""Similarity-to-reference rewards (seed 000's summarisation rewards).

rouge_l          : ROUGE-L F1 of the completion against `tgt`, from the `rouge_score` package (its default
                   tokenizer: lowercase, runs of [a-z0-9]; no stemming). Text without latin letters or digits
                   (e.g. Chinese) has no tokens there and scores 0.
length_similarity: min(words_c, words_t) / max(words_c, words_t), words split on whitespace; 1.0 when both are
                   empty. It rewards a completion as long as the reference, whatever it says.
Both are in [0, 1].
"""
import threading
from typing import Any, List, Optional, Sequence

from .base import Completion, completion_text, references
from .registry import register_reward

_scorer = None
_scorer_lock = threading.Lock()


def _rouge_scorer():
    # Imported on first use: rouge_score pulls in nltk (~1.5 s), which the server should not pay at start-up.
    global _scorer
    with _scorer_lock:
        if _scorer is None:
            from rouge_score import rouge_scorer
            _scorer = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=False)
        return _scorer


@register_reward("rouge_l", max_score=1.0)
def rouge_l(prompts: Sequence[Any], completions: Sequence[Completion], tgt: Optional[Sequence[str]] = None,
            **kwargs: Any) -> List[float]:
    """ROUGE-L F1 against the reference, in [0, 1]."""
    refs = references(tgt, completions, "rouge_l")
    scorer = _rouge_scorer()
    return [scorer.score(ref, completion_text(c))["rougeL"].fmeasure for c, ref in zip(completions, refs)]


def length_ratio(text: str, ref: str) -> float:
    """min/max of the two texts' word counts (1.0 when both are empty)."""
    n, m = len(text.split()), len(ref.split())
    return 1.0 if max(n, m) == 0 else min(n, m) / max(n, m)


@register_reward("length_similarity", max_score=1.0)
def length_similarity(prompts: Sequence[Any], completions: Sequence[Completion],
                      tgt: Optional[Sequence[str]] = None, **kwargs: Any) -> List[float]:
    """min/max ratio of the word counts of completion and reference, in [0, 1]."""
    refs = references(tgt, completions, "length_similarity")
    return [length_ratio(completion_text(c), ref) for c, ref in zip(completions, refs)]
