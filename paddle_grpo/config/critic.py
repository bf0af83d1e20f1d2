"""CriticArguments: the value model of PPO and VAPO (PaddleNLP's critic_* keys)."""
from __future__ import annotations

from dataclasses import dataclass

from .fields import LR_SCHEDULERS, arg


@dataclass
class CriticArguments:
    """PaddleNLP's PPO / VAPO keys: the critic (value model) of the estimators that need values (rl_algorithm ppo,
    vapo). With another rl_algorithm they have no effect, and each key set says so in one line."""
    critic_model_name_or_path: str = arg("", "The critic (value model): a local directory or a hub ID, resolved as "
                                             "actor_model_name_or_path is. A critic checkpoint (a run's "
                                             "checkpoint-N/critic) or PaddleNLP score model loads with its head, a "
                                             "reward model directory with its score head as the value head, a "
                                             "causal LM with a new value head initialised to zeros (policy/"
                                             "critic.py; the start-up log and --dry_run say which). "
                                             "It must share the policy's vocabulary (it reads the policy's token "
                                             "ids). Required by rl_algorithm ppo and vapo.")
    critic_learning_rate: float = arg(5e-7, "Peak learning rate of the critic's AdamW.")
    critic_min_learning_rate: float = arg(0.0, "Floor of the critic's learning-rate decay (linear, cosine), as "
                                               "min_learning_rate for the policy; at most critic_learning_rate.")
    critic_lr_scheduler_type: str = arg("constant", "The critic's learning-rate schedule after warm-up.",
                                        choices=LR_SCHEDULERS)
    critic_weight_decay: float = arg(0.01, "The critic's AdamW weight decay.")
    critic_warmup_ratio: float = arg(0.0, "The critic's linear warm-up, as a fraction of its optimizer steps.")
    pretrain_critic_steps: int = arg(0, "VAPO's value pretraining: for the first this many steps only the critic "
                                        "is updated (the policy keeps its weights).")
