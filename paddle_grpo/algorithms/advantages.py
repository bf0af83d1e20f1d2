"""Advantage estimators: `(token_level_rewards, response_mask, index, **options) -> (advantages, returns)`.

Shapes: `token_level_rewards`, `response_mask`, `advantages`, `returns` are `[bs, T]`; `index` is a length-`bs`
sequence (list, numpy array or paddle int tensor; any hashable ids) of group ids - completions of one prompt share
an id, groups may differ in size and need not be contiguous. Outputs are float32 (float64 if an input is float64)
and exactly 0 on masked positions.

Every estimator normalises over the batch it is given, so the trainer must pass the GLOBAL batch (all data-parallel
ranks gathered): per-rank groups or per-rank whitening would change the result with the number of ranks.

Rows with no valid token (e.g. a sample whose combined reward is None, see `paddle_grpo.rewards.RewardSet`, whose
mask row the trainer zeroed) take no part in any statistic and get advantage 0.

Options an estimator does not know raise `TypeError`: an option meant for another estimator (say `kl_coeff` for
`grpo`) is a config error, not something to ignore silently.
"""
from typing import Any, Callable, Optional, Sequence, Tuple

import numpy as np
import paddle

from ._common import TensorLike, as_float, as_mask, check_same_shape, compute_dtype, masked, masked_centered_var
from .kl import KL_ESTIMATORS, kl_penalty
from .registry import EstimatorSpec, Registry, unknown_name

_ESTIMATORS = Registry("advantage estimator", EstimatorSpec)


def register_advantage_estimator(name: str, *, kl_in_reward: str = "sequence", config_options: Sequence[Any] = (),
                                 min_group_size: int = 1, uses_groups: bool = True,
                                 normalization_keys: bool = True, needs_values: bool = False,
                                 key_defaults: Sequence[Tuple[str, Any]] = (),
                                 group_of_one: str = "") -> Callable[[Callable], Callable]:
    """Decorator registering an estimator under `name` with its `EstimatorSpec` fields (see there); the defaults
    fit a group-relative estimator of outcome rewards, so `@register_advantage_estimator("mine")` is enough for
    one. The name becomes a valid `rl_algorithm`."""
    return _ESTIMATORS.register(name, kl_in_reward=kl_in_reward, config_options=config_options,
                                min_group_size=min_group_size, uses_groups=uses_groups,
                                normalization_keys=normalization_keys, needs_values=needs_values,
                                key_defaults=key_defaults, group_of_one=group_of_one)


def unregister_advantage_estimator(name: str) -> None:
    """Remove `name` from the registry (an unknown name raises `UnknownNameError`)."""
    _ESTIMATORS.unregister(name)


def advantage_estimator_spec(name: str) -> EstimatorSpec:
    """The spec registered as `name`; an unknown name raises `UnknownNameError` listing the valid ones."""
    return _ESTIMATORS.spec(name)


def get_advantage_estimator(name: str) -> Callable:
    """The estimator registered as `name` (`advantage_estimator_spec(name).fn`); an unknown name raises
    `UnknownNameError` listing the valid ones."""
    return _ESTIMATORS.get(name)


def available_advantage_estimators() -> Tuple[str, ...]:
    """All registered names in registration order, including ones registered after import."""
    return _ESTIMATORS.names()


def reward_kl_coeff(rl_algorithm: str, kl_coeff: float, use_kl_in_reward: bool) -> float:
    """The coefficient of the reference KL inside the reward for `rl_algorithm` (0.0: no KL in the reward).

    Estimators whose spec takes the KL per token (`kl_in_reward` "token", the REINFORCE++ family, or
    "token_rewards", ppo / vapo) use `kl_coeff`, as PaddleNLP's REINFORCE++ and PPO do. The group estimators (`"sequence"`: grpo, rloo) ignore it, as
    PaddleNLP's GRPO does (its reference KL is only in the loss, `kl_loss_coeff`), unless `use_kl_in_reward`
    (verl's name) asks for `R_i - kl_coeff * sum_t KL_t`. The one place this is decided: the trainer, the step and
    the config's notes all call it (docs/algorithms.md section 3).
    """
    spec = advantage_estimator_spec(rl_algorithm)
    return float(kl_coeff) if spec.reward_kl_per_token or use_kl_in_reward else 0.0


# ---- helpers --------------------------------------------------------------------------------------------------------

