"""Small shared pieces of the reward functions: the return type that can carry reasons, and text extraction.

Every reward function has the signature `fn(prompts, completions, **kwargs) -> list[float | None]`:
`kwargs` carries the references (`tgt`), any other dataset columns and `completion_ids`, and a function must
accept and ignore the ones it does not use. `None` means "cannot judge this sample", never "wrong".
"""


class Scores(list):
    """A reward function's result that can also say why some samples are None.

    It is a plain list of floats/None (so it satisfies the common signature); `errors[i]` is a short reason for
    `self[i] is None`, or None. `RewardSet` copies the reasons into the per-sample error report.
    """

    def __init__(self, values=(), errors=None):
        super().__init__(values)
        self.errors = list(errors) if errors is not None else [None] * len(self)
        if len(self.errors) != len(self):
            raise ValueError(f"Scores: {len(self)} values but {len(self.errors)} errors")


def completion_text(completion):
    """The text of one completion: a string as-is, or the content of the last message of a chat completion
    (TRL's conversational format `[{"role": "assistant", "content": ...}]`)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict) and isinstance(completion.get("content"), str):
        return completion["content"]
    if isinstance(completion, (list, tuple)) and completion and isinstance(completion[-1], dict):
        return completion_text(completion[-1])
    raise TypeError(f"a completion must be a string or a chat message list, got {type(completion).__name__}")


def references(tgt, completions, reward_name):
    """Check that `tgt` holds one string reference per completion and return it as a list."""
    if tgt is None:
        raise ValueError(f"{reward_name} needs the references: pass tgt=[...] (one per completion)")
    if isinstance(tgt, str):
        raise TypeError(f"{reward_name}: tgt must be a list of strings, got a single string")
    tgt = list(tgt)
    if len(tgt) != len(completions):
        raise ValueError(f"{reward_name}: {len(completions)} completions but {len(tgt)} references in tgt")
    return tgt
