"""The algorithm core: pure functions on paddle tensors (no I/O, no paddle.distributed, no model code).

  advantages.py     advantage estimators by name: grpo (+ Dr.GRPO), reinforce_plus_plus(_baseline), rloo
  kl.py             per-token KL estimators k1 / k2 / k3
  losses.py         clipped policy losses by name (token-level, GSPO; dual-clip), loss aggregation,
                    log-probs and entropy from logits
  normalization.py  running reward normalisation (Chan), advantage whitening
  shaping.py        combining reward functions, reward clipping, DAPO overlong penalty
  registry.py       the name -> function registries; _common.py: dtype / mask helpers
The formulas are those of the project's ALGORITHMS.md, sections 1-5. Every batch statistic is over the batch passed
in, so the trainer passes the global (all-rank) batch.
"""
from .advantages import (
    ADVANTAGE_ESTIMATORS,
    available_advantage_estimators,
    get_advantage_estimator,
    register_advantage_estimator,
    scalar_to_token_level,
)
from .kl import KL_ESTIMATORS, kl_penalty
from .losses import (
    IMPORTANCE_SAMPLING_LEVELS,
    LOSS_AGG_MODES,
    aggregate_loss,
    available_policy_losses,
    compute_policy_loss,
    entropy_from_logits,
    get_policy_loss,
    global_denominators,
    logprobs_from_logits,
    masked_mean,
    register_policy_loss,
)
from .normalization import RunningRewardNormalizer, normalize_advantage
from .registry import UnknownNameError
from .shaping import clip_reward, combine_rewards, overlong_penalty

POLICY_LOSSES = available_policy_losses()

__all__ = [
    "ADVANTAGE_ESTIMATORS", "IMPORTANCE_SAMPLING_LEVELS", "KL_ESTIMATORS", "LOSS_AGG_MODES", "POLICY_LOSSES",
    "RunningRewardNormalizer", "UnknownNameError",
    "aggregate_loss", "available_advantage_estimators", "available_policy_losses", "clip_reward", "combine_rewards",
    "compute_policy_loss", "entropy_from_logits", "get_advantage_estimator", "get_policy_loss",
    "global_denominators", "kl_penalty", "logprobs_from_logits", "masked_mean", "normalize_advantage",
    "overlong_penalty", "register_advantage_estimator", "register_policy_loss", "scalar_to_token_level",
]
