"""CriticArguments: the value model of PPO and VAPO (PaddleNLP's critic_* keys)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .fields import LR_SCHEDULERS, arg

# critic_<key> left unset (null) takes the policy's <key>, as PaddleNLP's `create_critic_trainer` copies the actor's
# arguments and overrides only the critic_* keys that are set (Config.critic_setting resolves them).
CRITIC_INHERITS = {"critic_learning_rate": "learning_rate", "critic_min_learning_rate": "min_learning_rate",
                   "critic_lr_scheduler_type": "lr_scheduler_type", "critic_weight_decay": "weight_decay",
                   "critic_warmup_ratio": "warmup_ratio"}


@dataclass
class CriticArguments:
    """PaddleNLP's PPO / VAPO keys: the critic (value model) of the estimators that need values (rl_algorithm ppo,
    vapo). With another rl_algorithm they have no effect, and each key set says so in one line. An optimizer key
    left unset (null) takes the policy's value, as in PaddleNLP."""
    critic_model_name_or_path: str = arg("", "The critic (value model): a local directory or a hub ID, resolved as "
                                             "actor_model_name_or_path is. A critic checkpoint (a run's "
                                             "checkpoint-N/critic) or PaddleNLP score model loads with its head, a "
                                             "reward model directory with its score head as the value head, a "
                                             "causal LM with a new value head initialised to zeros (policy/"
                                             "critic.py; the start-up log and --dry_run say which). "
                                             "It must share the policy's vocabulary (it reads the policy's token "
                                             "ids). Required by rl_algorithm ppo and vapo.")
    critic_learning_rate: Optional[float] = arg(None, "Peak learning rate of the critic's AdamW. Unset (null): "
                                                      "learning_rate, as in PaddleNLP.")
    critic_min_learning_rate: Optional[float] = arg(None, "Floor of the critic's learning-rate decay (linear, "
                                                          "cosine), as min_learning_rate for the policy; at most "
                                                          "the critic's learning rate. Unset (null): "
                                                          "min_learning_rate.")
    critic_lr_scheduler_type: Optional[str] = arg(None, "The critic's learning-rate schedule after warm-up. Unset "
                                                        "(null): lr_scheduler_type, as in PaddleNLP.",
                                                  choices=LR_SCHEDULERS)
    critic_weight_decay: Optional[float] = arg(None, "The critic's AdamW weight decay. Unset (null): weight_decay, "
                                                     "as in PaddleNLP.")
    critic_warmup_ratio: Optional[float] = arg(None, "The critic's linear warm-up, as a fraction of its optimizer "
                                                     "steps. Unset (null): the policy's warm-up (warmup_steps, else "
                                                     "warmup_ratio of the critic's optimizer steps), as in "
                                                     "PaddleNLP.")
    pretrain_critic_steps: Optional[int] = arg(None, "VAPO's value pretraining: for the first this many steps only "
                                                     "the critic is updated (the policy keeps its weights; its "
                                                     "learning-rate schedule spans the steps after them). Unset "
                                                     "(null): the estimator's default, 50 for rl_algorithm vapo (the "
                                                     "paper's and PaddleNLP's VAPO file), else 0.")
