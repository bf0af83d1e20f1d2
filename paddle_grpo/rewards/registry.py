"""Reward functions by name: built-ins register themselves; users point at `module:function` or
`path/to/file.py:function`.

    @register_reward("my_reward")
    def my_reward(prompts, completions, **kwargs): ...

    get_reward_fn("kk")                      # a registered name
    get_reward_fn("my_pkg.rewards:score")    # an importable module
    get_reward_fn("rewards/mine.py:score")   # a file
    get_reward_fn("reward_model:path/to/rm") # a sequence-scoring model (reward_model.py), loaded here
"""
from typing import Callable, List, Optional, Union

from ..user_code import load_function
from .base import AnswerFn, RewardFn
from .reward_model import REWARD_MODEL_PREFIX, RewardModel

_REGISTRY = {}


def register_reward(name: str, max_score: Optional[float] = None,
                    extract_answer: Optional[AnswerFn] = None) -> Callable[[RewardFn], RewardFn]:
    """Decorator registering `fn(prompts, completions, **kwargs) -> list[float | None]` under `name`.

    `max_score`: the best score the function can give (kept as `fn.max_score`); the trainer's eval/accuracy is the
    share of samples that reach the maximum. `extract_answer`: `(prompts, completions, **kwargs) -> list[str |
    None]`, the final answer the function reads in each completion (kept as `fn.extract_answer`), which the
    evaluation's majority vote (eval/maj@n) counts. A user function may also set either attribute itself."""
    if not isinstance(name, str) or not name or ":" in name or "," in name:
        raise ValueError(f"reward name must be a non-empty string without ':' or ',', got {name!r}")

    def decorator(fn):
        if not callable(fn):
            raise TypeError(f"register_reward({name!r}) must decorate a callable, got {type(fn).__name__}")
        if name in _REGISTRY and _REGISTRY[name] is not fn:
            raise ValueError(f"a reward named {name!r} is already registered ({_REGISTRY[name]!r})")
        _REGISTRY[name] = fn
        if max_score is not None:
            fn.max_score = float(max_score)
        if extract_answer is not None:
            fn.extract_answer = extract_answer
        return fn

    return decorator


def unregister_reward(name: str) -> None:
    """Remove a registered reward (a test's or a notebook's own); an unknown name raises KeyError naming it."""
    if name not in _REGISTRY:
        raise KeyError(f"no reward named {name!r} is registered")
    del _REGISTRY[name]


def available_rewards() -> List[str]:
    """Sorted names of the registered reward functions."""
    return sorted(_REGISTRY)


def get_reward_fn(name_or_spec: Union[str, RewardFn]) -> RewardFn:
    """Resolve a registered name, `module:function`, `path/to/file.py:function` or `reward_model:<dir or hub ID>`
    (a RewardModel, loaded now so a bad model fails at start-up, not as failed samples) to the function.

    A callable is returned as it is. Errors say what was asked for and what went wrong (unknown name with the
    valid ones listed; the module or file that failed to import and why; a missing attribute)."""
    if callable(name_or_spec):
        return name_or_spec
    if not isinstance(name_or_spec, str) or not name_or_spec.strip():
        raise ValueError(f"a reward is given by name or 'module:function', got {name_or_spec!r}")
    spec = name_or_spec.strip()
    if spec.startswith(REWARD_MODEL_PREFIX):
        return RewardModel(spec[len(REWARD_MODEL_PREFIX):]).load()
    if ":" not in spec:
        if spec in _REGISTRY:
            return _REGISTRY[spec]
        raise KeyError(f"unknown reward {spec!r}; registered rewards: {', '.join(available_rewards())}; "
                       "or give 'module:function' / 'path/to/file.py:function'")
    return load_function(spec, "reward")

