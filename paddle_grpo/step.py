"""One RL step as phase functions over a typed `Batch` (docs/architecture.md):

    collect (rollout + score, DAPO dynamic sampling) -> [balance_batch: rows reassigned between ranks] -> log-probs
    (reference, old) -> gather once over the data-parallel ranks -> shape rewards -> advantages -> update
    (mini-batches of micro-batches; with use_remove_padding / a token budget sorted by length and trimmed)

Each rank holds its own rows (`Batch`); the per-sequence data that group statistics, reward normalisation,
REINFORCE++ whitening and the `token-mean` denominators need is gathered once per step (`gather`), so every batch
statistic is over the global batch (docs/algorithms.md sections 1-5). Each phase returns a typed metrics record;
`as_dict()` gives the metric names of docs/algorithms.md section 7.
"""
from __future__ import annotations

import contextlib
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import paddle

from .algorithms import (
    RunningRewardNormalizer,
    advantage_estimator_spec,
    aggregate_loss,
    clip_reward,
    compute_policy_loss,
    global_denominators,
    kl_penalty,
    masked_mean,
    normalize_advantage,
    overlong_penalty,
    scalar_to_token_level,
)
from .data import (PromptSampler, apply_chat_template, balance_rows, collate_prompts, form_micro_batches, pad_columns,
                   row_extents, tokenize_prompts)
from .parallel import ParallelContext
from .policy import Policy, position_ids_from_mask
from .policy.causal import logprobs_from_completion_logits
from .policy.lm_head import head_logprobs
from .rewards import RewardResult
from .rollout import Rollout
from .sampling import row_keys

logger = logging.getLogger("paddle_grpo.step")


class TrainingError(RuntimeError):
    """The run cannot go on (for example too many non-finite updates in a row)."""


# ------------------------------------------------------------------------------------------------ the batch

