"""Held-out evaluation (docs/evaluation.md): n completions per eval prompt, greedy (n = 1) or sampled with the
evaluation's own temperature / top-p / top-k / length (Config.eval_generation), scored by the reward functions or
the reward server. Metrics: eval/reward, eval/accuracy (share of samples with the reward that counts as correct),
with n > 1 eval/pass@k, eval/mean@n and eval/maj@n (algorithms/pass_at_k.py), with tools the tool metrics; each
problem's scores, answers and correct count go to eval_per_problem.jsonl.

Sampling noise is keyed by (seed + 1, step, row), never the training stream's (seed, ...): evaluating, or how many
samples it draws, leaves the training trajectory unchanged. Sample j of eval prompt i is row j * N + i (N eval
prompts), so sample 0 has the key one sample per prompt gets, whatever n.
"""
from __future__ import annotations

import logging
import time
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from ..algorithms import majority_correct, pass_at_k, pass_at_k_sizes
from ..parallel import ParallelContext
from ..policy import Policy
from ..rollout.sampling import row_keys
from .batch import Batch
from .collection import PromptEncoder, completion_texts, rollout, score
from .metrics import eval_tool_metrics, tool_counts_per_row

logger = logging.getLogger("paddle_grpo.step.evaluation")

CORRECT_TOLERANCE = 1e-6  # a reward within this of the maximum counts as correct (rewards are sums of floats)


def eval_rows(indices: Sequence[int], n: int, n_prompts: int) -> np.ndarray:
    """[len(indices) * n] the sampling rows of eval prompts `indices` (prompt-major, as rollout orders them): sample
    j of prompt i is row j * n_prompts + i, so sample 0 is keyed as a one-sample evaluation keys prompt i."""
    return (np.arange(n)[None, :] * n_prompts + np.asarray(indices)[:, None]).reshape(-1)


def sample_metrics(scores: np.ndarray, best: Optional[float], answers: Optional[List[List[Optional[str]]]]
                   ) -> Dict[str, float]:
    """The n-sample metrics of `scores` [P, n] (NaN: not judged, counted wrong): eval/pass@k for k in
    pass_at_k_sizes(n), eval/mean@n, and eval/maj@n when `answers` ([P][n]) is given; {} without `best` (no
    correctness) or with n = 1 (where each equals eval/accuracy)."""
    n = scores.shape[1]
    if best is None or n < 2:
        return {}
    correct = np.nan_to_num(scores, nan=-np.inf) >= best - CORRECT_TOLERANCE
    counts = correct.sum(axis=1)
    out = {f"eval/pass@{k}": float(pass_at_k(counts, n, k).mean()) for k in pass_at_k_sizes(n)}
    out[f"eval/mean@{n}"] = float((counts / n).mean())
    if answers is not None:
        out[f"eval/maj@{n}"] = float(np.mean([majority_correct(a, c) for a, c in zip(answers, correct)]))
    return out


