"""Small shared pieces of the reward functions: the return type that can carry reasons, and text extraction.

Every reward function has the signature `fn(prompts, completions, **kwargs) -> list[float | None]`:
`kwargs` carries the references (`tgt`), any other dataset columns and `completion_ids`, and a function must
accept and ignore the ones it does not use.

How a sample's score combines with the other functions' (`RewardSet`):
- a number: `weight * number` enters the sample's weighted sum;
- `None` (plain, no reason): the function abstains on that sample ("not mine to judge", never "wrong"); its term is
  left out of the sum, as in TRL. The combined reward is None only when every function abstains;
- a failure: the function raised or timed out on that sample, returned something that is not a finite number, or
  returned None *with a reason* in `Scores.errors`. The sample's combined reward is None (the trainer leaves it
  out of the advantages and counts it in `train/reward_none_frac`), and the reason goes to the errors.
"""
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Union

# One completion: a string, or a chat (TRL's conversational format) whose last message holds the text.
Completion = Union[str, Dict[str, Any], Sequence[Dict[str, Any]]]
# fn(prompts, completions, **kwargs) -> one score (or None) per completion.
RewardFn = Callable[..., Sequence[Optional[float]]]
# A reward function's optional `extract_answer` attribute, called like it: the final answer the function reads in
# each completion, as a string that is equal for equal answers (None: it reads none). The evaluation's majority
# vote (eval/maj@n) counts these strings.
AnswerFn = Callable[..., Sequence[Optional[str]]]


class Scores(list):
    """A reward function's result that can also report per-sample failures.

    It is a plain list of floats/None (so it satisfies the common signature). `errors[i]` is a short reason why
    judging sample i failed, or None. A None score with a reason is a failure (the sample's combined reward becomes
    None, as if the function had raised on it alone); a None without one is an abstention (the term is skipped).
    `RewardSet` copies the reasons into the per-sample error report.
    """

    def __init__(self, values: Iterable[Optional[float]] = (),
                 errors: Optional[Iterable[Optional[str]]] = None) -> None:
        super().__init__(values)
        self.errors = list(errors) if errors is not None else [None] * len(self)
        if len(self.errors) != len(self):
            raise ValueError(f"Scores: {len(self)} values but {len(self.errors)} errors")


def completion_text(completion: Completion) -> str:
    """The text of one completion: a string as-is, or the content of the last message of a chat completion
    (TRL's conversational format `[{"role": "assistant", "content": ...}]`)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict) and isinstance(completion.get("content"), str):
        return completion["content"]
    if isinstance(completion, (list, tuple)) and completion and isinstance(completion[-1], dict):
        return completion_text(completion[-1])
    raise TypeError(f"a completion must be a string or a chat message list, got {type(completion).__name__}")


def references(tgt: Optional[Sequence[str]], completions: Sequence[Completion], reward_name: str) -> List[str]:
    """Check that `tgt` holds one string reference per completion and return it as a list."""
    if tgt is None:
        raise ValueError(f"{reward_name} needs the references: pass tgt=[...] (one per completion)")
    if isinstance(tgt, str):
        raise TypeError(f"{reward_name}: tgt must be a list of strings, got a single string")
    tgt = list(tgt)
    if len(tgt) != len(completions):
        raise ValueError(f"{reward_name}: {len(completions)} completions but {len(tgt)} references in tgt")
    return tgt
