"""The typed metrics record of each phase; `as_dict()` gives the names of docs/algorithms.md section 7."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .batch import Batch, GlobalRows


def tool_calls_per_row(turns: Optional[Sequence[list]], n: int) -> List[int]:
    """Tool calls (tool messages) of each of `n` rows; all 0 without turns (single-turn)."""
    if turns is None:
        return [0] * n
    return [sum(m.get("role") == "tool" for m in row) for row in turns]


def tool_counts_per_row(turns: Optional[Sequence[list]], n: int) -> List[Tuple[int, int, int]]:
    """(tool calls, failed calls, assistant turns) of each of `n` rows; (0, 0, 1) without turns (single-turn)."""
    if turns is None:
        return [(0, 0, 1)] * n
    return [(sum(m.get("role") == "tool" for m in row),
             sum(m.get("role") == "tool" and m.get("error") is not None for m in row),
             sum(m.get("role") == "assistant" for m in row)) for row in turns]


@dataclass
class ToolMetrics:
    """Tool use of a multi-turn step over the global batch (every data-parallel rank): per sample the assistant
    turns and tool calls and the share of samples with >= 1 call; per call the share that failed (any of
    environment.TOOL_ERRORS, timeouts included), the share that timed out and the mean latency; the share of
    completion tokens that are tool output (tool_mask over actions + tool output); `wait_s` this rank's seconds
    the rollout was blocked on tool results with no row left to decode."""
    turns_per_sample: float
    calls_per_sample: float
    use_rate: float
    error_rate: float
    timeout_rate: float
    latency_s: float
    token_share: float
    wait_s: float

    @classmethod
    def of(cls, par: Any, batch: Batch, wait_s: float) -> "ToolMetrics":
        turns = batch.turns or [[] for _ in range(len(batch))]
        tools = [m for row in turns for m in row if m.get("role") == "tool"]
        calls = tool_calls_per_row(turns, len(batch))
        tool_tokens = float(batch.tool_mask.astype("float32").sum()) if batch.tool_mask is not None else 0.0
        rows, assistant, n_calls, users, errors, timeouts, latency, tool_tok, tokens = par.all_reduce_sum([
            len(batch), sum(m.get("role") == "assistant" for row in turns for m in row), len(tools),
            sum(c > 0 for c in calls), sum(m.get("error") is not None for m in tools),
            sum(m.get("error") == "timeout" for m in tools), sum(float(m.get("latency_s") or 0.0) for m in tools),
            tool_tokens, tool_tokens + float(batch.completion_mask.astype("float32").sum())]).tolist()
        per_call = lambda x: x / n_calls if n_calls else 0.0  # noqa: E731
        return cls(assistant / max(rows, 1), n_calls / max(rows, 1), users / max(rows, 1), per_call(errors),
                   per_call(timeouts), per_call(latency), tool_tok / max(tokens, 1.0), wait_s)

    def as_dict(self) -> Dict[str, float]:
        return {"rollout/turns_per_sample": self.turns_per_sample,
                "rollout/tool_calls_per_sample": self.calls_per_sample, "rollout/tool_use_rate": self.use_rate,
                "rollout/tool_error_rate": self.error_rate, "rollout/tool_timeout_rate": self.timeout_rate,
                "rollout/tool_latency_s": self.latency_s, "rollout/tool_token_share": self.token_share,
                "perf/tool_wait_s": self.wait_s}


def eval_tool_metrics(counts: Sequence[Tuple[int, int, int]], correct: Optional[np.ndarray]) -> Dict[str, float]:
    """From each sample's (tool calls, failed calls, assistant turns) (`tool_counts_per_row`): eval/tool_use_rate
    (share of samples with >= 1 tool call), eval/tool_calls_per_sample, eval/tool_error_rate (failed calls per call,
    0 without calls: the rollout's rollout/tool_error_rate), eval/turns_per_sample and, when correctness is known
    (`correct` [n] bool), eval/accuracy_with_tools / eval/accuracy_without_tools: the accuracy among the samples
    that called a tool / did not (nan when there is no such sample)."""
    table = np.asarray(counts, dtype=np.int64).reshape(-1, 3)
    calls, errors, turns = table[:, 0], table[:, 1], table[:, 2]
    used = calls > 0
    out = {"eval/tool_use_rate": float(used.mean()) if used.size else 0.0,
           "eval/tool_calls_per_sample": float(calls.mean()) if used.size else 0.0,
           "eval/tool_error_rate": float(errors.sum() / calls.sum()) if calls.sum() else 0.0,
           "eval/turns_per_sample": float(turns.mean()) if used.size else 0.0}
    if correct is not None:
        for key, rows in (("eval/accuracy_with_tools", used), ("eval/accuracy_without_tools", ~used)):
            out[key] = float(correct[rows].mean()) if rows.any() else float("nan")
    return out


@dataclass
class CollectMetrics:
    rollout_s: float = 0.0
    reward_s: float = 0.0
    dropped_groups: Optional[float] = None   # with dynamic sampling only
    rounds: Optional[float] = None
    tools: Optional[ToolMetrics] = None      # multi-turn rollouts only
    overlap: Optional[Dict[str, float]] = None  # async_rollout: the waits and the staleness (step/async_rollout.py)
    reference_s: float = 0.0   # async_rollout: the rollout worker's reference pass (rollout_worker_reference)

    def as_dict(self) -> Dict[str, float]:
        out = {"perf/rollout_s": self.rollout_s, "perf/reward_s": self.reward_s, **(self.overlap or {})}
        if self.rounds is not None:
            out["train/dynamic_sampling_dropped_groups"] = self.dropped_groups
            out["train/dynamic_sampling_rounds"] = self.rounds
        if self.tools is not None:
            out.update(self.tools.as_dict())
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
# denominators); the token-weighted statistics are divided by the mini-batch's token count at the end; the maxima
# are reduced by max.
SHARE_KEYS = ("train/policy_loss", "train/kl_loss", "train/positive_lm_loss")
# The rollout correction's statistics (algorithms.rollout_correction) that are token means, in LossSums' order.
CORRECTION_TOKEN_MEANS = ("ratio_mean", "capped_frac", "masked_frac", "kl", "weight_mean", "weight_sq_mean",
                          "log_ppl_diff")
TOKEN_MEAN_KEYS = (("train/entropy", "train/clip_frac_low", "train/clip_frac_high", "train/clip_frac_dual",
                    "train/approx_kl_old") + tuple(f"rollout_correction/{k}" for k in CORRECTION_TOKEN_MEANS))
MAX_KEYS = ("rollout_correction/ratio_max",)
# Token means that only feed a logged statistic: the effective sample size is mean(w)^2 / mean(w^2) and the
# perplexity ratio exp(mean(l^s - l^old)) of the whole mini-batch, not a mean of the micro-batches' values.
_HIDDEN = ("rollout_correction/weight_mean", "rollout_correction/weight_sq_mean", "rollout_correction/log_ppl_diff")
# The rollout correction's share of tokens it changed, kept only in the mode that changes them.
CORRECTION_FRAC = {"tis": "rollout_correction/capped_frac", "mis": "rollout_correction/masked_frac"}


@dataclass
class LossSums:
    """One mini-batch's loss statistics as an array that adds up over micro-batches and ranks (`add`, `reduced`):
    `values` = [shares of SHARE_KEYS..., token-weighted sums of TOKEN_MEAN_KEYS..., maxima of MAX_KEYS..., tokens].
    The maxima are of positive quantities, so the initial 0 is the maximum of nothing."""
    values: np.ndarray = field(default_factory=lambda: np.zeros(len(SHARE_KEYS) + len(TOKEN_MEAN_KEYS)
                                                                + len(MAX_KEYS) + 1))

    @property
    def _max_part(self) -> slice:
        end = len(self.values) - 1
        return slice(end - len(MAX_KEYS), end)

    def add(self, other: np.ndarray) -> "LossSums":
        """Fold a micro-batch's values into these (sums, and maxima by max); returns self."""
        other = np.asarray(other, dtype=np.float64)
        m = self._max_part
        maxima = np.maximum(self.values[m], other[m])
        self.values = self.values + other
        self.values[m] = maxima
        return self

    def reduced(self, par: Any) -> "LossSums":
        """These values over every data-parallel rank of `par` (ParallelContext): sums all-reduced, maxima the
        largest any rank has."""
        m = self._max_part
        out = np.array(par.all_reduce_sum(self.values), dtype=np.float64)  # a copy: one process returns its input
        out[m] = np.max(par.all_gather_object(self.values[m].tolist()), axis=0)
        return LossSums(out)

    def means(self) -> Dict[str, float]:
        n_share, n_mean = len(SHARE_KEYS), len(TOKEN_MEAN_KEYS)
        tokens = max(self.values[-1], 1.0)
        out = dict(zip(SHARE_KEYS, self.values[:n_share].tolist()))
        out.update({k: float(v) / tokens for k, v in zip(TOKEN_MEAN_KEYS, self.values[n_share:n_share + n_mean])})
        out.update(zip(MAX_KEYS, self.values[self._max_part].tolist()))
        w, w2, log_ppl = (out.pop(k) for k in _HIDDEN)
        out["rollout_correction/ess"] = w * w / w2 if w2 > 0 else 0.0  # algorithms.effective_sample_size
        out["rollout_correction/ppl_ratio"] = math.exp(min(max(log_ppl, -20.0), 20.0))  # as rollout_correction's
        return out


@dataclass
class UpdateMetrics:
    per_mini_batch: List[Dict[str, float]]   # LossSums.means() + train/grad_norm, train/update_skipped of each
    nonfinite_updates: int
    optimizer_steps: int
    with_kl_loss: bool
    with_positive_lm_loss: bool = False
    rollout_correction: str = "none"   # which of CORRECTION_FRAC's statistics to keep
    # opd_kl_estimator full: the exact KL's metrics (opd/reverse_kl, perf/teacher_s: FullReverseKL.metrics)
    distill: Optional[Dict[str, float]] = None

    def as_dict(self) -> Dict[str, float]:
        """The mini-batches' finite values averaged (the maxima: their maximum). A statistic no mini-batch
        computed (the forward's, when every mini-batch had nothing to learn: policy_update.SKIPPED_MEANS) is left
        out."""
        out = {}
        for k in dict.fromkeys(k for m in self.per_mini_batch for k in m):
            values = [m[k] for m in self.per_mini_batch if k in m and math.isfinite(m[k])]
            reduce = np.max if k in MAX_KEYS else np.mean
            out[k] = float(reduce(values)) if values else float("nan")
        if not self.with_kl_loss:
            out.pop("train/kl_loss", None)
        if not self.with_positive_lm_loss:
            out.pop("train/positive_lm_loss", None)
        for mode, key in CORRECTION_FRAC.items():
            if mode != self.rollout_correction:
                out.pop(key, None)
        out.update(self.distill or {})
        out["train/nonfinite_updates"] = float(self.nonfinite_updates)
        out["train/optimizer_steps"] = float(self.optimizer_steps)
        return out
