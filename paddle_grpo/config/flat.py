"""`Config`: every argument group in one flat dataclass (one attribute per key, like PaddleNLP's YAML files), its
derived values, the tables of groups and fields, and `BatchGeometry` (how one step's batch splits into ranks,
mini-batches and micro-batches)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

from .algorithm import AlgorithmArguments
from .critic import CRITIC_INHERITS, CriticArguments
from .data import DataArguments
from .distillation import DistillationArguments
from .evaluation import EvalArguments
from .fields import HEAD_CHUNK_MIN_VOCAB, ConfigError, LayoutError, shown_value, yaml_value
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
             AlgorithmArguments, EvalArguments, LoggingArguments, KernelArguments, CriticArguments, ToolArguments,
             DistillationArguments):
    """The whole configuration, flat (one attribute per key) like PaddleNLP's YAML files."""

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)

    def format(self, only_changed: bool = False) -> str:
        """The resolved configuration as YAML text, grouped as in the documentation; `only_changed`: only the
        keys whose value differs from the default (a short start-up summary). Tokens (SECRET_KEYS) are written as
        '***', with a comment naming the environment variable a token came from."""
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
                # a token from the environment is in neither the file nor the command line: say where it came from
                where = getattr(self, "_given", {}).get(f.name, "")  # loading.given_keys
                note = self.unset_note(f.name) if value is None else f"from {where}" if where.startswith("$") else None
                if f.name in getattr(self, "_derived", {}):  # a default that depends on other keys (not set here)
                    note = self._derived[f.name]
                lines.append(f"{f.name}: {yaml_value(shown_value(f.name, value))}" + (f"  # {note}" if note else ""))
        return "\n".join(lines) + "\n"

    def unset_note(self, key: str) -> Optional[str]:
        """What an unset (null) key resolves to in this run, for the resolved configuration (`format`): the
        estimator's default (key_defaults), the policy's value for a critic key, or None when the key has no such
        rule."""
        if key in CRITIC_INHERITS and getattr(self, key) is None:
            source = CRITIC_INHERITS[key]
            if key == "critic_warmup_ratio":
                return (f"null = the policy's warm-up: warmup_steps {self.warmup_steps}" if self.warmup_steps
                        else f"null = the policy's warm-up: warmup_ratio {yaml_value(self.warmup_ratio)}")
            return f"null = {source} {yaml_value(getattr(self, source))}"
        estimator = self._estimator
        if key in dict(estimator.key_defaults) and getattr(self, key) is None:
            return f"null = rl_algorithm {self.rl_algorithm}'s default {yaml_value(estimator.key_default(key))}"
        if key == "rollout_correction_level":
            return f"null = {self.correction_level}" + (" (GSPO's ratio is the geometric mean)"
                                                         if self.importance_sampling_level == "sequence" else "")
        fallbacks = {"clip_range_ratio_high": ("clip_range_ratio", self.clip_range_ratio),
                     "clip_range_ratio_low": ("clip_range_ratio", self.clip_range_ratio),
                     "positive_example_lm_coeff": ("off", None), "pretrain_critic_steps": ("no pretraining", None),
                     "positive_example_min_reward": ("eval_max_reward, else the maximum the reward functions "
                                                     "declare, minus 1e-6", None),
                     "eval_temperature": ("temperature", self.temperature), "eval_top_p": ("top_p", self.top_p),
                     "eval_top_k": ("top_k", self.top_k), "eval_max_dec_len": ("max_dec_len", self.max_dec_len)}
        if key in fallbacks:
            name, value = fallbacks[key]
            return f"null = {name}" + ("" if value is None else f" {yaml_value(value)}")
        return None

    # Derived values (PaddleNLP semantics of docs/algorithms.md section 6).
    @property
    def eps_low(self) -> float:
        return self.clip_range_ratio if self.clip_range_ratio_low is None else self.clip_range_ratio_low

    @property
    def eps_high(self) -> float:
        """clip_range_ratio_high, or when it is unset the estimator's default (vapo: 0.28, the paper's
        clip-higher), else clip_range_ratio."""
        return float(self.estimator_default("clip_range_ratio_high", self.clip_range_ratio))

    @property
    def mini_batch_prompts(self) -> int:
        return self.global_batch_size if self.global_mini_batch_size == -1 else self.global_mini_batch_size

    @property
    def lora_alpha_value(self) -> float:
        return 2.0 * self.lora_rank if self.lora_alpha == -1 else self.lora_alpha

    # The rollout correction as it runs: one decision, used by the step, the dry run and the config notes.
    @property
    def correction_mode(self) -> str:
        """rollout_correction as the run applies it: as set, or when the file and the command line leave it out,
        `clip` for a lagged sampler (async_rollout with rollout_lag >= 1: uncorrected, it collapsed the quickstart,
        docs/async.md), else `none` (validation.resolve_rollout_correction writes it at load)."""
        return self.rollout_correction

    @property
    def correction_reason(self) -> str:
        """Why `correction_mode` is what it is, for the dry run and the resolved configuration."""
        where = getattr(self, "_given", {}).get("rollout_correction")  # loading.given_keys
        if where:
            return f"set at {where}"
        if getattr(self, "_derived", {}).get("rollout_correction") and not (self.async_rollout
                                                                          and self.rollout_lag >= 1):
            return (f"the default for rollout_precision {self.rollout_precision}: the sampler's products round "
                    "otherwise than the float32 trainer's; set rollout_correction: none to train uncorrected")
        if getattr(self, "_derived", {}).get("rollout_correction"):
            return (f"the default for async_rollout with rollout_lag {self.rollout_lag}: the samples come from "
                    f"weights {self.rollout_lag} update(s) old, and uncorrected that collapsed the quickstart "
                    "(docs/async.md); set rollout_correction: none to train on them uncorrected")
        return "the default without a lagged sampler"

    @property
    def correction_level(self) -> str:
        """rollout_correction_level as set, or when it is unset `geometric` for GSPO's sequence ratio
        (importance_sampling_level sequence, whose own ratio is the geometric mean), else `token`."""
        if self.rollout_correction_level is not None:
            return self.rollout_correction_level
        return "geometric" if self.importance_sampling_level == "sequence" else "token"

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

    @property
    def critic_pretrain_steps(self) -> int:
        """Steps that update only the critic: pretrain_critic_steps, or when it is unset the estimator's default
        (vapo: 50, the paper's and PaddleNLP's VAPO file), else 0; always 0 without a critic."""
        return int(self.estimator_default("pretrain_critic_steps", 0)) if self.needs_critic else 0

    def policy_optimizer_steps(self, max_steps: int, optimizer_steps_per_step: int) -> int:
        """Optimizer steps of the policy over a run of `max_steps`: those of the steps after the value pretraining
        (critic_pretrain_steps), at least 1. The policy's schedule spans them, so its warm-up and decay run in full
        and the last step reaches min_learning_rate."""
        return max(1, (max_steps - self.critic_pretrain_steps) * optimizer_steps_per_step)

    def positive_min_reward(self, declared_max: Optional[float]) -> Optional[float]:
        """The reward from which a completion is a positive (correct) example: positive_example_min_reward, else
        the reward that counts as correct in eval/accuracy (eval_max_reward, else `declared_max`, the maximum the
        reward functions declare) minus the same 1e-6; None when none is known."""
        if self.positive_example_min_reward is not None:
            return float(self.positive_example_min_reward)
        best = self.eval_max_reward if self.eval_max_reward is not None else declared_max
        return None if best is None else float(best) - 1e-6

    def critic_setting(self, key: str) -> Any:
        """The critic's optimizer key `key` (critic_learning_rate, ...) as set, or when it is unset (null) the
        policy's value (CRITIC_INHERITS), as PaddleNLP's create_critic_trainer copies the actor's arguments."""
        value = getattr(self, key)
        return getattr(self, CRITIC_INHERITS[key]) if value is None else value

    def critic_warmup_steps(self, total_optimizer_steps: int) -> int:
        """The critic's warm-up in its optimizer steps: critic_warmup_ratio of them when it is set, else the
        policy's warm-up rule (warmup_steps, else warmup_ratio of the critic's steps), as PaddleNLP's critic
        inherits the actor's warmup_steps / warmup_ratio."""
        if self.critic_warmup_ratio is not None:
            return int(self.critic_warmup_ratio * total_optimizer_steps)
        return self.warmup_steps or int(self.warmup_ratio * total_optimizer_steps)

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
        """The critic's floor / peak learning rate (lr_lambda's min_ratio for the critic; critic_setting)."""
        peak = self.critic_setting("critic_learning_rate")
        return self.critic_setting("critic_min_learning_rate") / peak if peak else 0.0

    @property
    def _estimator(self) -> Any:
        from ..algorithms import advantage_estimator_spec  # paddle: see _from_algorithms
        return advantage_estimator_spec(self.rl_algorithm)

    @property
    def needs_reference_model(self) -> bool:
        return self.reward_kl_coeff != 0 or self.kl_loss_coeff != 0

    @property
    def reference_in_rollout_worker(self) -> bool:
        """The rollout worker computes the reference log-probs (async_rollout, docs/async.md), not the trainer."""
        return (self.async_rollout and self.rollout_worker_reference and self.needs_reference_model
                and not self.sync_ref_model)
    
    def batch_geometry(self, world_size: int = 1) -> BatchGeometry:
        """Per-rank batch sizes for `world_size` processes; raises ConfigError naming the keys when they don't fit."""
        return BatchGeometry.from_config(self, world_size)


GROUPS = (ModelArguments, LoRAArguments, DataArguments, ParallelArguments, RolloutArguments, TrainingArguments,
          AlgorithmArguments, EvalArguments, LoggingArguments, KernelArguments, CriticArguments, ToolArguments,
          DistillationArguments)
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