def scalar_to_token_level(rewards: TensorLike, response_mask: TensorLike) -> paddle.Tensor:
    """Place each sequence's scalar reward on its last valid token.

    Args:
        rewards: `[bs]` scalar rewards.
        response_mask: `[bs, T]`, non-zero on valid tokens (need not be right-padded: the last non-zero wins).
    Returns:
        `[bs, T]` float32, zero everywhere else; a row with no valid token is all zero.
    """
    dtype = compute_dtype(rewards)
    mask = as_mask(response_mask, dtype)
    rewards = as_float(rewards, dtype).reshape([-1])
    bs, T = mask.shape
    if rewards.shape[0] != bs:
        raise ValueError(f"rewards has {rewards.shape[0]} entries but response_mask has {bs} rows")
    # argmax of m_t * t is the last valid position (ties at 0 resolve to 0, right when only t = 0 is valid);
    # rows with no valid token are zeroed below.
    last = paddle.argmax(mask * paddle.arange(T, dtype=dtype).unsqueeze(0), axis=-1)
    one_hot = paddle.nn.functional.one_hot(last, T).astype(dtype) * (mask.sum(-1, keepdim=True) > 0).astype(dtype)
    return one_hot * rewards.unsqueeze(-1)


def _sequence_scores(token_level_rewards: paddle.Tensor, mask: paddle.Tensor) -> paddle.Tensor:
    return masked(token_level_rewards, mask).sum(-1)


def _group_inverse(index, bs: int) -> np.ndarray:
    """Group ids -> dense 0..n_groups-1 labels (numpy int64 `[bs]`)."""
    if isinstance(index, paddle.Tensor):
        index = index.numpy()
    ids = np.asarray(index)
    if ids.ndim != 1 or ids.shape[0] != bs:
        raise ValueError(f"index must be a length-{bs} sequence of group ids, got shape {list(ids.shape)}")
    _, inverse = np.unique(ids, return_inverse=True)
    return inverse.reshape(-1).astype(np.int64)


def _n_groups(inverse: np.ndarray) -> int:
    return int(inverse.max()) + 1 if inverse.size else 0


def _group_stats(scores: np.ndarray, valid: np.ndarray, inverse: np.ndarray):
    """Per-sample statistics of each sample's group, over the group's VALID members.

    Done on the host in float64: there is one scalar per sequence, and the group ids live on the host anyway.
    Returns `(dev, mean_dev, n)`, each `[bs]`: `dev = score - anchor`, the anchor being the score of one valid
    member of the group; `mean_dev` = group mean of `dev`; `n` = number of valid members. Working relative to an
    anchor makes an all-equal group's deviations exactly 0 (a plain mean of equal floats is not always that float
    again), so its advantages are exactly 0; it is also better conditioned for large rewards.
    """
    n_groups = _n_groups(inverse)
    n = np.bincount(inverse, weights=valid.astype(np.float64), minlength=n_groups)
    valid_rows = np.flatnonzero(valid)
    anchor = np.zeros(n_groups)
    groups_with_valid, first = np.unique(inverse[valid_rows], return_index=True)
    anchor[groups_with_valid] = scores[valid_rows[first]]
    dev = np.where(valid, scores - anchor[inverse], 0.0)
    mean_dev = np.bincount(inverse, weights=dev, minlength=n_groups) / np.maximum(n, 1)
    return dev, mean_dev[inverse], n[inverse]


def _group_centered(scores: np.ndarray, valid: np.ndarray, inverse: np.ndarray):
    """`(R - mean_g R, group size)` per sample; a group of size 1 has mean 0 (docs/algorithms.md section 2)."""
    dev, mean_dev, n = _group_stats(scores, valid, inverse)
    centered = np.where(n > 1, dev - mean_dev, scores)
    return np.where(valid, centered, 0.0), n


def _unbiased_group_std(centered: np.ndarray, inverse: np.ndarray, n: np.ndarray) -> np.ndarray:
    sq = np.bincount(inverse, weights=centered * centered, minlength=_n_groups(inverse))[inverse]
    return np.where(n > 1, np.sqrt(sq / np.maximum(n - 1, 1)), 1.0)


def _prepare(token_level_rewards, response_mask, *others):
    dtype = compute_dtype(token_level_rewards, *others)
    rewards = as_float(token_level_rewards, dtype)
    mask = as_mask(response_mask, dtype)
    check_same_shape(token_level_rewards=rewards, response_mask=mask)
    if len(rewards.shape) != 2:
        raise ValueError(f"token_level_rewards must be [bs, T], got {list(rewards.shape)}")
    return rewards, mask, dtype


def _scores_and_valid(rewards: paddle.Tensor, mask: paddle.Tensor):
    scores = _sequence_scores(rewards, mask).numpy().astype(np.float64)
    valid = (mask.sum(-1) > 0).numpy()
    return scores, valid


