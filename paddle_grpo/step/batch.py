"""The step's rows: `Batch` (this rank's), `GlobalRows` and `gather` (the step's one gather over the
data-parallel ranks), `balance` (balance_batch) and the micro-batches (`MicroBatch`, `plan_micro_batches`)."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import paddle

from ..data import balance_rows, form_micro_batches, pad_columns, row_extents
from ..parallel import ParallelContext
from ..rewards import RewardResult
from ..rollout import Rollout


@dataclass
class Batch:
    """This data-parallel rank's rows of one step, prompt by prompt (rows i*G .. i*G+G-1 answer one prompt).

    Tensors: `prompt_ids`/`prompt_mask` [n, L] int64, left-padded; `completion_ids`/`completion_mask` [n, T] int64
    (mask 1 up to and including EOS); `sample_logprobs` [n, T] float32, the sampled tokens' log-probs at sampling
    time. Per row: `lengths` [n] generated tokens (EOS included), `truncated` [n] bool (stopped by max_dec_len),
    `texts` the decoded completions the rewards saw, `rewards` [n] float64 combined reward (0 where not `valid`),
    `valid` [n] bool (False: no reward function could judge the row), `scores_by_function` {name: [n] raw scores},
    `prompt_index` the dataset row each sample answers. `row_ids` [n]: each row's global row (rank order) after
    balance_batch moved rows between ranks (`balance`); None while a rank holds its own rows in order.

    Multi-turn rollouts with tools (docs/tools.md, "Masks"): `completion_mask` is 1 only on the tokens the policy
    sampled (the actions: every loss, KL, entropy, value and length uses it); `tool_mask` [n, T] int64 is 1 on the
    tool-output and template tokens the rollout appended (context the model reads, never an action); the tokens
    that exist are their union (`attention_mask`), which every forward pass attends over. `lengths` counts actions.
    `turns` per row the messages of the conversation (assistant and tool dicts, in order). Both None single-turn.

    `ref_logprobs` [n, T] float32: the reference model's log-probs of the completion tokens when the rollout worker
    computed them with the samples (async_rollout, docs/async.md); None: the trainer computes them
    (step.reference_logprobs)."""
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
    tool_mask: Optional[paddle.Tensor] = None
    turns: Optional[list] = None
    ref_logprobs: Optional[paddle.Tensor] = None

    def attention_mask(self) -> paddle.Tensor:
        """[n, T] int64: the completion tokens that exist, actions and tool output (`completion_mask | tool_mask`)
        -- what the forward passes attend over; the completion mask itself without tools."""
        return attention_mask(self.completion_mask, self.tool_mask)

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
                   prompt_index=[i for i in indices for _ in range(G)],
                   tool_mask=rollout.tool_mask, turns=rollout.turns)

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
                     row_ids=None if self.row_ids is None else self.row_ids[rows],
                     tool_mask=None if self.tool_mask is None else take(self.tool_mask),
                     turns=None if self.turns is None else [self.turns[r] for r in rows],
                     ref_logprobs=None if self.ref_logprobs is None else take(self.ref_logprobs))

    @staticmethod
    def concat(parts: Sequence["Batch"], pad_id: int) -> "Batch":
        """Stack batches, padding prompts (left) and completions (right) to the widest part."""
        if len(parts) == 1:
            return parts[0]
        L = max(p.prompt_ids.shape[1] for p in parts)
        T = max(p.completion_ids.shape[1] for p in parts)
        cat = lambda name, width, value, side: paddle.concat(  # noqa: E731
            [pad_columns(getattr(p, name), width, value, side) for p in parts])
        tools = any(p.tool_mask is not None for p in parts)  # a part without tool tokens: tool_mask all 0
        tool_mask = paddle.concat([pad_columns(p.tool_mask if p.tool_mask is not None else
                                               paddle.zeros_like(p.completion_mask), T, 0, "right")
                                   for p in parts]) if tools else None
        turns = [t for p in parts for t in (p.turns or [[] for _ in p.texts])] \
            if any(p.turns is not None for p in parts) else None
        # Reference log-probs only when every part has them (else the trainer computes them for the whole).
        ref = cat("ref_logprobs", T, 0.0, "right") if all(p.ref_logprobs is not None for p in parts) else None
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
                     prompt_index=[i for p in parts for i in p.prompt_index], tool_mask=tool_mask, turns=turns,
                     ref_logprobs=ref)

    def sample_rows(self, records: Sequence[dict], k: int = 4) -> List[dict]:
        """The first `k` samples as logged rows: `prompt` (the record's src), `completion` (the text the rewards
        scored), `reward` (the combined reward before any shaping; None when not judged), `scores` (each function's
        own score) and `length` (generated tokens, EOS included); multi-turn rows add `turns` (the row's messages:
        each assistant turn and tool result, in order)."""
        rows = [{"prompt": records[self.prompt_index[i]]["src"], "completion": self.texts[i],
                 "reward": float(self.rewards[i]) if self.valid[i] else None,
                 "scores": {name: values[i] for name, values in self.scores_by_function.items()},
                 "length": int(self.lengths[i])}
                for i in range(min(k, len(self)))]
        if self.turns is not None:
            for i, row in enumerate(rows):
                row["turns"] = self.turns[i]
        return rows


def attention_mask(completion_mask: paddle.Tensor, tool_mask: Optional[paddle.Tensor]) -> paddle.Tensor:
    """[n, T] int64 `completion_mask | tool_mask` (the completion mask itself when `tool_mask` is None)."""
    if tool_mask is None:
        return completion_mask
    return ((completion_mask != 0) | (tool_mask != 0)).astype("int64")


@dataclass
class GlobalRows:
    """Per-sequence data of the whole step: every data-parallel rank's rows, in rank order ([N] or [N, T_max],
    completions right-padded to the widest rank's). `offset` is this rank's first row; `rows` [n] this rank's
    rows when balance_batch moved rows between ranks (None: offset .. offset + n - 1). `old`/`ref` (the sampling
    and reference log-probs) only when the reward carries a KL term; `values` [N, T_max] the critic's values of the
    completion tokens (experience.values) when the estimator takes values (EstimatorSpec.needs_values)."""
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
    values: Optional[np.ndarray] = None


def gather(par: ParallelContext, batch: Batch, old_for_reward: Optional[paddle.Tensor],
           ref_lp: Optional[paddle.Tensor], values: Optional[paddle.Tensor] = None) -> GlobalRows:
    """The step's one gather over the data-parallel ranks. Rows that `balance` moved between ranks are put back in
    rank order (prompt groups consecutive, as the advantages need). `values` [n, T]: the critic's, gathered too."""
    local = {"rewards": batch.rewards, "valid": batch.valid, "lengths": batch.lengths, "truncated": batch.truncated,
             "by_function": batch.scores_by_function, "mask": batch.completion_mask.numpy(), "row_ids": batch.row_ids}
    if old_for_reward is not None:
        local["old"], local["ref"] = old_for_reward.numpy(), ref_lp.numpy()
    if values is not None:
        local["values"] = values.numpy()
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
                      offset=par.dp_rank * len(batch), rows=batch.row_ids,
                      values=stack("values", T) if values is not None else None)



