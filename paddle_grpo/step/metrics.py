"""The typed metrics record of each phase; `as_dict()` gives the names of docs/algorithms.md section 7."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import numpy as np

from .batch import GlobalRows


@dataclass
class CollectMetrics:
    rollout_s: float = 0.0
    reward_s: float = 0.0
    dropped_groups: Optional[float] = None   # with dynamic sampling only
    rounds: Optional[float] = None

    def as_dict(self) -> Dict[str, float]:
        out = {"perf/rollout_s": self.rollout_s, "perf/reward_s": self.reward_s}
        if self.rounds is not None:
            out["train/dynamic_sampling_dropped_groups"] = self.dropped_groups
            out["train/dynamic_sampling_rounds"] = self.rounds
        return out


@dataclass
class RewardMetrics:
    reward: float
    reward_std: float
    none_frac: float
    by_function: Dict[str, float]   # only with several reward functions

    def as_dict(self) -> Dict[str, float]:
        out = {"train/reward": self.reward, "train/reward_std": self.reward_std,
               "train/reward_none_frac": self.none_frac}
        out.update({f"train/reward/{name}": v for name, v in self.by_function.items()})
        return out


@dataclass
class AdvantageMetrics:
    mean: float
    std: float
    frac_reward_zero_std: float

    def as_dict(self) -> Dict[str, float]:
        return {"train/advantage_mean": self.mean, "train/advantage_std": self.std,
                "train/frac_reward_zero_std": self.frac_reward_zero_std}


@dataclass
class ValueMetrics:
    """The critic's values and returns of the experience, token means over the global batch's valid tokens, and
    the explained variance `1 - Var(R - V) / Var(R)` (algorithms.explained_variance)."""
    values_mean: float
    returns_mean: float
    explained_variance: float

    def as_dict(self) -> Dict[str, float]:
        return {"train/values_mean": self.values_mean, "train/returns_mean": self.returns_mean,
                "train/explained_variance": self.explained_variance}


@dataclass
class CriticMetrics:
    """The critic's update: per mini-batch the value loss, the share of valid tokens where the clipped term of the
    value loss was the larger (both over the whole mini-batch, every rank) and the gradient norm (nan: skipped);
    the learning rate after the update. `as_dict` averages the finite mini-batch values."""
    per_mini_batch: List[Dict[str, float]]
    lr: float

    def as_dict(self) -> Dict[str, float]:
        out = {}
        for k in ("train/value_loss", "train/value_clip_frac", "train/critic_grad_norm"):
            finite = [m[k] for m in self.per_mini_batch if math.isfinite(m[k])]
            out[k] = float(np.mean(finite)) if finite else float("nan")
        out["train/critic_lr"] = self.lr
        return out


@dataclass
class LengthMetrics:
    mean: float
    max: float
    min: float
    clip_ratio: float

    @classmethod
    def of(cls, rows: GlobalRows) -> "LengthMetrics":
        return cls(float(rows.lengths.mean()), float(rows.lengths.max()), float(rows.lengths.min()),
                   float(rows.truncated.mean()))

    def as_dict(self) -> Dict[str, float]:
        return {"response_length/mean": self.mean, "response_length/max": self.max,
                "response_length/min": self.min, "response_length/clip_ratio": self.clip_ratio}


# Sums over the micro-batches (and ranks) of one mini-batch: the loss shares add up to the mini-batch loss (global
# denominators); the token-weighted statistics are divided by the mini-batch's token count at the end.
SHARE_KEYS = ("train/policy_loss", "train/kl_loss", "train/positive_lm_loss")
TOKEN_MEAN_KEYS = ("train/entropy", "train/clip_frac_low", "train/clip_frac_high", "train/clip_frac_dual",
                   "train/approx_kl_old")


@dataclass
class LossSums:
    """One mini-batch's loss statistics as an array that adds up over micro-batches and ranks:
    `values` = [shares of SHARE_KEYS..., token-weighted sums of TOKEN_MEAN_KEYS..., tokens]."""
    values: np.ndarray = field(default_factory=lambda: np.zeros(len(SHARE_KEYS) + len(TOKEN_MEAN_KEYS) + 1))

    def means(self) -> Dict[str, float]:
        n_share = len(SHARE_KEYS)
        tokens = max(self.values[-1], 1.0)
        out = dict(zip(SHARE_KEYS, self.values[:n_share].tolist()))
        out.update({k: float(v) / tokens for k, v in zip(TOKEN_MEAN_KEYS, self.values[n_share:-1])})
        return out


@dataclass
class UpdateMetrics:
    per_mini_batch: List[Dict[str, float]]   # LossSums.means() + train/grad_norm of each mini-batch
    nonfinite_updates: int
    optimizer_steps: int
    with_kl_loss: bool
    with_positive_lm_loss: bool = False

    def as_dict(self) -> Dict[str, float]:
        out = {}
        for k in self.per_mini_batch[0]:
            values = [m[k] for m in self.per_mini_batch if math.isfinite(m[k])]
            out[k] = float(np.mean(values)) if values else float("nan")
        if not self.with_kl_loss:
            out.pop("train/kl_loss", None)
        if not self.with_positive_lm_loss:
            out.pop("train/positive_lm_loss", None)
        out["train/nonfinite_updates"] = float(self.nonfinite_updates)
        out["train/optimizer_steps"] = float(self.optimizer_steps)
        return out