class Evaluator:
    """The run's evaluation: `evaluator(step, final, amp)` generates, scores and logs (per-problem rows and the
    eval sample cards through `log`) and returns the metrics. One per trainer; every data-parallel rank calls it."""

    def __init__(self, cfg: Any, par: ParallelContext, policy: Policy, encode: PromptEncoder, rewarder: Any,
                 records: Sequence[dict], log: Any, tools: Optional[Any] = None):
        self.cfg, self.par, self.policy, self.encode = cfg, par, policy, encode
        self.rewarder, self.records, self.log, self.tools = rewarder, records, log, tools
        self._warned: set = set()

    def max_reward(self) -> Optional[float]:
        """The reward that counts as correct: eval_max_reward, else the maximum the reward functions declare
        (None when unknown, e.g. a PaddleNLP server; eval/accuracy is then not reported)."""
        if self.cfg.eval_max_reward is not None:
            return self.cfg.eval_max_reward
        best = self.rewarder.max_score
        if best is None:
            self._warn_once("max", "eval/accuracy is not reported: the reward functions do not declare a maximum "
                                   "score; set eval_max_reward")
        return best

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned and self.par.is_main:
            logger.warning(message)
        self._warned.add(key)

    def _answers(self, indices: Sequence[int], texts: List[str], n: int) -> Optional[List[Optional[str]]]:
        """Each completion's final answer as the rewards read it (RewardSet.extract_answers); None when they read
        none (the majority vote is then not reported, and the log says why once)."""
        extract = getattr(self.rewarder, "extract_answers", None)
        if extract is None or self.rewarder.answer_source is None:
            why = ("the reward server's protocol returns scores only" if extract is None else
                   "none of the reward functions has an answer extractor (register_reward(..., extract_answer=fn) "
                   "or fn.extract_answer; docs/evaluation.md)")
            self._warn_once("maj", f"eval/maj@n is not reported: {why}")
            return None
        rows = [self.records[i] for i in indices for _ in range(n)]
        extra = {k: [r.get(k) for r in rows] for k in rows[0] if k not in ("src", "tgt")}
        return extract([r["src"] for r in rows], [r.get("tgt") for r in rows], texts, **extra)

    def __call__(self, step: int, final: bool = False, amp: Any = None) -> Dict[str, float]:
        cfg, par, records = self.cfg, self.par, self.records
        n = cfg.eval_samples_at(final)
        shard = list(range(par.dp_rank, len(records), par.dp_world))
        mine: List[tuple] = []  # (prompt index, its n scores, its n answers or None, its n tool_counts_per_row)
        samples: list = []
        t0 = time.perf_counter()
        for s in range(0, len(shard), cfg.per_device_eval_batch_size):
            idx = shard[s:s + cfg.per_device_eval_batch_size]
            keys = row_keys(cfg.seed + 1, step, eval_rows(idx, n, len(records))) if cfg.eval_do_sample else None
            sampled = rollout(self.policy, self.encode, cfg, records, idx, n, do_sample=cfg.eval_do_sample,
                              keys=keys, amp=amp, sampling=cfg.eval_generation())
            texts = completion_texts(self.encode.tokenizer, sampled)
            result = score(par, self.rewarder, cfg.use_rm_server, records, idx, sampled, texts, n)
            answers = self._answers(idx, texts, n)
            calls = tool_counts_per_row(sampled.turns if self.tools else None, len(texts))
            for p, i in enumerate(idx):
                rows = slice(p * n, (p + 1) * n)
                mine.append((i, result.scores[rows], None if answers is None else answers[rows], calls[rows]))
            if not samples:
                samples = Batch.from_rollout(sampled, texts, result, idx, n).sample_rows(records, 2)
        problems = sorted((p for part in par.all_gather_object(mine) for p in part), key=lambda p: p[0])
        scores = np.array([[np.nan if r is None else r for r in p[1]] for p in problems],
                          dtype=np.float64).reshape(len(problems), n)
        best = self.max_reward()
        judged = scores[~np.isnan(scores)]
        metrics = {"eval/reward": float(judged.mean()) if judged.size else 0.0,
                   "eval/samples": float(scores.size), "perf/eval_s": time.perf_counter() - t0}
        correct = None if best is None else np.nan_to_num(scores, nan=-np.inf) >= best - CORRECT_TOLERANCE
        if correct is not None:  # unjudged samples count as wrong
            metrics["eval/accuracy"] = float(correct.mean())
        answers = None if any(p[2] is None for p in problems) else [p[2] for p in problems]
        metrics.update(sample_metrics(scores, best, answers))
        if self.tools is not None:  # tool use, and accuracy with and without it
            metrics.update(eval_tool_metrics([c for p in problems for c in p[3]],
                                             None if correct is None else correct.reshape(-1)))
        self.log.log_eval_problems(step, [
            {"index": int(p[0]), "scores": list(p[1]), "answers": p[2],
             "correct": None if correct is None else int(correct[j].sum())} for j, p in enumerate(problems)])
        self.log.log_samples(step, samples, tag="eval")
        return metrics
