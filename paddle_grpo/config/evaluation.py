"""EvalArguments: held-out evaluation during training."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .fields import arg


@dataclass
class EvalArguments:
    do_eval: bool = arg(False, "Evaluate on eval_datasets every eval_steps.")
    per_device_eval_batch_size: int = arg(32, "Prompts per evaluation generation call.")
    evaluation_strategy: str = arg("steps", "When to evaluate: steps or no.", choices=("steps", "no"))
    eval_steps: int = arg(20, "Evaluate every this many steps.")
    eval_max_reward: Optional[float] = arg(None, "(new) The reward that counts as a correct answer in "
                                                "eval/accuracy; default: the maximum the reward functions "
                                                "declare (from the server's /health when use_rm_server).")
    eval_do_sample: bool = arg(False, "(new) Sample at evaluation (with temperature/top_p/top_k) instead of greedy.")
