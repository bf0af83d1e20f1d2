"""`Config`: every argument group in one flat dataclass (one attribute per key, like PaddleNLP's YAML files), its
derived values, the tables of groups and fields, and `BatchGeometry` (how one step's batch splits into ranks,
mini-batches and micro-batches)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

from .algorithm import AlgorithmArguments
from .critic import CriticArguments
from .data import DataArguments
from .evaluation import EvalArguments
from .fields import HEAD_CHUNK_MIN_VOCAB, SECRET_KEYS, ConfigError, LayoutError, yaml_value
from .kernels import KernelArguments
from .logs import LoggingArguments
from .lora import LoRAArguments
from .model import ModelArguments
from .parallel import ParallelArguments
from .rollout import RolloutArguments
from .tools import ToolArguments
from .training import TrainingArguments


@dataclass
class Config(ModelArguments, LoRAArguments, DataArguments, ParallelArguments, RolloutArguments, TrainingArguments,
             AlgorithmArguments, EvalArguments, LoggingArguments, KernelArguments, CriticArguments, ToolArguments):
    """The whole configuration, flat (one attribute per key) like PaddleNLP's YAML files."""

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)

    def format(self, only_changed: bool = False) -> str:
        """The resolved configuration as YAML text, grouped as in the documentation; `only_changed`: only the
        keys whose value differs from the default (a short start-up summary)."""
        lines = []
        defaults = Config() if only_changed else None
        for group in GROUPS:
            fields = [f for f in dataclasses.fields(group)
                      if not only_changed or getattr(self, f.name) != getattr(defaults, f.name)]
            if only_changed and not fields:
                continue
            lines.append(f"# {group.__name__}")
            for f in fields:
                value = getattr(self, f.name)
                if f.name in SECRET_KEYS and value:
                    value = "***"
                lines.append(f"{f.name}: {yaml_value(value)}")
        return "\n".join(lines) + "\n"

    # Derived values (PaddleNLP semantics of docs/algorithms.md section 6).
    @property
    def eps_low(self) -> float:
        return self.clip_range_ratio if self.clip_range_ratio_low is None else self.clip_range_ratio_low

    @property
    def eps_high(self) -> float:
        return self.clip_range_ratio if self.clip_range_ratio_high is None else self.clip_range_ratio_high

    @property
    def mini_batch_prompts(self) -> int:
        return self.global_batch_size if self.global_mini_batch_size == -1 else self.global_mini_batch_size

    @property
    def lora_alpha_value(self) -> float:
        return 2.0 * self.lora_rank if self.lora_alpha == -1 else self.lora_alpha

    # Where the reward's KL goes: one decision, used by the trainer, the step and the config notes.
    @property
    def reward_kl_coeff(self) -> float:
        """The coefficient of the KL term in the reward: `kl_coeff` for estimators that take it per token
        (REINFORCE++), for the group estimators only with `use_kl_in_reward` (PaddleNLP's GRPO ignores kl_coeff),
        else 0 (docs/algorithms.md section 3)."""
        from ..algorithms import reward_kl_coeff  # paddle: see _from_algorithms
        return reward_kl_coeff(self.rl_algorithm, self.kl_coeff, self.use_kl_in_reward)

    # normalize_reward / normalize_advantage as PaddleNLP applies them: never for grpo (EstimatorSpec).
    @property
    def reward_normalization(self) -> bool:
        """Whether rewards are normalised with running statistics: `normalize_reward`, except for grpo."""
        return self.normalize_reward and self._normalization_keys_apply

    @property
    def advantage_normalization(self) -> bool:
        """Whether advantages are whitened over the global batch: `normalize_advantage`, except for grpo."""
        return self.normalize_advantage and self._normalization_keys_apply

    @property
    def _normalization_keys_apply(self) -> bool:
        from ..algorithms import advantage_estimator_spec  # paddle: see _from_algorithms
        return advantage_estimator_spec(self.rl_algorithm).normalization_keys

    def lm_head_decision(self, vocab_size: int) -> Tuple[Optional[int], str]:
        """`(chunk, line)`: positions per chunk of the policy's LM head for a model of `vocab_size` tokens
        (Policy.head_chunk_size: fused_head_chunk_size, or None for full logits) and one start-up line saying
        which and why. An explicit use_fused_head_and_loss_fn wins; unset (None), the chunked head from
        HEAD_CHUNK_MIN_VOCAB tokens on."""
        chunk, size = self.fused_head_chunk_size, f"vocabulary {vocab_size:,}"
        if self.use_fused_head_and_loss_fn is not None:
            on = self.use_fused_head_and_loss_fn
            why = f"use_fused_head_and_loss_fn: {str(on).lower()} in the config"
        else:
            on = vocab_size >= HEAD_CHUNK_MIN_VOCAB
            why = (f"use_fused_head_and_loss_fn unset, {size} {'>=' if on else '<'} {HEAD_CHUNK_MIN_VOCAB:,} "
                   "(set it to choose)")
        if on:
            return chunk, f"LM head: chunked, {chunk} positions at a time ({why})"
        return None, f"LM head: full [rows, T, {vocab_size}] logits ({why})"

    # The estimator's needs (EstimatorSpec): a critic, its options, key defaults that depend on it.
    @property
    def needs_critic(self) -> bool:
        """Whether this run trains a critic (value model): the estimator takes values (EstimatorSpec.needs_values;
        ppo, vapo)."""
        return bool(self._estimator.needs_values)

    @property
    def positive_lm_coeff(self) -> float:
        """The coefficient of the positive-example LM loss: positive_example_lm_coeff, or when it is unset the
        estimator's default (EstimatorSpec.key_defaults: 0.1 for vapo), else 0."""
        coeff = self.positive_example_lm_coeff
        return float(self._estimator.key_default("positive_example_lm_coeff", 0.0) if coeff is None else coeff)

    def estimator_default(self, key: str, fallback: Any) -> Any:
        """Config key `key` as set, or when it is left at None the estimator's default for it (its spec's
        key_defaults), or `fallback`."""
        value = getattr(self, key)
        return self._estimator.key_default(key, fallback) if value is None else value

    @property
    def min_lr_ratio(self) -> float:
        """min_learning_rate / learning_rate: where the policy's linear / cosine decay ends (lr_lambda's min_ratio);
        0 when learning_rate is 0."""
        return self.min_learning_rate / self.learning_rate if self.learning_rate else 0.0

    @property
    def critic_min_lr_ratio(self) -> float:
        """critic_min_learning_rate / critic_learning_rate (lr_lambda's min_ratio for the critic)."""
        return self.critic_min_learning_rate / self.critic_learning_rate if self.critic_learning_rate else 0.0

    @property
    def _estimator(self) -> Any:
        from ..algorithms import advantage_estimator_spec  # paddle: see _from_algorithms
        return advantage_estimator_spec(self.rl_algorithm)

    @property
    def needs_reference_model(self) -> bool:
        return self.reward_kl_coeff != 0 or self.kl_loss_coeff != 0
    
    def batch_geometry(self, world_size: int = 1) -> BatchGeometry:
        """Per-rank batch sizes for `world_size` processes; raises ConfigError naming the keys when they don't fit."""
        return BatchGeometry.from_config(self, world_size)


