"""Critic-based estimators: GAE (`ppo`) and VAPO's decoupled, length-adaptive GAE (`vapo`), and PaddleNLP's PPO
reward with the per-token KL penalty (`kl_token_rewards`). docs/algorithms.md section 8.

Shapes: `token_level_rewards`, `response_mask`, `values`, `advantages`, `returns` are `[bs, T]`; `values[i, t]` is
the critic's V of the state before completion token t. Outputs are float32 (float64 if an input is float64), on
the mask's device, exactly 0 outside the mask.

The recursion runs over each row's VALID tokens only, from its last one (next value 0) backwards: a masked position
inside a row (a hole, e.g. tool output in a multi-turn completion) is skipped, its reward and value ignored, and
the discount counts valid tokens. With right-padded masks, as the rollout produces, this is exactly PaddleNLP's
`compute_gae_advantage_return` (which masks rewards and values and runs over all positions).

The loop runs over T on the host with every row at once (numpy, float64 state; T up to 4096 with bs 2048 is 4096
vector steps), and each output is rounded once to the output dtype. A closed form `sum_s (gamma lam)^(s-t) delta_s`
as a cumulative sum would need `(gamma lam)^-t`, which overflows for long completions.
"""
from typing import Optional, Sequence, Tuple

import numpy as np
import paddle

from ._common import TensorLike, as_float, as_mask, check_same_shape, compute_dtype, masked
from .advantages import _prepare, register_advantage_estimator, scalar_to_token_level
from .kl import kl_penalty


def _gae(rewards: np.ndarray, values: np.ndarray, valid: np.ndarray, gamma: float, lam_policy: np.ndarray,
         lam_critic: Optional[np.ndarray], dtype: str) -> Tuple[np.ndarray, np.ndarray]:
    """`(advantages with lam_policy, returns = A(lam_critic) + V)`, both `[bs, T]` of `dtype`, in one pass; `lam_*`
    are per-row `[bs]`, `lam_critic=None` means the same lambda (one recursion).

    Per row, over its valid tokens t_1 < ... < t_n: `delta_k = r_k + gamma V_{k+1} - V_k` with `V_{n+1} = 0`,
    `A_k = delta_k + gamma lam A_{k+1}` with `A_{n+1} = 0`. Masked positions get 0 and leave the state unchanged.
    The state is float64; each output element is rounded once.
    """
    bs, T = rewards.shape
    m_all = np.ascontiguousarray(valid.T)             # [T, bs]: the loop reads contiguous rows
    r_all = np.ascontiguousarray(rewards.T)
    v_all = np.ascontiguousarray(values.T)
    decay_policy = gamma * np.asarray(lam_policy, dtype=np.float64)
    decay_critic = None if lam_critic is None else gamma * np.asarray(lam_critic, dtype=np.float64)
    next_value = np.zeros(bs)
    a_policy, a_critic = np.zeros(bs), np.zeros(bs)
    adv, ret = np.zeros((T, bs), dtype=dtype), np.zeros((T, bs), dtype=dtype)
    for t in range(T - 1, -1, -1):
        m = m_all[t]
        # where(), not a product with the mask: inf/NaN garbage in padding must not reach the arithmetic
        v = np.where(m, v_all[t], 0.0)
        delta = np.where(m, r_all[t], 0.0) + gamma * next_value - v
        a_policy = np.where(m, delta + decay_policy * a_policy, a_policy)
        if decay_critic is not None:
            a_critic = np.where(m, delta + decay_critic * a_critic, a_critic)
        adv[t] = np.where(m, a_policy, 0.0)
        ret[t] = np.where(m, (a_policy if decay_critic is None else a_critic) + v, 0.0)
        next_value = np.where(m, v, next_value)
    return adv.T, ret.T


def _inputs(token_level_rewards, response_mask, values):
    if values is None:
        raise ValueError("a critic estimator needs values=[bs, T] (the critic's value of each completion token)")
    rewards, mask, dtype = _prepare(token_level_rewards, response_mask, values)
    values_t = as_float(values, dtype)
    check_same_shape(token_level_rewards=rewards, values=values_t)
    return rewards.numpy(), values_t.numpy(), mask.numpy() > 0, mask, dtype


def _check_unit_interval(**named: float) -> None:
    for name, x in named.items():
        if not 0.0 <= x <= 1.0:
            raise ValueError(f"{name} must be in [0, 1], got {x!r}")


def _out(a: np.ndarray, mask: paddle.Tensor) -> paddle.Tensor:
    return paddle.to_tensor(np.ascontiguousarray(a), place=mask.place)


@register_advantage_estimator("ppo", kl_in_reward="token_rewards", config_options=("gamma", "lam"),
                              uses_groups=False, needs_values=True)