def _broadcast(per_seq: np.ndarray, mask: paddle.Tensor, dtype: str) -> paddle.Tensor:
    return paddle.to_tensor(per_seq.astype(dtype), place=mask.place).unsqueeze(-1) * mask


# ---- outcome-reward estimators --------------------------------------------------------------------------------------

# normalize_reward / normalize_advantage off, as PaddleNLP forces them for GRPO (EstimatorSpec.normalization_keys).
@register_advantage_estimator("grpo", config_options=("norm_adv_by_std",), normalization_keys=False,
                              group_of_one="a group of one has mean 0 and std 1 and each advantage is the sample's "
                                           "own reward R / (1 + 1e-6) (R with norm_adv_by_std false): no baseline, "
                                           "every nonzero reward moves the policy")
def grpo_advantage(token_level_rewards: TensorLike, response_mask: TensorLike, index: Sequence,
                   norm_adv_by_std: bool = True, epsilon: float = 1e-6) -> Tuple[paddle.Tensor, paddle.Tensor]:
    """GRPO (DeepSeekMath, arXiv 2402.03300): `A_{i,t} = m_{i,t} (R_i - mean_g R) / (std_g R + epsilon)`.

    `R_i = sum_t m_{i,t} token_level_rewards_{i,t}`; `std_g` is unbiased (Bessel). A group of size 1 has mean 0
    and std 1 (docs/algorithms.md section 2, taken literally: its advantage is `R / (1 + epsilon)`). A group
    whose rewards are all equal gets exactly 0. `norm_adv_by_std=False` is Dr.GRPO (arXiv 2503.20783):
    `A = R_i - mean_g R`. Groups are formed over the batch given - pass the global batch. Returns
    `(advantages, advantages)`.
    """
    rewards, mask, dtype = _prepare(token_level_rewards, response_mask)
    scores, valid = _scores_and_valid(rewards, mask)
    inverse = _group_inverse(index, scores.shape[0])
    centered, n = _group_centered(scores, valid, inverse)
    if norm_adv_by_std:
        centered = centered / (_unbiased_group_std(centered, inverse, n) + epsilon)
    advantages = _broadcast(centered, mask, dtype)
    return advantages, advantages


# ---- REINFORCE++ ----------------------------------------------------------------------------------------------------

def _discounted_returns(token_rewards: paddle.Tensor, mask: paddle.Tensor, gamma: float) -> paddle.Tensor:
    """`G_t = sum_{s>=t, s valid} gamma^(k(s)-k(t)) r_s` along each row, `k` counting the row's VALID tokens (each
    row is one sequence, so the sum resets per row). A masked position inside a row (a multi-turn rollout's tool
    turn: context, not an action) is skipped and leaves the running return unchanged, as GAE does (gae.py); with
    right-padded masks that is the same as counting positions."""
    if gamma == 1.0:  # masked rewards are 0: the plain reversed cumulative sum, whatever the holes
        return paddle.flip(paddle.cumsum(paddle.flip(token_rewards, [1]), axis=1), [1])
    T = token_rewards.shape[1]
    valid = mask > 0
    running = paddle.zeros_like(token_rewards[:, 0])
    out = [None] * T
    for t in range(T - 1, -1, -1):
        running = paddle.where(valid[:, t], token_rewards[:, t] + gamma * running, running)
        out[t] = running
    return paddle.stack(out, axis=1)


def _whiten(values: paddle.Tensor, mask: paddle.Tensor, eps: float) -> paddle.Tensor:
    """`(x - mean) / sqrt(var + eps) * m` over valid tokens, var unbiased (1 valid token: var taken as 0)."""
    centered, var = masked_centered_var(values, mask)
    return centered / paddle.sqrt(var + eps)


def _reinforce_pp(rewards, mask, dtype, gamma, kl_coeff, old_log_probs, ref_log_probs, kl_estimator):
    if kl_estimator not in KL_ESTIMATORS:  # checked even when unused, so a config typo is caught at once
        raise unknown_name("KL estimator", kl_estimator, KL_ESTIMATORS)
    token_rewards = masked(rewards, mask)
    if kl_coeff != 0.0:
        if old_log_probs is None or ref_log_probs is None:
            raise ValueError("reinforce_plus_plus with kl_coeff != 0 needs old_log_probs and ref_log_probs")
        kl = kl_penalty(as_float(old_log_probs, dtype), as_float(ref_log_probs, dtype), kl_estimator)
        check_same_shape(token_level_rewards=rewards, kl=kl)
        token_rewards = token_rewards - kl_coeff * masked(kl, mask)
    returns = masked(_discounted_returns(token_rewards, mask, gamma), mask)
    return _whiten(returns, mask, 1e-8), returns


