"""Reward functions (a registry by name), their weighted combination, and the reward-server client.

Every reward function: `fn(prompts, completions, **kwargs) -> list[float | None]`, where kwargs carry `tgt`, other
dataset columns and `completion_ids` (accept and ignore what you do not use). Built-ins: kk, gsm8k, tag_format,
tag_format_strict, rouge_l, length_similarity; a sequence-scoring reward model (`RewardModel`, spec
`reward_model:<dir>`). Nothing here imports paddle at import time; heavy libraries load on first use.
"""
from .registry import available_rewards, get_reward_fn, register_reward, unregister_reward
from .base import RewardFn, Scores, completion_text
from . import gsm8k, kk, rouge, tag_format  # noqa: F401  (registers the built-ins)
from .tag_format import make_tag_format_reward
from .gsm8k import make_gsm8k_reward
from .combine import RewardResult, RewardSet
from .reward_model import RewardModel

__all__ = [
    "available_rewards", "get_reward_fn", "register_reward", "unregister_reward", "RewardFn", "Scores",
    "completion_text", "make_tag_format_reward", "make_gsm8k_reward", "RewardResult", "RewardSet",
    "RewardModel",
]
