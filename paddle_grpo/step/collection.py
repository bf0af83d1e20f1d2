"""The collect phase: prompts encoded, completions sampled (`rollout`) and scored (`score`), with DAPO dynamic
sampling (`collect`)."""
from __future__ import annotations

import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..data import PromptSampler, apply_chat_template, collate_prompts, tokenize_prompts
from ..parallel import ParallelContext
from ..policy import Policy
from ..rewards import RewardResult
from ..rollout import Rollout
from ..rollout.sampling import row_keys
from .batch import Batch, model_precision
from .metrics import CollectMetrics


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