@register_advantage_estimator("reinforce_plus_plus", kl_in_reward="token", uses_groups=False)
def reinforce_plus_plus_advantage(token_level_rewards: TensorLike, response_mask: TensorLike,
                                  index: Optional[Sequence] = None, gamma: float = 1.0, kl_coeff: float = 0.0,
                                  old_log_probs: Optional[TensorLike] = None,
                                  ref_log_probs: Optional[TensorLike] = None,
                                  kl_estimator: str = "k1") -> Tuple[paddle.Tensor, paddle.Tensor]:
    """REINFORCE++ (arXiv 2501.03262).

    Per-token reward `r_t = m_t (token_level_rewards_t - kl_coeff * k(l^old_t, l^ref_t))` (the scalar reward sits
    on the last valid token; `k` = `kl_penalty(old_log_probs, ref_log_probs, kl_estimator)`), return
    `G_t = sum_{s>=t} gamma^(s-t) r_s` within each sequence, then whitening over all valid tokens of the batch:
    `A = (G - mean) / sqrt(var + 1e-8) * m`, var unbiased. The discount counts valid tokens: a masked position
    inside a row (a tool turn) is skipped, as in GAE; with right padding that is the same as counting positions.
    Pass the global batch. `index` is unused. Returns `(advantages, returns=G)`, both masked.
    """
    rewards, mask, dtype = _prepare(token_level_rewards, response_mask, old_log_probs, ref_log_probs)
    return _reinforce_pp(rewards, mask, dtype, gamma, kl_coeff, old_log_probs, ref_log_probs, kl_estimator)


@register_advantage_estimator("reinforce_plus_plus_baseline", kl_in_reward="token",
                              group_of_one="a group of one keeps its reward (its mean is taken as 0): the "
                                           "advantages are those of rl_algorithm 'reinforce_plus_plus' (returns "
                                           "whitened over the batch, no group baseline)")
def reinforce_plus_plus_baseline_advantage(token_level_rewards: TensorLike, response_mask: TensorLike,
                                           index: Sequence, gamma: float = 1.0, kl_coeff: float = 0.0,
                                           old_log_probs: Optional[TensorLike] = None,
                                           ref_log_probs: Optional[TensorLike] = None,
                                           kl_estimator: str = "k1") -> Tuple[paddle.Tensor, paddle.Tensor]:
    """REINFORCE++-baseline (arXiv 2501.03262): `R_i <- R_i - mean_g R` (a group of size 1 has mean 0), then
    exactly `reinforce_plus_plus`. Pass the global batch."""
    rewards, mask, dtype = _prepare(token_level_rewards, response_mask, old_log_probs, ref_log_probs)
    scores, valid = _scores_and_valid(rewards, mask)
    centered, _ = _group_centered(scores, valid, _group_inverse(index, scores.shape[0]))
    rewards = scalar_to_token_level(paddle.to_tensor(centered.astype(dtype), place=mask.place), mask)
    return _reinforce_pp(rewards, mask, dtype, gamma, kl_coeff, old_log_probs, ref_log_probs, kl_estimator)


# ---- RLOO (registered last: the config lists the choices in registration order) ----------------------------------

@register_advantage_estimator("rloo", min_group_size=2)
def rloo_advantage(token_level_rewards: TensorLike, response_mask: TensorLike,
                   index: Sequence) -> Tuple[paddle.Tensor, paddle.Tensor]:
    """RLOO (leave-one-out baseline): `A_i = R_i - (sum_g R - R_i) / (G - 1)`, broadcast over valid tokens.

    `G` counts the valid members of the group; with `G = 1` there is no other sample to form a baseline from, and
    the advantage is defined as 0 (the sample carries no learning signal rather than an unnormalised raw reward).
    Equivalent to `G / (G - 1) * (R_i - mean_g R)`. Returns `(advantages, advantages)`.
    """
    rewards, mask, dtype = _prepare(token_level_rewards, response_mask)
    scores, valid = _scores_and_valid(rewards, mask)
    inverse = _group_inverse(index, scores.shape[0])
    dev, mean_dev, n = _group_stats(scores, valid, inverse)
    # In deviations from the group anchor: the anchor cancels, and equal rewards give exactly 0.
    loo = np.where(n > 1, dev - (mean_dev * n - dev) / np.maximum(n - 1, 1), 0.0)
    advantages = _broadcast(np.where(valid, loo, 0.0), mask, dtype)
    return advantages, advantages
