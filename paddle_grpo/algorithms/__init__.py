"""The algorithm core: pure functions on paddle tensors (no I/O, no paddle.distributed, no model code).

  advantages.py     advantage estimators by name: grpo (+ Dr.GRPO), reinforce_plus_plus(_baseline), rloo
  gae.py            critic estimators: ppo (GAE), vapo (decoupled, length-adaptive GAE); PaddleNLP's PPO reward
                    with the per-token KL (kl_token_rewards)
  value_loss.py     the critic's clipped value loss, explained variance, VAPO's positive-example rows
  kl.py             per-token KL estimators k1 / k2 / k3
  losses.py         clipped policy losses by name (token-level, GSPO; dual-clip), loss aggregation,
                    log-probs and entropy from logits
  policy_losses.py  CISPO, GMPO (geo_mean), SAPO
  covariance_losses.py  Clip-Cov, KL-Cov (the tokens of largest log-prob / advantage covariance)
  entropy_control.py  the adaptive entropy coefficient toward a target entropy (Skywork-OR1)
  distillation.py   on-policy distillation: the teacher's per-token reverse KL in the advantages (slime), or
                    the exact reverse KL over the vocabulary as a loss term (GKD)
  normalization.py  running reward normalisation (Chan), advantage whitening
  pass_at_k.py      evaluation with n samples per problem: the unbiased pass@k (Chen et al.), the majority vote
  rollout_correction.py  importance weights of the sampler's log-probs against the trainer's: TIS / MIS at the
                    token, sequence or geometric level; the off-policy diagnostics (KL, ESS, perplexity ratio)
  shaping.py        reward clipping, DAPO overlong penalty (combining reward functions: rewards.RewardSet)
  schedule.py       the learning-rate schedule (warm-up, constant / linear / cosine, decay floor)
  registry.py       the name -> spec registries: what each estimator / loss needs and where its KL goes
  _common.py        dtype / mask helpers, last-axis gathers that do not copy the whole tensor
The config reads its choices from this package (rl_algorithm, importance_sampling_level, policy_loss from the
registries; kl_estimator, kl_loss_estimator, loss_agg_mode, rollout_correction, rollout_correction_level,
opd_kl_estimator from KL_ESTIMATORS, LOSS_AGG_MODES, ROLLOUT_CORRECTIONS, ROLLOUT_CORRECTION_LEVELS,
OPD_KL_ESTIMATORS), so nothing else lists them.
The formulas are those of docs/algorithms.md, sections 1-5 and 8. Every batch statistic is over the batch passed
in, so the trainer passes the global (all-rank) batch.
"""
from .advantages import (
    advantage_estimator_spec,
    available_advantage_estimators,
    get_advantage_estimator,
    register_advantage_estimator,
    reward_kl_coeff,
    scalar_to_token_level,
    unregister_advantage_estimator,
)
from .gae import gae_advantage, kl_token_rewards, vapo_advantage, vapo_policy_lambda  # registers ppo, vapo
from .kl import KL_ESTIMATORS, kl_penalty
from .losses import (
    LOSS_AGG_MODES,
    aggregate_loss,
    available_policy_losses,
    compute_policy_loss,
    entropy_from_logits,
    get_policy_loss,
    global_denominators,
    importance_sampling_levels,
    logprobs_from_logits,
    masked_mean,
    policy_loss_spec,
    register_policy_loss,
    resolve_policy_loss,
    unregister_policy_loss,
)
from .policy_losses import cispo_policy_loss, gmpo_policy_loss, sapo_policy_loss  # registers cispo, gmpo, sapo
from .covariance_losses import clip_cov_policy_loss, kl_cov_policy_loss, token_covariance  # clip_cov, kl_cov
from .entropy_control import adaptive_entropy_coeff
from .distillation import OPD_KL_ESTIMATORS
from ._common import gather_last, subtract_at
from .schedule import lr_lambda
from .normalization import RunningRewardNormalizer, normalize_advantage
from .pass_at_k import majority_answer, majority_correct, pass_at_k, pass_at_k_sizes
from .rollout_correction import (ROLLOUT_CORRECTION_LEVELS, ROLLOUT_CORRECTIONS, effective_sample_size,
                                 rollout_correction)
from .registry import EstimatorSpec, PolicyLossSpec, UnknownNameError
from .shaping import clip_reward, overlong_penalty
from .value_loss import explained_variance, positive_example_mask, value_loss

__all__ = [
    "EstimatorSpec", "KL_ESTIMATORS", "LOSS_AGG_MODES", "OPD_KL_ESTIMATORS", "PolicyLossSpec",
    "ROLLOUT_CORRECTION_LEVELS",
    "adaptive_entropy_coeff", "cispo_policy_loss", "clip_cov_policy_loss", "gmpo_policy_loss", "kl_cov_policy_loss",
    "resolve_policy_loss", "sapo_policy_loss", "token_covariance",
    "ROLLOUT_CORRECTIONS",
    "RunningRewardNormalizer",
    "UnknownNameError",
    "advantage_estimator_spec", "aggregate_loss", "available_advantage_estimators", "available_policy_losses",
    "clip_reward", "compute_policy_loss", "effective_sample_size", "entropy_from_logits", "explained_variance",
    "gae_advantage",
    "gather_last", "get_advantage_estimator", "get_policy_loss",
    "global_denominators", "importance_sampling_levels", "kl_penalty", "kl_token_rewards", "logprobs_from_logits",
    "lr_lambda", "majority_answer", "majority_correct", "masked_mean", "normalize_advantage", "overlong_penalty",
    "pass_at_k", "pass_at_k_sizes", "policy_loss_spec",
    "positive_example_mask", "register_advantage_estimator",
    "register_policy_loss", "reward_kl_coeff", "rollout_correction", "scalar_to_token_level",
    "unregister_advantage_estimator",
    "subtract_at", "unregister_policy_loss", "value_loss", "vapo_advantage", "vapo_policy_lambda",
]
