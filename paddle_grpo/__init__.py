"""paddle_grpo: GRPO / REINFORCE++ reinforcement learning for PaddlePaddle / PaddleNLP language models.

The public API is `__all__` below: what tools, recipes and users import (`from paddle_grpo import Trainer`). The
layout and what each folder may import: docs/architecture.md. Names are imported on first use (PEP 562), so
`import paddle_grpo.config` or the reward server does not pay for paddle and PaddleNLP.
"""

import importlib
import warnings
from typing import Any

__version__ = "0.1.0"

# Known-harmless warnings of third-party packages, silenced here, before any of them is imported, so that a run's
# first lines are its own. Each names its package and why it does not concern this project.
# paddle.utils.cpp_extension (imported by paddle itself) warns that ccache is missing: it concerns compiling
# custom ops, which this project has none of.
warnings.filterwarnings("ignore", message="No ccache found")
# setuptools' distutils shim, triggered when PaddleNLP's dependencies import distutils.
warnings.filterwarnings("ignore", message="Setuptools is replacing distutils")
# PaddleNLP 3.0.0b4's Qwen2 MLP calls paddle.incubate's swiglu, deprecated in paddle 3.3 (same kernel); once per run.
warnings.filterwarnings("ignore", message=r"(?s).*paddle\.incubate\.nn\.functional\.swiglu")

# public name -> the module that defines it
_EXPORTS = {
    # configuration
    "Config": "config", "ConfigError": "config", "load_config": "config", "parse_args": "config",
    "config_from_dict": "config",
    # data
    "DataError": "data", "PromptSampler": "data", "apply_chat_template": "data", "read_jsonl": "data",
    "read_json_rows": "data", "write_jsonl": "data",
    # rewards
    "RewardSet": "rewards", "RewardResult": "rewards", "Scores": "rewards", "available_rewards": "rewards",
    "get_reward_fn": "rewards", "register_reward": "rewards", "RewardClient": "rewards.client",
    "RewardServerError": "rewards.client", "make_rewarder": "rewards.client",
    # algorithms (more in paddle_grpo.algorithms)
    "get_advantage_estimator": "algorithms", "register_advantage_estimator": "algorithms",
    "compute_policy_loss": "algorithms", "kl_penalty": "algorithms", "aggregate_loss": "algorithms",
    # the model, sampling and parallelism
    "Policy": "policy", "load_policy": "policy", "load_tokenizer": "policy", "Rollout": "rollout",
    "generate": "policy.causal", "row_keys": "rollout.sampling", "ParallelContext": "parallel",
    # the step and the trainer
    "Batch": "step", "TrainingError": "step", "Trainer": "trainer", "train": "trainer",
}

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'paddle_grpo' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