@dataclass
class Batch:
    """This data-parallel rank's rows of one step, prompt by prompt (rows i*G .. i*G+G-1 answer one prompt).

    Tensors: `prompt_ids`/`prompt_mask` [n, L] int64, left-padded; `completion_ids`/`completion_mask` [n, T] int64
    (mask 1 up to and including EOS); `sample_logprobs` [n, T] float32, the sampled tokens' log-probs at sampling
    time. Per row: `lengths` [n] generated tokens (EOS included), `truncated` [n] bool (stopped by max_dec_len),
    `texts` the decoded completions the rewards saw, `rewards` [n] float64 combined reward (0 where not `valid`),
    `valid` [n] bool (False: no reward function could judge the row), `scores_by_function` {name: [n] raw scores},
    `prompt_index` the dataset row each sample answers. `row_ids` [n]: each row's global row (rank order) after
    balance_batch moved rows between ranks (`balance`); None while a rank holds its own rows in order."""
    prompt_ids: paddle.Tensor
    prompt_mask: paddle.Tensor
    completion_ids: paddle.Tensor
    completion_mask: paddle.Tensor
    sample_logprobs: paddle.Tensor
    lengths: np.ndarray
    truncated: np.ndarray
    texts: List[str]
    rewards: np.ndarray
    valid: np.ndarray
    scores_by_function: Dict[str, list]
    prompt_index: List[int]
    row_ids: Optional[np.ndarray] = None

    def __len__(self) -> int:
        return len(self.texts)

    @classmethod
    def from_rollout(cls, rollout: Rollout, texts: List[str], result: RewardResult, indices: Sequence[int],
                     G: int) -> "Batch":
        """The rows of one rollout round and their rewards (`result.scores[i]` None: not judged)."""
        return cls(prompt_ids=rollout.prompt_ids, prompt_mask=rollout.prompt_mask,
                   completion_ids=rollout.completion_ids, completion_mask=rollout.completion_mask,
                   sample_logprobs=rollout.sample_logprobs, lengths=rollout.lengths, truncated=rollout.truncated,
                   texts=list(texts),
                   rewards=np.array([0.0 if s is None else s for s in result.scores], dtype=np.float64),
                   valid=np.array([s is not None for s in result.scores]),
                   scores_by_function={k: list(v) for k, v in result.scores_by_function.items()},
                   prompt_index=[i for i in indices for _ in range(G)])

    def informative_groups(self, G: int) -> np.ndarray:
        """[n / G] bool: groups whose judged rewards vary (variance >= 1e-6). A group whose rewards all agree gives
        no gradient under group baselines (DAPO dynamic sampling drops it)."""
        out = []
        for g in range(len(self) // G):
            judged = self.rewards[g * G:(g + 1) * G][self.valid[g * G:(g + 1) * G]]
            out.append(len(judged) > 1 and float(np.var(judged)) >= 1e-6)
        return np.array(out, dtype=bool)

    def groups(self, group_ids: Sequence[int], G: int) -> "Batch":
        """The rows of the prompt groups `group_ids`, in that order (tensor widths unchanged)."""
        return self.take([g * G + j for g in group_ids for j in range(G)])

    def take(self, rows: Sequence[int]) -> "Batch":
        """The rows `rows`, in that order (tensor widths unchanged)."""
        rows = list(rows)
        index = paddle.to_tensor(np.asarray(rows, dtype=np.int64))
        take = lambda t: paddle.gather(t, index, axis=0)  # noqa: E731
        return Batch(prompt_ids=take(self.prompt_ids), prompt_mask=take(self.prompt_mask),
                     completion_ids=take(self.completion_ids), completion_mask=take(self.completion_mask),
                     sample_logprobs=take(self.sample_logprobs), lengths=self.lengths[rows],
                     truncated=self.truncated[rows], texts=[self.texts[r] for r in rows], rewards=self.rewards[rows],
                     valid=self.valid[rows],
                     scores_by_function={k: [v[r] for r in rows] for k, v in self.scores_by_function.items()},
                     prompt_index=[self.prompt_index[r] for r in rows],
                     row_ids=None if self.row_ids is None else self.row_ids[rows])

    @staticmethod
    def concat(parts: Sequence["Batch"], pad_id: int) -> "Batch":
        """Stack batches, padding prompts (left) and completions (right) to the widest part."""
        if len(parts) == 1:
            return parts[0]
        L = max(p.prompt_ids.shape[1] for p in parts)
        T = max(p.completion_ids.shape[1] for p in parts)
        cat = lambda name, width, value, side: paddle.concat(  # noqa: E731
            [pad_columns(getattr(p, name), width, value, side) for p in parts])
        return Batch(prompt_ids=cat("prompt_ids", L, pad_id, "left"), prompt_mask=cat("prompt_mask", L, 0, "left"),
                     completion_ids=cat("completion_ids", T, pad_id, "right"),
                     completion_mask=cat("completion_mask", T, 0, "right"),
                     sample_logprobs=cat("sample_logprobs", T, 0.0, "right"),
                     lengths=np.concatenate([p.lengths for p in parts]),
                     truncated=np.concatenate([p.truncated for p in parts]),
                     texts=[t for p in parts for t in p.texts], rewards=np.concatenate([p.rewards for p in parts]),
                     valid=np.concatenate([p.valid for p in parts]),
                     scores_by_function={k: [v for p in parts for v in p.scores_by_function[k]]
                                         for k in parts[0].scores_by_function},
                     prompt_index=[i for p in parts for i in p.prompt_index])

    def sample_rows(self, records: Sequence[dict], k: int = 4) -> List[dict]:
        """The first `k` samples as logged rows: `prompt` (the record's src), `completion` (the text the rewards
        scored), `reward` (the combined reward before any shaping; None when not judged), `scores` (each function's
        own score) and `length` (generated tokens, EOS included)."""
        return [{"prompt": records[self.prompt_index[i]]["src"], "completion": self.texts[i],
                 "reward": float(self.rewards[i]) if self.valid[i] else None,
                 "scores": {name: values[i] for name, values in self.scores_by_function.items()},
                 "length": int(self.lengths[i])}
                for i in range(min(k, len(self)))]


@dataclass
class GlobalRows:
    """Per-sequence data of the whole step: every data-parallel rank's rows, in rank order ([N] or [N, T_max],
    completions right-padded to the widest rank's). `offset` is this rank's first row; `rows` [n] this rank's
    rows when balance_batch moved rows between ranks (None: offset .. offset + n - 1). `old`/`ref` (the sampling
    and reference log-probs) only when the reward carries a KL term."""
    rewards: np.ndarray
    valid: np.ndarray
    lengths: np.ndarray
    truncated: np.ndarray
    scores_by_function: List[Dict[str, list]]
    mask: np.ndarray
    old: Optional[np.ndarray]
    ref: Optional[np.ndarray]
    offset: int
    rows: Optional[np.ndarray] = None


def gather(par: ParallelContext, batch: Batch, old_for_reward: Optional[paddle.Tensor],
           ref_lp: Optional[paddle.Tensor]) -> GlobalRows:
    """The step's one gather over the data-parallel ranks. Rows that `balance` moved between ranks are put back in
    rank order (prompt groups consecutive, as the advantages need)."""
    local = {"rewards": batch.rewards, "valid": batch.valid, "lengths": batch.lengths, "truncated": batch.truncated,
             "by_function": batch.scores_by_function, "mask": batch.completion_mask.numpy(), "row_ids": batch.row_ids}
    if old_for_reward is not None:
        local["old"], local["ref"] = old_for_reward.numpy(), ref_lp.numpy()
    parts = par.all_gather_object(local)
    T = max(p["mask"].shape[1] for p in parts)
    order = None if batch.row_ids is None else np.argsort(np.concatenate([p["row_ids"] for p in parts]))

    def stack(key: str, width: Optional[int] = None) -> np.ndarray:
        out = np.concatenate([p[key] if width is None else pad_columns(p[key], width, 0, "right") for p in parts])
        return out if order is None else out[order]

    return GlobalRows(rewards=stack("rewards").astype(np.float64), valid=stack("valid"), lengths=stack("lengths"),
                      truncated=stack("truncated"), scores_by_function=[p["by_function"] for p in parts],
                      mask=stack("mask", T), old=stack("old", T) if old_for_reward is not None else None,
                      ref=stack("ref", T) if old_for_reward is not None else None,
                      offset=par.dp_rank * len(batch), rows=batch.row_ids)


# ------------------------------------------------------------------------------------------ metrics records

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
SHARE_KEYS = ("train/policy_loss", "train/kl_loss")
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

    def as_dict(self) -> Dict[str, float]:
        out = {}
        for k in self.per_mini_batch[0]:
            values = [m[k] for m in self.per_mini_batch if math.isfinite(m[k])]
            out[k] = float(np.mean(values)) if values else float("nan")
        if not self.with_kl_loss:
            out.pop("train/kl_loss", None)
        out["train/nonfinite_updates"] = float(self.nonfinite_updates)
        out["train/optimizer_steps"] = float(self.optimizer_steps)
        return out


# --------------------------------------------------------------------------------------- rollout and score

class PromptEncoder:
    """Left-padded prompt ids [B, L] and mask for dataset rows, tokenised once per row."""

    def __init__(self, policy: Policy, tokenizer: Any, chat_template: str, max_prompt_len: int):
        self.policy, self.tokenizer = policy, tokenizer
        self.chat_template, self.max_prompt_len = chat_template, max_prompt_len
        self._cache: Dict[Tuple[int, int], List[int]] = {}

    def __call__(self, records: Sequence[dict], indices: Sequence[int]) -> Tuple[np.ndarray, np.ndarray]:
        token_lists = []
        for i in indices:
            key = (id(records), i)
            if key not in self._cache:
                text = apply_chat_template(records[i]["src"], self.tokenizer, mode=self.chat_template)
                ids = tokenize_prompts(self.tokenizer, [text])[0]
                self._cache[key] = self.policy.prompt_token_ids(self.tokenizer, ids)
            token_lists.append(self._cache[key])
        ids, mask = collate_prompts(token_lists, self.tokenizer.pad_token_id, self.max_prompt_len)
        return ids, mask


def model_precision(amp: Any) -> contextlib.AbstractContextManager:
    """The context every model pass whose log-probs are compared runs in (the rollout that samples, the old and
    reference log-probs, the update): the plan's autocast under AMP (precision.Amp), else a no-op. One precision
    for all of them: under O1 a float32 old/reference pass against an autocast update would make the ratio differ
    from 1 on policy and the k3 KL positive at step 0."""
    return amp.autocast() if amp else contextlib.nullcontext()


def rollout(policy: Policy, encode: PromptEncoder, cfg: Any, records: Sequence[dict], indices: Sequence[int],
            G: int, *, do_sample: bool = True, keys: Optional[np.ndarray] = None, amp: Any = None) -> Rollout:
    """G completions for each of the dataset rows `indices` (rollout.generate's contract); the model under
    `model_precision(amp)` (the sampling maths stay float32: rollout.decode)."""
    prompt_ids, prompt_mask = encode(records, indices)
    tokenizer = encode.tokenizer
    with model_precision(amp):
        return policy.generate(prompt_ids, prompt_mask, num_samples=G, max_new_tokens=cfg.max_dec_len,
                               min_new_tokens=cfg.min_dec_len, eos_token_ids=sorted({tokenizer.eos_token_id}),
                               pad_token_id=tokenizer.pad_token_id, temperature=cfg.temperature, top_p=cfg.top_p,
                               top_k=cfg.top_k, repetition_penalty=cfg.repetition_penalty, do_sample=do_sample,
                               max_num_seqs=cfg.rollout_max_num_seqs, row_keys=keys)


def completion_texts(tokenizer: Any, rollout: Rollout) -> List[str]:
    """Completion texts without the EOS token (what reward functions and the server see)."""
    ids = rollout.completion_ids.numpy()
    texts = []
    for row, n, cut in zip(ids, rollout.lengths, rollout.truncated):
        keep = row[:n] if cut else row[:max(0, n - 1)]
        # clean_up_tokenization_spaces would rewrite the text (" ..." -> "..."); rewards see it verbatim.
        texts.append(tokenizer.decode(keep.tolist(), skip_special_tokens=False, clean_up_tokenization_spaces=False))
    return texts


def score(par: ParallelContext, rewarder: Any, use_rm_server: bool, records: Sequence[dict],
          indices: Sequence[int], rollout: Rollout, texts: List[str], G: int) -> RewardResult:
    """Rewards of this rank's rows; under tensor or pipeline parallelism one request per group, shared."""
    def request():
        rows = [records[i] for i in indices for _ in range(G)]
        srcs = [r["src"] for r in rows]
        if use_rm_server:  # the server protocol carries src, tgt and the response only
            return rewarder.score_detailed(srcs, [r.get("tgt") or "" for r in rows], texts)
        extra = {k: [r.get(k) for r in rows] for k in rows[0] if k not in ("src", "tgt")} if rows else {}
        ids = rollout.completion_ids.numpy()
        extra["completion_ids"] = [ids[j, :rollout.lengths[j]].tolist() for j in range(len(rows))]
        return rewarder.score_detailed(srcs, [r.get("tgt") for r in rows], texts, **extra)

    return par.share_within_model_parallel_group(request)


def collect(par: ParallelContext, policy: Policy, encode: PromptEncoder, rewarder: Any, sampler: PromptSampler,
            records: Sequence[dict], cfg: Any, prompts_per_rank: int, step: int,
            amp: Any = None) -> Tuple[Batch, CollectMetrics]:
    """Sample and score this rank's share of the step's prompts; with DAPO dynamic sampling, more rounds until every
    rank has `prompts_per_rank` groups with reward variance (or `max_gen_batches` rounds). Sampling noise is keyed
    by (seed, step, round, global row): the same samples on 1 or N ranks. `amp`: see `model_precision`."""
    G = cfg.rollout_n
    metrics = CollectMetrics()
    kept: List[Tuple[Batch, int]] = []   # (round batch, group) in the order the step keeps them
    dropped = rounds = 0
    while True:
        rounds += 1
        global_indices = sampler.next_batch()
        positions = par.prompt_positions(len(global_indices), cfg.mini_batch_prompts)
        mine = [global_indices[p] for p in positions]
        rows = (np.asarray(positions)[:, None] * G + np.arange(G)[None, :]).reshape(-1)
        t0 = time.perf_counter()
        sampled = rollout(policy, encode, cfg, records, mine, G, keys=row_keys(cfg.seed, step * 1000 + rounds, rows),
                          amp=amp)
        t1 = time.perf_counter()
        texts = completion_texts(encode.tokenizer, sampled)
        batch = Batch.from_rollout(sampled, texts, score(par, rewarder, cfg.use_rm_server, records, mine, sampled,
                                                         texts, G), mine, G)
        metrics.reward_s += time.perf_counter() - t1
        metrics.rollout_s += t1 - t0
        if not cfg.dynamic_sampling:
            kept = [(batch, g) for g in range(len(mine))]
            break
        informative = batch.informative_groups(G)
        dropped += int((~informative).sum())
        kept.extend((batch, int(g)) for g in np.flatnonzero(informative))
        enough = min(par.all_gather_object(len(kept))) >= prompts_per_rank  # every rank must agree to go on
        if enough or rounds >= cfg.max_gen_batches:
            if not enough:  # fill with the zero-variance groups of the last round (their advantage is 0)
                kept.extend((batch, int(g)) for g in np.flatnonzero(~informative))
            break
    kept = kept[:prompts_per_rank]
    if cfg.dynamic_sampling:
        metrics.dropped_groups = float(sum(par.all_gather_object(dropped)))
        metrics.rounds = float(rounds)
    runs: List[Tuple[Batch, List[int]]] = []   # consecutive groups of one round, selected together
    for source, g in kept:
        if runs and runs[-1][0] is source:
            runs[-1][1].append(g)
        else:
            runs.append((source, [g]))
    parts = [source if groups == list(range(len(source) // G)) else source.groups(groups, G)
             for source, groups in runs]
    return Batch.concat(parts, encode.tokenizer.pad_token_id), metrics


# ------------------------------------------------------------------------------------ balancing the ranks

_TENSORS = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "sample_logprobs")


def balance(par: ParallelContext, batch: Batch, cfg: Any, sequences_per_mini_batch: int, pad_id: int) -> Batch:
    """balance_batch: this rank's rows after the data-parallel ranks' rows are reassigned so that each rank's share
    of every global mini-batch has about the same tokens (prompt + completion; `data.balance_rows`: equal row
    counts, token sums within the longest row of each other, the same assignment on every rank). The mini-batches
    keep their rows, gradients are still summed over the ranks, and `gather` puts the rows back in rank order, so
    the step computes what it computes unbalanced, up to float rounding. The batch is trimmed to its rows' own
    longest prompt and completion. Costs one all-gather of the batch's tokens. One rank, or balance_batch off:
    `batch` unchanged."""
    if not cfg.balance_batch or par.dp_world == 1:
        return batch
    mine = {f: (getattr(batch, f).numpy() if f in _TENSORS else getattr(batch, f)) for f in Batch.__dataclass_fields__}
    parts = par.all_gather_object(mine)
    if len({len(p["texts"]) for p in parts}) != 1:
        raise RuntimeError(f"balance_batch: the ranks hold different row counts {[len(p['texts']) for p in parts]}")
    whole = Batch.concat([Batch(**{f: (paddle.to_tensor(v) if f in _TENSORS else v) for f, v in p.items()})
                          for p in parts], pad_id)
    p_len, c_len = row_extents(whole.prompt_mask.numpy(), whole.completion_mask.numpy())
    rows = balance_rows(p_len + c_len, par.dp_world, sequences_per_mini_batch)[par.dp_rank]
    out = whole.take(rows)
    out.row_ids = rows
    L = out.prompt_ids.shape[1]
    p_w, c_w = max(int(p_len[rows].max()), 1), max(int(c_len[rows].max()), 1)
    out.prompt_ids, out.prompt_mask = out.prompt_ids[:, L - p_w:], out.prompt_mask[:, L - p_w:]
    out.completion_ids, out.completion_mask = out.completion_ids[:, :c_w], out.completion_mask[:, :c_w]
    out.sample_logprobs = out.sample_logprobs[:, :c_w]
    return out


# ---------------------------------------------------------------------------------------------- log-probs

@dataclass
class MicroBatch:
    """One micro-batch of a batch: `rows` [k] int64 row indices (ascending) and the columns it runs on, `prompt_cols`
    (a slice of the [n, L] prompt columns) and completion columns 0 .. `width` - 1."""
    rows: np.ndarray
    prompt_cols: slice
    width: int

    def _rows(self, t: paddle.Tensor) -> paddle.Tensor:
        r = self.rows
        if len(r) and r[-1] - r[0] + 1 == len(r):  # a contiguous run: a view, as the padded path always took
            return t[int(r[0]):int(r[-1]) + 1]
        return paddle.gather(t, paddle.to_tensor(r), axis=0)

    def prompt(self, t: paddle.Tensor) -> paddle.Tensor:
        """[n, L] -> [k, its prompt columns]"""
        t = self._rows(t)
        return t if self.prompt_cols == slice(0, t.shape[1]) else t[:, self.prompt_cols]

    def completion(self, t: Optional[paddle.Tensor]) -> Optional[paddle.Tensor]:
        """[n, T] -> [k, width] (None stays None)"""
        if t is None:
            return None
        t = self._rows(t)
        return t if self.width == t.shape[1] else t[:, :self.width]

    def inputs(self, batch: Batch) -> Tuple[paddle.Tensor, paddle.Tensor, paddle.Tensor, paddle.Tensor]:
        """(prompt_ids, prompt_mask, completion_ids, completion_mask) of this micro-batch."""
        return (self.prompt(batch.prompt_ids), self.prompt(batch.prompt_mask), self.completion(batch.completion_ids),
                self.completion(batch.completion_mask))


def removes_padding(cfg: Any) -> bool:
    """Whether micro-batches are sorted by length and trimmed (use_remove_padding or a token budget)."""
    return bool(cfg.use_remove_padding) or cfg.max_tokens_per_micro_batch > 0


def plan_micro_batches(prompt_mask: np.ndarray, completion_mask: np.ndarray, rows: np.ndarray, max_rows: int,
                       cfg: Any) -> List[MicroBatch]:
    """The micro-batches of the batch rows `rows` (masks [n, L] and [n, T], numpy). Padded (use_remove_padding off,
    no token budget): consecutive runs of `max_rows` rows at full width, as always. Otherwise
    `data.form_micro_batches` of the rows by length (budget `max_tokens_per_micro_batch`), each cut to the prompt
    columns some row of it uses and to its longest completion: the padding left is a shorter row's inside its
    micro-batch."""
    L, T = prompt_mask.shape[1], completion_mask.shape[1]
    if not removes_padding(cfg):
        return [MicroBatch(rows[s:s + max_rows], slice(0, L), T) for s in range(0, len(rows), max_rows)]
    p, c = row_extents(prompt_mask[rows], completion_mask[rows])
    out = []
    for part in form_micro_batches(p, c, max_rows, cfg.max_tokens_per_micro_batch):
        r = rows[part]
        used = np.flatnonzero(prompt_mask[r].any(0))
        # Left-padded: the columns before the first one any row uses go. The last column always stays (the causal
        # path reads the first completion token's prediction there), so a right-padded prompt loses nothing.
        first = int(used[0]) if len(used) else L - 1
        out.append(MicroBatch(r, slice(first, L), max(int(c[part].max()), 1)))
    return out


def _in_row_order(parts: List[paddle.Tensor], plan: List[MicroBatch], width: int) -> paddle.Tensor:
    """Per-micro-batch results [k, width_k] -> [n, width] in the batch's row order, columns past a micro-batch's
    width 0."""
    out = paddle.concat([pad_columns(x, width, 0.0, "right") for x in parts], 0)
    order = np.concatenate([mb.rows for mb in plan])
    if np.array_equal(order, np.arange(len(order))):
        return out
    return paddle.gather(out, paddle.to_tensor(np.argsort(order, kind="stable")), axis=0)


@paddle.no_grad()
def logprobs(policy: Policy, batch: Batch, cfg: Any, vocab_parallel: Any = None, with_entropy: bool = False,
             amp: Any = None) -> Tuple[paddle.Tensor, Optional[paddle.Tensor]]:
    """Per-token log-probs [n, T] (and entropy) of the batch's completions under `policy`, in micro-batches of
    per_device_logprob_batch_size rows (sorted by length and trimmed with use_remove_padding or
    max_tokens_per_micro_batch: `plan_micro_batches`), in eval mode (no dropout), as the rollout that sampled them,
    and at the update's precision (`model_precision(amp)`). Padding positions hold meaningless values (0 beyond a
    trimmed micro-batch's width)."""
    out, ent = [], []
    n, T = batch.completion_ids.shape
    plan = plan_micro_batches(batch.prompt_mask.numpy(), batch.completion_mask.numpy(), np.arange(n),
                              cfg.per_device_logprob_batch_size, cfg)
    model = policy.model
    was_training = model.training
    model.eval()
    try:
        for mb in plan:
            with model_precision(amp):  # float32 log-probs out either way
                lp, e = policy.logprobs(*mb.inputs(batch), temperature=cfg.temperature, with_entropy=with_entropy,
                                        vocab_parallel=vocab_parallel)
            out.append(lp)
            ent.append(e)
    finally:
        if was_training:
            model.train()
    return _in_row_order(out, plan, T), (_in_row_order(ent, plan, T) if with_entropy else None)


def reference_logprobs(policy: Policy, reference: Optional[Policy], batch: Batch, cfg: Any,
                       vocab_parallel: Any = None, amp: Any = None) -> Optional[paddle.Tensor]:
    """Log-probs under the reference model: the frozen copy, or under LoRA the policy with its adapters disabled
    (the base model, exactly); None when no KL term needs them. At the update's precision (`model_precision`)."""
    if reference is not None:
        return logprobs(reference, batch, cfg, vocab_parallel, amp=amp)[0]
    if cfg.lora and cfg.needs_reference_model:
        with policy.adapters_disabled():
            return logprobs(policy, batch, cfg, vocab_parallel, amp=amp)[0]
    return None


def reference_kl(par: ParallelContext, batch: Batch, ref_lp: paddle.Tensor) -> float:
    """train/kl: the k3 estimate of KL(sampling policy || reference), token-mean over the global batch."""
    k3 = kl_penalty(batch.sample_logprobs, ref_lp, "k3")
    mask = batch.completion_mask.astype("float32")
    kl_sum, tokens = par.all_reduce_sum([float((k3 * mask).sum()), float(mask.sum())])
    return float(kl_sum / max(tokens, 1.0))


# ------------------------------------------------------------------------------------ rewards, advantages

def shape_rewards(rows: GlobalRows, cfg: Any, normalizer: Optional[RunningRewardNormalizer]
                  ) -> Tuple[np.ndarray, RewardMetrics]:
    """Global rewards [N] float32 after clipping, DAPO overlong shaping and running normalisation; rows no function
    could judge get 0 (docs/algorithms.md section 1)."""
    rewards, valid = rows.rewards, rows.valid
    names = list(rows.scores_by_function[0]) if len(rows.scores_by_function[0]) > 1 else []
    by_function = {}
    for name in names:  # per function only with several: one function's mean would repeat train/reward
        vals = [v for part in rows.scores_by_function for v in part[name] if v is not None]
        if vals:
            by_function[name] = float(np.mean(vals))
    metrics = RewardMetrics(reward=float(rewards[valid].mean()) if valid.any() else 0.0,
                            reward_std=float(rewards[valid].std(ddof=1)) if valid.sum() > 1 else 0.0,
                            none_frac=float(1.0 - valid.mean()), by_function=by_function)
    if cfg.clip_range_score > 0:
        rewards = clip_reward(rewards, cfg.clip_range_score)
    if cfg.enable_overlong_reward_buffer:
        rewards = rewards + np.asarray(overlong_penalty(rows.lengths, cfg.max_dec_len, cfg.overlong_reward_buffer,
                                                        cfg.overlong_penalty_factor), dtype=np.float64)
    if normalizer is not None and valid.any():
        normalizer.update(rewards[valid])
        rewards = np.asarray(normalizer.normalize(rewards), dtype=np.float64)
    rewards = np.where(valid, rewards, 0.0)
    return rewards.astype(np.float32), metrics


def compute_advantages(rows: GlobalRows, rewards: np.ndarray, cfg: Any) -> Tuple[np.ndarray, AdvantageMetrics]:
    """Advantages [N, T_max] of the global batch from the shaped rewards [N] (docs/algorithms.md sections 2-3).
    The reward's KL term (coefficient `cfg.reward_kl_coeff`: `kl_coeff` for the REINFORCE++ family, for the group
    estimators only with `use_kl_in_reward`), when `rows` carries log-probs, goes where the estimator's spec says:
    per token inside the estimator, or per sequence (`R - kl_coeff * sum_t KL_t`) before it."""
    G = cfg.rollout_n
    spec = advantage_estimator_spec(cfg.rl_algorithm)
    mask = rows.mask * rows.valid[:, None]   # rows no function could judge take no part in any statistic
    index = np.repeat(np.arange(len(rewards) // G), G)
    options = {key: getattr(cfg, key) for key in spec.config_options}
    seq_rewards = rewards.copy()
    kl_coeff = cfg.reward_kl_coeff
    if rows.old is not None and kl_coeff != 0:
        if spec.kl_in_reward == "token":
            options.update(kl_coeff=kl_coeff, old_log_probs=paddle.to_tensor(rows.old),
                           ref_log_probs=paddle.to_tensor(rows.ref), kl_estimator=cfg.kl_estimator)
        else:
            kl = kl_penalty(paddle.to_tensor(rows.old), paddle.to_tensor(rows.ref), cfg.kl_estimator).numpy()
            seq_rewards = rewards - kl_coeff * (kl * mask).sum(-1)
    mask_t = paddle.to_tensor(mask.astype(np.float32))
    token_rewards = scalar_to_token_level(paddle.to_tensor(seq_rewards.astype(np.float32)), mask_t)
    adv, _ = spec.fn(token_rewards, mask_t, index, **options)
    if cfg.advantage_normalization:  # normalize_advantage, off for grpo as in PaddleNLP
        adv = normalize_advantage(adv, mask_t)
    adv = adv.numpy()
    m = mask.astype(bool)
    metrics = AdvantageMetrics(mean=float(adv[m].mean()) if m.any() else 0.0,
                               std=float(adv[m].std()) if m.any() else 0.0,
                               frac_reward_zero_std=float((rewards.reshape(-1, G).std(axis=1) < 1e-6).mean()))
    return adv, metrics


def local_rows(rows: GlobalRows, values: np.ndarray, batch: Batch) -> np.ndarray:
    """This rank's rows of a global [N, ...] array, cut to its own completion width."""
    out = values[rows.offset:rows.offset + len(batch)] if rows.rows is None else values[rows.rows]
    return out[:, :batch.completion_ids.shape[1]] if out.ndim == 2 else out


# ---------------------------------------------------------------------------------------------- the update

@dataclass
class UpdateState:
    """The update's counters, kept in checkpoints."""
    optimizer_steps: int = 0
    nonfinite_total: int = 0
    nonfinite_in_a_row: int = 0


@dataclass
class Learner:
    """What the update phase trains: the policy (its full copy under pipeline parallelism, which then only
    generates and scores), this rank's pipeline stage if any, the optimizer, its schedule and the counters.
    `amp`: precision.Amp (autocast context, fp16 loss scale) of a run under AMP, None otherwise."""
    policy: Policy
    pipeline: Any
    optimizer: Any
    scheduler: Any
    state: UpdateState = field(default_factory=UpdateState)
    amp: Any = None

    def parameters(self) -> list:
        return (self.pipeline if self.pipeline is not None else self.policy.model).parameters()

    def amp_state(self) -> Optional[Dict[str, float]]:
        """The fp16 loss scale's state, kept in checkpoints (None without a loss scale)."""
        return self.amp.state_dict() if self.amp else None

    def load_amp_state(self, state: Optional[Dict[str, float]]) -> None:
        """Restore a checkpoint's loss scale (precision.Amp.load_state_dict; a no-op without AMP)."""
        if self.amp:
            self.amp.load_state_dict(state)


@dataclass
class UpdateInputs:
    """The tensors of one update: the batch, advantages [n, T], the loss mask [n, T] (completion mask times the
    row's validity), old log-probs [n, T] (None on-policy: the detached current ones are used) and reference
    log-probs [n, T] (None without KL loss)."""
    batch: Batch
    advantages: paddle.Tensor
    loss_mask: paddle.Tensor
    old_lp: Optional[paddle.Tensor]
    ref_lp: Optional[paddle.Tensor]


def rl_loss(cfg: Any, lp: paddle.Tensor, entropy: paddle.Tensor, old: paddle.Tensor, advantages: paddle.Tensor,
            mask: paddle.Tensor, ref: Optional[paddle.Tensor], agg: Dict[str, Any]) -> Tuple[paddle.Tensor, np.ndarray]:
    """A micro-batch's share of the mini-batch loss: policy loss + KL loss - entropy bonus with the global
    denominators `agg` (docs/algorithms.md sections 4-5), and its LossSums values. All inputs [mb, T]; `ref` None
    without KL loss."""
    out = compute_policy_loss(lp, old, advantages, mask, clip_ratio_low=cfg.eps_low, clip_ratio_high=cfg.eps_high,
                              clip_ratio_c=cfg.clip_ratio_c, importance_sampling_level=cfg.importance_sampling_level,
                              loss_agg_mode=cfg.loss_agg_mode, **agg)
    loss = cfg.pg_loss_coeff * out["pg_loss"]
    kl_loss = paddle.zeros([])
    if cfg.kl_loss_coeff > 0:
        kl_loss = aggregate_loss(kl_penalty(lp, ref, cfg.kl_loss_estimator), mask, cfg.loss_agg_mode, **agg)
        loss = loss + cfg.kl_loss_coeff * kl_loss
    if cfg.entropy_coeff > 0:
        loss = loss - cfg.entropy_coeff * aggregate_loss(entropy, mask, cfg.loss_agg_mode, **agg)
    tokens = float(mask.astype("float32").sum())
    token_means = (masked_mean(entropy.detach(), mask), out["clip_frac_low"], out["clip_frac_high"],
                   out["clip_frac_dual"], out["approx_kl_old"])
    sums = np.array([float(out["pg_loss"]), float(kl_loss)] + [float(v) * tokens for v in token_means] + [tokens])
    return loss, sums


def _micro_batch(learner: Learner, inputs: UpdateInputs, mb: MicroBatch, agg: Dict[str, Any], cfg: Any,
                 vocab_parallel: Any) -> Tuple[np.ndarray, bool]:
    """Forward + backward of one micro-batch (skipped backward when its loss is not finite). A trimmed micro-batch
    loses only masked columns, which add nothing to the loss (global denominators: `agg`)."""
    with model_precision(learner.amp):  # float32 log-probs out either way
        # The entropy is logged every step; it takes a gradient only when the loss has an entropy bonus ("detached":
        # no graph for it, and the chunked head's backward skips its term).
        lp, entropy = learner.policy.logprobs(*mb.inputs(inputs.batch), temperature=cfg.temperature,
                                              with_entropy=True if cfg.entropy_coeff > 0 else "detached",
                                              vocab_parallel=vocab_parallel)
    old = lp.detach() if inputs.old_lp is None else mb.completion(inputs.old_lp)
    loss, sums = rl_loss(cfg, lp, entropy, old, mb.completion(inputs.advantages), mb.completion(inputs.loss_mask),
                         mb.completion(inputs.ref_lp), agg)
    finite = bool(paddle.isfinite(loss))
    if finite:
        (learner.amp.scale(loss) if learner.amp else loss).backward()
    return sums, finite


def pipeline_logprobs(out: paddle.Tensor, completion_ids: paddle.Tensor, cfg: Any, head: Any = None,
                      chunk_size: Optional[int] = None) -> Tuple[paddle.Tensor, paddle.Tensor]:
    """Log-probs and entropies [mb, T] of the completions from the pipeline's last-stage output `out`: the logits
    [mb, S, V], or with `chunk_size` the final hidden states [mb, S, H] that `head` (the stage's LM head layer)
    turns into log-probs chunk by chunk. S = L + T: the token at position L + t is predicted at L + t - 1."""
    T = completion_ids.shape[1]
    # As _micro_batch: the entropy takes a gradient only for an entropy bonus, else it is only logged ("detached").
    with_entropy = True if cfg.entropy_coeff > 0 else "detached"
    if chunk_size is None:
        return logprobs_from_completion_logits(out[:, -T - 1:-1], completion_ids, cfg.temperature, with_entropy)
    return head_logprobs(out[:, -T - 1:-1], head, completion_ids, temperature=cfg.temperature,
                         with_entropy=with_entropy, chunk_size=chunk_size)


def _pipeline_mini_batch(learner: Learner, inputs: UpdateInputs, sl: slice, agg: Dict[str, Any], cfg: Any,
                         micro_batches: int) -> Tuple[np.ndarray, bool]:
    """Forward + backward of the mini-batch rows `sl` through the pipeline (fleet splits them into the
    micro-batches), the loss of `rl_loss` on the last stage; the summed LossSums values and whether every
    micro-batch's loss was finite, on every stage. With the chunked LM head (`policy.head_chunk_size`) the last
    stage hands the loss its final hidden states and the loss applies the stage's LM head chunk by chunk."""
    b = inputs.batch
    ids = paddle.concat([b.prompt_ids[sl], b.completion_ids[sl]], axis=1)
    attention_mask = paddle.concat([b.prompt_mask[sl], b.completion_mask[sl]], axis=1).astype("int64")
    rows = lambda t: None if t is None else t[sl]  # noqa: E731
    labels = (b.completion_ids[sl], inputs.loss_mask[sl], inputs.advantages[sl], rows(inputs.old_lp),
              rows(inputs.ref_lp))
    micro = []
    chunk_size = getattr(learner.policy, "head_chunk_size", None)

    def loss_fn(out, labels):
        completion_ids, mask, adv, old, ref = labels
        # The stage's own head layer (chunked head): its weight's gradient reaches the pipeline optimizer.
        lp, entropy = pipeline_logprobs(out, completion_ids, cfg,
                                        learner.pipeline.lm_head if chunk_size is not None else None, chunk_size)
        loss, sums = rl_loss(cfg, lp, entropy, lp.detach() if old is None else old, adv, mask, ref, agg)
        micro.append(np.append(sums, float(bool(paddle.isfinite(loss)))))
        return loss

    learner.pipeline.forward_backward((ids, attention_mask, None, position_ids_from_mask(attention_mask)), labels,
                                      loss_fn, final_hidden=chunk_size is not None)
    out = learner.pipeline.from_last_stage(np.sum(micro, axis=0) if micro else
                                           np.zeros(len(SHARE_KEYS) + len(TOKEN_MEAN_KEYS) + 2))
    return out[:-1], bool(out[-1] == micro_batches)


def clip_gradients(parameters: Sequence[Any], grad_norm: float, max_grad_norm: float) -> None:
    """Scale gradients by max_grad_norm / norm when the norm exceeds it (as ClipGradByGlobalNorm, but with the
    norm of the whole model under tensor parallelism, not of this rank's shard)."""
    if max_grad_norm <= 0 or grad_norm <= max_grad_norm:
        return
    scale = max_grad_norm / grad_norm
    with paddle.no_grad():
        for p in parameters:
            if p.grad is not None:
                p.grad.scale_(scale)


def update(par: ParallelContext, learner: Learner, inputs: UpdateInputs, cfg: Any, geometry: Any, step: int,
           vocab_parallel: Any = None) -> UpdateMetrics:
    """`update_iters` passes over the batch in mini-batches of `geometry.sequences_per_mini_batch` rows, one
    optimizer step each, gradients accumulated over micro-batches of per_device_train_batch_size rows
    (`plan_micro_batches`: by length and trimmed with use_remove_padding, by tokens with max_tokens_per_micro_batch)
    and summed over the data-parallel ranks. A mini-batch whose loss or gradient is not finite on any rank is
    skipped on all; `max_consecutive_nonfinite` skipped in a row raise TrainingError."""
    n = inputs.batch.completion_ids.shape[0]
    per_mini, mb = geometry.sequences_per_mini_batch, cfg.per_device_train_batch_size
    per_mini_metrics = []
    masks = (inputs.batch.prompt_mask.numpy(), inputs.batch.completion_mask.numpy())
    state = learner.state
    learner.policy.model.train()
    params = learner.parameters()
    for _ in range(cfg.update_iters):
        for m0 in range(0, n, per_mini):
            local = global_denominators(inputs.loss_mask[m0:m0 + per_mini], cfg.loss_agg_mode)
            keys = sorted(local)
            agg = dict(zip(keys, par.all_reduce_sum([local[k] for k in keys]).tolist()))
            agg["max_dec_len"] = cfg.max_dec_len  # read by seq-mean-token-sum-norm only
            sums, finite = LossSums().values, True
            if learner.pipeline is not None:
                sums, finite = _pipeline_mini_batch(learner, inputs, slice(m0, m0 + per_mini), agg, cfg,
                                                    geometry.grad_accum_steps)
            else:
                for micro in plan_micro_batches(*masks, np.arange(m0, min(m0 + per_mini, n)), mb, cfg):
                    micro_sums, micro_finite = _micro_batch(learner, inputs, micro, agg, cfg, vocab_parallel)
                    sums += micro_sums
                    finite = finite and micro_finite
            per_mini_metrics.append(LossSums(par.all_reduce_sum(sums)).means())
            # Every rank takes the same branch: a rank whose loss was not finite skipped its backward, so gradients
            # are summed only when all ranks have them.
            finite = par.all_true(finite)
            if finite:
                par.sum_gradients(params)
                if learner.amp:  # the true gradients (fp16 loss scale divided out) before their norm and clipping
                    learner.amp.unscale(params)
            grad_norm = par.global_grad_norm(params) if finite else float("nan")
            overflow = bool(learner.amp) and learner.amp.overflowed(finite, grad_norm)  # fp16: not a failure
            finite = finite and math.isfinite(grad_norm)
            if finite:
                clip_gradients(params, grad_norm, cfg.max_grad_norm)
            per_mini_metrics[-1]["train/grad_norm"] = grad_norm
            if finite:
                learner.optimizer.step()
                state.nonfinite_in_a_row = 0
            elif not overflow:
                _count_nonfinite(state, step, cfg.max_consecutive_nonfinite)
            learner.optimizer.clear_grad(set_to_zero=False)
            learner.scheduler.step()
            state.optimizer_steps += 1
    if learner.pipeline is not None:  # the next rollout, log-probs and checkpoint use the full copy
        learner.pipeline.copy_to(learner.policy.model)
    return UpdateMetrics(per_mini_metrics, state.nonfinite_total, state.optimizer_steps, cfg.kl_loss_coeff != 0)


def _count_nonfinite(state: UpdateState, step: int, limit: int) -> None:
    state.nonfinite_total += 1
    state.nonfinite_in_a_row += 1
    logger.warning("step %d: non-finite loss or gradient, optimizer step skipped (%d in a row)", step + 1,
                   state.nonfinite_in_a_row)
    if state.nonfinite_in_a_row >= limit:
        raise TrainingError(
            f"{state.nonfinite_in_a_row} consecutive updates had a non-finite loss or gradient "
            f"(max_consecutive_nonfinite = {limit}); stopping. Lower learning_rate, set max_grad_norm, or check "
            "the rewards for inf/NaN.")