GROUPS = (ModelArguments, LoRAArguments, DataArguments, ParallelArguments, RolloutArguments, TrainingArguments,
          AlgorithmArguments, EvalArguments, LoggingArguments, KernelArguments, CriticArguments, ToolArguments)
FIELDS = {f.name: f for f in dataclasses.fields(Config)}


@dataclass(frozen=True)
class BatchGeometry:
    """How one step's batch is split: data-parallel ranks, mini-batches, micro-batches (all counts per step)."""
    data_parallel_degree: int       # ranks that receive different prompts (world / (tp * pp))
    prompts_per_rank: int           # prompts each data rank samples per step
    sequences_per_rank: int         # prompts_per_rank * rollout_n
    mini_batches_per_rollout: int   # optimizer steps per pass over the rollout
    sequences_per_mini_batch: int   # per rank
    grad_accum_steps: int           # micro-batches per optimizer step, per rank
    optimizer_steps_per_step: int   # mini_batches_per_rollout * update_iters

    def __str__(self) -> str:
        """One line for the start-up log: what one step samples and how it is split into optimizer steps."""
        def n(count: int, what: str) -> str:
            return f"{count} {what}" if count == 1 else f"{count} {what}{'es' if what.endswith('ch') else 's'}"

        samples = self.sequences_per_rank // max(1, self.prompts_per_rank)
        return (f"{n(self.data_parallel_degree, 'data-parallel rank')} x {n(self.prompts_per_rank, 'prompt')} x "
                f"{samples} samples = {self.sequences_per_rank} sequences per rank per step; "
                f"{n(self.optimizer_steps_per_step, 'optimizer step')} per step "
                f"({n(self.mini_batches_per_rollout, 'mini-batch')} of {self.sequences_per_mini_batch} sequences "
                f"per rank, {n(self.grad_accum_steps, 'micro-batch')} each)")

    @classmethod
    def from_config(cls, cfg: Config, world_size: int) -> BatchGeometry:
        model_ranks = cfg.tensor_parallel_degree * cfg.pipeline_parallel_degree
        if world_size % model_ranks:
            raise LayoutError(f"tensor_parallel_degree ({cfg.tensor_parallel_degree}) x pipeline_parallel_degree "
                              f"({cfg.pipeline_parallel_degree}) = {model_ranks} does not divide the number of "
                              f"processes ({world_size})")
        dp = world_size // model_ranks
        if cfg.sharding_parallel_degree > 0 and dp % cfg.sharding_parallel_degree:
            raise LayoutError(f"sharding_parallel_degree ({cfg.sharding_parallel_degree}) does not divide the "
                              f"data-parallel degree {dp} (= {world_size} processes / {model_ranks} model ranks)")
        mini = cfg.mini_batch_prompts
        _divides(dp, "data-parallel degree", cfg.global_batch_size, "global_batch_size",
                 f"{world_size} processes / (tensor_parallel_degree x pipeline_parallel_degree)")
        _divides(dp, "data-parallel degree", mini, "global_mini_batch_size", "")
        seqs_per_mini = mini // dp * cfg.rollout_n
        if seqs_per_mini % cfg.per_device_train_batch_size:
            raise ConfigError(
                f"per_device_train_batch_size ({cfg.per_device_train_batch_size}) must divide the sequences of one "
                f"mini-batch on one rank: global_mini_batch_size ({mini}) / data-parallel degree ({dp}) x rollout_n "
                f"({cfg.rollout_n}) = {seqs_per_mini}; set per_device_train_batch_size to "
                f"{max(d for d in range(1, cfg.per_device_train_batch_size + 1) if seqs_per_mini % d == 0)} (the "
                f"largest divisor of {seqs_per_mini} up to {cfg.per_device_train_batch_size})")
        per_rank = cfg.global_batch_size // dp
        return cls(data_parallel_degree=dp, prompts_per_rank=per_rank, sequences_per_rank=per_rank * cfg.rollout_n,
                   mini_batches_per_rollout=cfg.global_batch_size // mini, sequences_per_mini_batch=seqs_per_mini,
                   grad_accum_steps=seqs_per_mini // cfg.per_device_train_batch_size,
                   optimizer_steps_per_step=cfg.global_batch_size // mini * cfg.update_iters)


def _divides(divisor, divisor_name, value, key, how):
    if value % divisor:
        extra = f" ({how})" if how else ""
        raise ConfigError(f"{key} ({value}) must be divisible by the {divisor_name} {divisor}{extra}")