def gae_advantage(token_level_rewards: TensorLike, response_mask: TensorLike, index: Optional[Sequence] = None, *,
                  values: Optional[TensorLike] = None, gamma: float = 1.0,
                  lam: float = 0.95) -> Tuple[paddle.Tensor, paddle.Tensor]:
    """GAE (Schulman et al., arXiv 1506.02438), as PaddleNLP's PPO (`compute_gae_advantage_return`).

    `delta_t = r_t + gamma V_{t+1} - V_t`, `A_t = delta_t + gamma lam A_{t+1}`, from each row's last valid token
    with `V = A = 0` after it; `returns = A + V` on valid tokens (the critic's target). Not whitened: whitening is
    the caller's `normalize_advantage` step, as in PaddleNLP (`normalize_advantage`). `token_level_rewards` is
    `kl_token_rewards(...)` for PaddleNLP's PPO reward. `index` is unused. Returns `(advantages, returns)`.
    """
    _check_unit_interval(gamma=gamma, lam=lam)
    rewards, vals, m, mask, dtype = _inputs(token_level_rewards, response_mask, values)
    adv, ret = _gae(rewards, vals, m, gamma, np.full(m.shape[0], lam), None, dtype)
    return _out(adv, mask), _out(ret, mask)


def vapo_policy_lambda(lengths: np.ndarray, alpha: float) -> np.ndarray:
    """VAPO's length-adaptive `lam_policy = 1 - 1 / (alpha l)` per row (arXiv 2504.05118, section 3.2), clamped at 0.

    The paper's formula is negative for `l < 1 / alpha` tokens (below 20 with its alpha 0.05), where the weights
    `(gamma lam)^j` of the later TD errors would alternate in sign; the clamp gives the one-step TD advantage
    `r_t + gamma V_{t+1} - V_t` there. Rows with no valid token get 0 (they have no advantage anyway).
    """
    lengths = np.asarray(lengths, dtype=np.float64)
    with np.errstate(divide="ignore"):
        lam = 1.0 - 1.0 / (alpha * lengths)
    return np.where(lengths > 0, np.maximum(lam, 0.0), 0.0)


@register_advantage_estimator("vapo", kl_in_reward="token_rewards",
                              config_options=("gamma", "lam_critic", ("vapo_alpha", "alpha")), uses_groups=False,
                              needs_values=True,
                              # The paper's recipe (arXiv 2504.05118, section 5.1; PaddleNLP's VAPO file: 50 and
                              # 0.28): an explicit value of each key wins.
                              key_defaults=(("positive_example_lm_coeff", 0.1), ("pretrain_critic_steps", 50),
                                            ("clip_range_ratio_high", 0.28)))
def vapo_advantage(token_level_rewards: TensorLike, response_mask: TensorLike, index: Optional[Sequence] = None, *,
                   values: Optional[TensorLike] = None, gamma: float = 1.0, lam_critic: float = 1.0,
                   alpha: float = 0.05) -> Tuple[paddle.Tensor, paddle.Tensor]:
    """VAPO's decoupled, length-adaptive GAE (arXiv 2504.05118, sections 3.1-3.2).

    Returns are GAE with `lam_critic` (1.0 in the paper: the critic regresses on the unbiased Monte-Carlo return),
    `returns = A(lam_critic) + V`; advantages are GAE with the per-row `lam_policy = max(0, 1 - 1 / (alpha l))`,
    `l` the row's valid tokens (`vapo_policy_lambda`). Same recursion and masking as `gae_advantage`; not
    whitened. `index` is unused. Returns `(advantages, returns)`.
    """
    _check_unit_interval(gamma=gamma, lam_critic=lam_critic)
    if not alpha > 0:
        raise ValueError(f"vapo alpha (vapo_alpha) must be > 0, got {alpha!r}")
    rewards, vals, m, mask, dtype = _inputs(token_level_rewards, response_mask, values)
    lam_policy = vapo_policy_lambda(m.sum(-1), alpha)
    adv, ret = _gae(rewards, vals, m, gamma, lam_policy, np.full(m.shape[0], lam_critic), dtype)
    return _out(adv, mask), _out(ret, mask)


def kl_token_rewards(scores: TensorLike, response_mask: TensorLike, old_log_probs: Optional[TensorLike] = None,
                     ref_log_probs: Optional[TensorLike] = None, kl_coeff: float = 0.0,
                     kl_estimator: str = "k1") -> paddle.Tensor:
    """PaddleNLP's PPO reward (`add_kl_divergence_regularization`): `r_t = -kl_coeff * k(l^old_t, l^ref_t)` on
    every valid token, plus the sequence score on the last valid token.

    Args:
        scores: `[bs]` sequence scores, already shaped and clipped to `±clip_range_score` by the caller.
        response_mask: `[bs, T]`, non-zero on valid tokens (need not be right-padded: the last non-zero wins).
        old_log_probs / ref_log_probs: `[bs, T]` log-probs of the sampled tokens under the sampling and the
            reference policy. PaddleNLP's term is k1, `l^old - l^ref`; `kl_penalty` clamps it to [-10, 10].
        kl_coeff: PaddleNLP's `kl_coeff`. With 0, or without log-probs, this is `scalar_to_token_level`.
    Returns `[bs, T]` float32 (float64 for float64 input), 0 outside the mask.
    """
    dtype = compute_dtype(scores, old_log_probs, ref_log_probs)
    token_rewards = scalar_to_token_level(as_float(scores, dtype), response_mask)
    if kl_coeff == 0.0 or old_log_probs is None or ref_log_probs is None:
        return token_rewards
    mask = as_mask(response_mask, dtype)
    kl = kl_penalty(as_float(old_log_probs, dtype), as_float(ref_log_probs, dtype), kl_estimator)
    check_same_shape(response_mask=mask, kl=kl)
    return token_rewards - kl_coeff * masked(kl, mask)