def model_precision(amp: Any) -> contextlib.AbstractContextManager:
    """The context every model pass whose log-probs are compared runs in (the rollout that samples, the old and
    reference log-probs, the update): the plan's autocast under AMP (precision.Amp), else a no-op. One precision
    for all of them: under O1 a float32 old/reference pass against an autocast update would make the ratio differ
    from 1 on policy and the k3 KL positive at step 0."""
    return amp.autocast() if amp else contextlib.nullcontext()



# ------------------------------------------------------------------------------------ balancing the ranks

# The Batch fields that are paddle tensors (numpy on the wire: balance's all-gather, the rollout worker's pipe).
BATCH_TENSORS = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "sample_logprobs", "tool_mask",
                 "ref_logprobs")


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
    mine = {f: (getattr(batch, f).numpy() if f in BATCH_TENSORS and getattr(batch, f) is not None
                else getattr(batch, f)) for f in Batch.__dataclass_fields__}
    parts = par.all_gather_object(mine)
    if len({len(p["texts"]) for p in parts}) != 1:
        raise RuntimeError(f"balance_batch: the ranks hold different row counts {[len(p['texts']) for p in parts]}")
    whole = Batch.concat([Batch(**{f: (paddle.to_tensor(v) if f in BATCH_TENSORS and v is not None else v)
                                   for f, v in p.items()}) for p in parts], pad_id)
    # Widths by the tokens that exist, actions and tool output: the forward passes attend over both.
    p_len, c_len = row_extents(whole.prompt_mask.numpy(), whole.attention_mask().numpy())
    rows = balance_rows(p_len + c_len, par.dp_world, sequences_per_mini_batch)[par.dp_rank]
    out = whole.take(rows)
    out.row_ids = rows
    L = out.prompt_ids.shape[1]
    p_w, c_w = max(int(p_len[rows].max()), 1), max(int(c_len[rows].max()), 1)
    out.prompt_ids, out.prompt_mask = out.prompt_ids[:, L - p_w:], out.prompt_mask[:, L - p_w:]
    out.completion_ids, out.completion_mask = out.completion_ids[:, :c_w], out.completion_mask[:, :c_w]
    out.sample_logprobs = out.sample_logprobs[:, :c_w]
    if out.tool_mask is not None:
        out.tool_mask = out.tool_mask[:, :c_w]
    if out.ref_logprobs is not None:
        out.ref_logprobs = out.ref_logprobs[:, :c_w]
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
        """(prompt_ids, prompt_mask, completion_ids, attention mask of the completion) of this micro-batch: the
        forward passes' inputs. The 4th is `batch.attention_mask()` (actions and tool output: tool results are
        context the model reads), never the loss mask."""
        return (self.prompt(batch.prompt_ids), self.prompt(batch.prompt_mask), self.completion(batch.completion_ids),
                attention_mask(self.completion(batch.completion_mask), self.completion(batch.tool_mask)))


def removes_padding(cfg: Any) -> bool:
    """Whether micro-batches are sorted by length and trimmed (use_remove_padding or a token budget)."""
    return bool(cfg.use_remove_padding) or cfg.max_tokens_per_micro_batch > 0


def plan_micro_batches(prompt_mask: np.ndarray, completion_mask: np.ndarray, rows: np.ndarray, max_rows: int,
                       cfg: Any) -> List[MicroBatch]:
    """The micro-batches of the batch rows `rows` (masks [n, L] and [n, T], numpy; `completion_mask` is the
    attention mask `Batch.attention_mask()`, so that no micro-batch is cut inside a row's tool output). Padded
    (use_remove_padding off, no token budget): consecutive runs of `max_rows` rows at full width, as always. Otherwise
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
