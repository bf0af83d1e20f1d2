"""One RL step as phase functions over a typed `Batch` (docs/architecture.md):

    collect (rollout + score, DAPO dynamic sampling) -> [balance_batch: rows reassigned between ranks] -> log-probs
    (reference, old) -> gather once over the data-parallel ranks -> shape rewards -> advantages -> update
    (mini-batches of micro-batches; with use_remove_padding / a token budget sorted by length and trimmed)

Each rank holds its own rows (`Batch`); the per-sequence data that group statistics, reward normalisation,
REINFORCE++ whitening and the `token-mean` denominators need is gathered once per step (`gather`), so every batch
statistic is over the global batch (docs/algorithms.md sections 1-5). Each phase returns a typed metrics record;
`as_dict()` gives the metric names of docs/algorithms.md section 7.

Multi-turn rollouts with tools (docs/tools.md): the forward passes attend over actions and tool output
(`Batch.attention_mask`), every loss, KL, entropy, value and length over the actions alone (`completion_mask`).

One module per phase: batch.py (the rows, the gather, balance_batch, micro-batches), collection.py (collect),
experience.py (log-probs, the critic's values, rewards, advantages and returns), policy_update.py (the policy's
update), critic_update.py (the critic of PPO / VAPO and its update), metrics.py (the typed records), async_rollout.py (where the batches come
from: the trainer's own collect, or the asynchronous rollout worker), evaluation.py (the held-out evaluation).
Everything is re-exported here: `from paddle_grpo import step; step.collect(...)`.
"""
from __future__ import annotations

from .batch import (Batch, GlobalRows, gather, model_precision, balance, MicroBatch, removes_padding,
    plan_micro_batches, attention_mask)
from .metrics import (CollectMetrics, RewardMetrics, AdvantageMetrics, ValueMetrics, CriticMetrics, LengthMetrics,
    SHARE_KEYS, TOKEN_MEAN_KEYS, MAX_KEYS, LossSums, UpdateMetrics, ToolMetrics, tool_calls_per_row,
    tool_counts_per_row, eval_tool_metrics)
from .collection import (PromptEncoder, build_rewarder, build_tools, rollout, final_answer, completion_texts, score,
    collect)
from .async_rollout import AsyncBatches, SyncBatches, batch_source
from .experience import (logprobs, reference_logprobs, reference_kl, shape_rewards, Estimate, estimate_advantages,
    compute_advantages, positive_rows, positive_threshold, values, local_rows, update_inputs, old_logprobs,
    reward_kl_logprobs)
from .policy_update import (TrainingError, UpdateState, Learner, UpdateInputs, rl_loss, pipeline_logprobs,
    clip_gradients, update, apply_gradients, head_logprobs)
from .critic_update import (CriticLearner, build_critic_learner, CriticInputs, update_critic)
from .evaluation import Evaluator
from .distillation import distill, load_teacher

__all__ = [
    "AdvantageMetrics", "AsyncBatches", "Batch", "Evaluator", "SyncBatches", "batch_source", "build_rewarder",
    "CollectMetrics", "CriticInputs", "CriticLearner", "CriticMetrics", "Estimate", "distill", "load_teacher",
    "GlobalRows", "Learner", "LengthMetrics", "LossSums", "MicroBatch", "PromptEncoder", "RewardMetrics",
    "MAX_KEYS", "SHARE_KEYS", "TOKEN_MEAN_KEYS", "ToolMetrics", "TrainingError", "UpdateInputs", "UpdateMetrics",
    "UpdateState",
    "ValueMetrics", "apply_gradients", "attention_mask", "balance", "build_critic_learner", "build_tools",
    "clip_gradients", "collect", "completion_texts", "compute_advantages", "estimate_advantages",
    "eval_tool_metrics", "final_answer", "gather", "head_logprobs", "local_rows", "tool_calls_per_row",
    "tool_counts_per_row",
    "logprobs", "old_logprobs", "reward_kl_logprobs",
    "model_precision", "pipeline_logprobs", "plan_micro_batches", "positive_rows", "positive_threshold", "reference_kl",
    "reference_logprobs", "removes_padding", "rl_loss", "rollout", "score", "shape_rewards", "update",
    "update_critic", "update_inputs", "values"
]
