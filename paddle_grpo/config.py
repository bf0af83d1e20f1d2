"""Configuration: PaddleNLP's GRPO keys as dataclass fields, loaded from flat YAML/JSON plus `--key value` overrides.

An existing PaddleNLP `grpo_argument.yaml` loads unchanged: every key of PaddleNLP's GRPO / REINFORCE++ configs is a
field here with PaddleNLP's meaning, or is accepted with a one-line warning saying why it has no effect. Keys this
project adds are marked "(new)" in their help text. Everything is validated at load time; every error names the file,
line and key (see `ConfigError`).

PaddleNLP's own `PdArgumentParser` is not used: it cannot say which line of a YAML file is wrong, does not suggest
the closest key, and importing paddlenlp only to read a config costs seconds.
"""
from __future__ import annotations

import dataclasses
import difflib
import json
import math
import os
import logging
import re
import typing
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import yaml

from .precision import CPU_REASONS, GPU_EFFECT, NOT_IMPLEMENTED

logger = logging.getLogger("paddle_grpo.config")

LR_SCHEDULERS = ("constant", "constant_with_warmup", "linear", "cosine")
REPORT_TO = ("visualdl", "all", "wandb", "tensorboard", "none")
VISUALDL_STANDS_IN = ("wandb", "tensorboard")  # PaddleNLP's other loggers: VisualDL records the metrics instead

# Older PaddleNLP configs used these names; they load as the key they became.
ALIASES = {
    "mini_batch_size": "global_mini_batch_size",
    "per_device_rollout_batch_size": "rollout_max_num_seqs",
    "quant_type": "rollout_quant_type",
    "num_return_sequences": "rollout_n",
    "lora_r": "lora_rank",                      # peft/TRL's name (LoRAConfig.r)
    "lora_target_modules": "target_modules",    # TRL's name
    "fused_linear": "use_fused_linear",         # PaddleNLP's name until it was renamed
}


SECRET_KEYS = ("reward_server_token", "tool_server_token")  # never printed or written out

# Effect statements shared by several keys.
CPU_FLOAT32 = ("CPU runs compute in float32 (paddle's CPU kernels have no bfloat16 matmul, docs/platform.md)")
HOST_MEMORY = "on a CPU run everything is already in host memory"
# fused_head_chunk_size's default: at V = 151,936 the chunked head's forward + backward over 8 x 128 positions took
# 10.7 / 9.8 / 9.3 / 9.2 s with chunks of 128 / 256 / 512 / 1024 positions (tools/bench.py --ops, docs/PERFORMANCE.md);
# 512 is within 2 % of 1024 at half its transient memory (512 x V float32 = 311 MB per buffer).
DEFAULT_HEAD_CHUNK_SIZE = 512
# use_fused_head_and_loss_fn when the config leaves it unset: the chunked head from this vocabulary size on, full
# logits below. Measured with `python tools/bench_head.py` (the update's LM head, forward + backward, 8 x 128
# positions, hidden 896, chunk 512; docs/PERFORMANCE.md), in process CPU seconds because the 2-core host was under
# load 8: chunked / full time 2.1, 1.2, 1.3, 1.15, 0.81, 0.80, 0.77 and peak memory 1.0, 0.68, 0.60, 0.54, 0.63,
# 0.46, 0.40 at V = 128, 1,024, 2,048, 4,096, 8,192, 32,768, 151,936. From 8,192 on the chunked head is faster and
# smaller; below it the full logits are faster and small (175 MB at 4,096). Real vocabularies (Llama's 32,000,
# GPT-2's 50,257, Qwen's 151,936) are above, the project's toy models (128 to 512 tokens, whose numbers stay bit for
# bit) below.
HEAD_CHUNK_MIN_VOCAB = 8192


class ConfigError(ValueError):
    """A configuration problem; the message names the source (file:line or command line) and the key."""


class LayoutError(ConfigError):
    """The parallel degrees do not fit the number of processes this run was started with (run_rl.py then prints
    the launch command the configuration needs)."""


Choices = Union[Tuple[str, ...], Callable[[], Tuple[str, ...]]]


def _from_algorithms(name: str) -> Callable[[], Tuple[str, ...]]:
    """The choices `paddle_grpo.algorithms.<name>` holds (a tuple, or a function of the registry that returns the
    names), read when they are asked for: what is registered after this module is imported is a valid choice, and
    `import paddle_grpo.config` stays light (algorithms/ imports paddle)."""
    def choices() -> Tuple[str, ...]:
        from . import algorithms
        found = getattr(algorithms, name)
        return tuple(found() if callable(found) else found)

    return choices


def field_choices(f: dataclasses.Field) -> Optional[Tuple[str, ...]]:
    """The valid values of config field `f` (None: any value of its type)."""
    choices = f.metadata["choices"]
    return choices() if callable(choices) else choices


@dataclass(frozen=True)
class Effect:
    """What a key does on one device: `active` False means setting it changes nothing there, and `note` says why;
    active with a `note`: a caveat (for example which GPU paths are verified only on CPU)."""
    active: bool
    note: str = ""


ON = Effect(True)
DEVICES = ("cpu", "gpu")


def off(reason: str) -> Effect:
    """The key has no effect on that device, because `reason`."""
    return Effect(False, reason)


def on(note: str) -> Effect:
    """The key has its effect on that device, with a caveat `note`."""
    return Effect(True, note)


def nowhere(reason: str) -> Dict[str, Effect]:
    """`arg(..., **nowhere(reason))`: the key has no effect on any device."""
    return {"cpu": off(reason), "gpu": off(reason)}


def _amp_effect(key: str) -> Dict[str, Effect]:
    """The precision and kernel keys' statements, from precision.py's tables (one source): implemented on GPU (only
    the decision logic is verified, on CPU), off on CPU with the reason; or not implemented on any device."""
    if key in NOT_IMPLEMENTED:
        return nowhere(NOT_IMPLEMENTED[key])
    return {"cpu": off(CPU_REASONS.get(key, CPU_FLOAT32)),
            "gpu": on(f"{GPU_EFFECT[key]} (paddle_grpo/precision.py; verified only on CPU: the decision logic)")}


# recompute / recompute_granularity / recompute_use_reentrant on GPU: device-independent code (paddle's recompute).
_RECOMPUTE_GPU = on("the same paddle recompute as on CPU (policy/fast_qwen2.py, PaddleNLP's forward); verified only "
                    "on CPU")


def arg(default: Any, help: str, *, choices: Optional[Choices] = None, cpu: Effect = ON, gpu: Effect = ON,
        default_factory: Optional[Callable[[], Any]] = None) -> Any:
    """A config field. `choices`: the valid values, or a function returning them when they are asked for (read with
    `field_choices`); `cpu` / `gpu`: the key's effect on that device (`ON`: what `help` says; `off(reason)`: none)."""
    meta = {"help": help, "choices": choices, "effect": {"cpu": cpu, "gpu": gpu}}
    if default_factory is not None:
        return field(default_factory=default_factory, metadata=meta)
    return field(default=default, metadata=meta)


def key_effect(key: str, device: str) -> Effect:
    """The effect of config key `key` on `device` ("cpu" or "gpu")."""
    return FIELDS[key].metadata["effect"][device]


@dataclass
class ModelArguments:
    actor_model_name_or_path: str = arg("", "Policy (actor) model and tokenizer: a local directory, or a hub ID "
                                            "(Qwen/Qwen2.5-1.5B-Instruct) found in PaddleNLP's cache under "
                                            "PPNLP_HOME or downloaded when online (docs/models.md); the "
                                            "reference model is a frozen copy of it.")
    build_actor_if_missing: str = arg("", "(new) When actor_model_name_or_path does not exist yet, build it with this "
                                          "recipe first (quickstart: the embedded default's tiny policy, made "
                                          "locally in a few minutes; quickstart_tools: the tool quickstart's). "
                                          "Empty: the directory must exist.",
                                      choices=("", "quickstart", "quickstart_tools"))
    reward_model_name_or_path: str = arg("", "Directory (or hub ID) of a sequence-scoring reward model (one label, e.g. "
                                             "Qwen2ForSequenceClassification) scoring prompt + completion in-process "
                                             "(use_rm_server: false), after reward_funcs; its weight is the last "
                                             "of reward_weights. A reward server hosts one with "
                                             "`python -m reward_server --reward-model DIR`.")
    use_rm_server: bool = arg(True, "Score completions through the reward server at `reward_server`; false scores "
                                    "them in-process with `reward_funcs`.")
    reward_server: str = arg("http://127.0.0.1:8731", "Reward server URL; several comma-separated URLs spread the "
                                                      "requests across servers.")
    reward_funcs: str = arg("", "(new) Comma-separated reward functions for in-process scoring "
                                "(`use_rm_server: false`): built-in names (kk, gsm8k, tag_format, rouge_l, ...), "
                                "`module:function` or `path/file.py:function`.")
    reward_weights: Optional[List[float]] = arg(None, "(new) One weight per reward function (default 1.0 each); "
                                                      "the total is the weighted sum.")
    reward_server_token: str = arg("", "(new) Bearer token sent to the reward server (empty: none).")
    reward_server_timeout: float = arg(60.0, "(new) Read timeout in seconds for one reward-server request.")
    reward_server_max_retries: int = arg(-1, "(new) At most this many retries of a failed reward-server request "
                                             "(connection error, timeout, 5xx, 408, 429), with capped exponential "
                                             "backoff; -1: no limit on the count, reward_server_max_wait_s ends "
                                             "them. Whichever ends first stops the run (a checkpoint is saved).")
    reward_server_max_wait_s: float = arg(600.0, "(new) How long the trainer keeps retrying a batch the reward "
                                                 "server(s) fail, in seconds from its first failure: a server that "
                                                 "restarts within it costs time, not the run; every wait is logged. "
                                                 "0: no retries.")
    reward_timeout_s: float = arg(300.0, "(new) Time limit in seconds per call of an in-process reward function "
                                         "(use_rm_server: false; also a reward_model_name_or_path model's call on a "
                                         "batch): a sample whose call runs over it gets reward None with the "
                                         "reason, as when the function fails (train/reward_none_frac). 0: no "
                                         "limit. Raise it for a large reward model on a slow device.")
    use_rule_reward: bool = arg(False, "PaddleNLP's built-in rule reward (GSM8K) of its PPO configs: true scores "
                                       "completions in-process with the gsm8k reward function "
                                       "(paddle_grpo/rewards/gsm8k.py), as `reward_funcs: gsm8k` does (the start-up "
                                       "log says so). It needs use_rm_server: false (PaddleNLP's own note) and "
                                       "reward_funcs empty or gsm8k.")


@dataclass
class LoRAArguments:
    lora: bool = arg(False, "Train LoRA adapters (paddlenlp.peft) instead of all weights. The reference model is "
                            "the base model with the adapters disabled (no second copy of the weights); checkpoints "
                            "hold the adapters only (tools/merge_lora.py makes a full model of them).")
    lora_path: str = arg("", "Adapters to start from (a LoRA checkpoint, or PaddleNLP LoRA output); their saved rank, "
                             "alpha and target modules are used, as in PaddleNLP. Empty: new adapters (B = 0, so "
                             "training starts from the base model).")
    lora_rank: int = arg(8, "LoRA rank r.")
    lora_alpha: float = arg(16.0, "LoRA alpha: the adapter update B A is scaled by lora_alpha / lora_rank; -1: "
                                  "2 x lora_rank (PaddleNLP's default).")
    lora_dropout: float = arg(0.0, "(new) Dropout on the adapters' input during the update (0 keeps the "
                                   "importance ratio of the update exact).")
    target_modules: List[str] = arg(None, "(new) Regexes, matched in full against layer names such as "
                                          "qwen2.layers.0.self_attn.q_proj, of the linear layers that get adapters. "
                                          "Empty: every attention and MLP projection (q/k/v/o, gate/up/down).",
                                    default_factory=list)


@dataclass
class DataArguments:
    train_datasets: str = arg("", "Training data: JSONL (or parquet) file(s) with `src`/`tgt` fields; "
                                  "comma-separated for several.")
    eval_datasets: str = arg("", "Evaluation data, same format as `train_datasets`.")
    prompt_key: str = arg("src", "Field holding the prompt.")
    response_key: str = arg("tgt", "Field holding the reference answer passed to reward functions as `tgt`.")
    chat_template: str = arg("auto", "(new) How raw prompts become model input. Prompts already containing "
                                     "`<|im_start|>` pass through unchanged in every mode (PaddleNLP's data is "
                                     "templated). auto: the tokenizer's own chat template when it has one, else "
                                     "Qwen's format; qwen: always Qwen's format; none: the prompt as is.",
                             choices=("auto", "none", "qwen"))
    dataloader_drop_last: bool = arg(True, "Drop the last incomplete batch of prompts of an epoch.")
    dataloader_shuffle: bool = arg(False, "Shuffle prompts each epoch (seeded by `seed` and the epoch).")
    balance_batch: bool = arg(False, "Balance token counts across data-parallel ranks: after the rollout, the rows "
                                     "of every global mini-batch are reassigned to the ranks so that each rank's "
                                     "share has about the same prompt + completion tokens (equal row counts; "
                                     "sums within the longest row of each other) for the log-prob passes and the "
                                     "update. Mini-batches keep their rows and gradients are summed over the ranks, "
                                     "so the update is unchanged up to float rounding; one more all-gather of the "
                                     "batch's tokens per step. One data-parallel rank: nothing to balance.")
    use_remove_padding: bool = arg(False, "Compute no padding that a micro-batch does not need: the log-prob "
                                          "passes and the update sort each mini-batch's rows by length into "
                                          "micro-batches of similar lengths (per_device_*_batch_size rows) and "
                                          "trim each to its own longest prompt and completion; results equal the "
                                          "padded path within float rounding (docs/architecture.md, "
                                          "Micro-batches). Rows are not packed into one sequence: inside a "
                                          "micro-batch shorter rows are still padded to its longest. The update "
                                          "under pipeline_parallel_degree > 1 keeps fleet's micro-batches.")
    max_tokens_per_micro_batch: int = arg(0, "(new) Token budget of one micro-batch of the log-prob passes and "
                                             "the update (verl's ppo_max_token_len_per_gpu): rows x (longest "
                                             "prompt + longest completion of the micro-batch) <= this, rows sorted "
                                             "and trimmed as with use_remove_padding; a longer row forms a "
                                             "micro-batch alone. 0: micro-batches of per_device_*_batch_size rows. "
                                             "The update under pipeline_parallel_degree > 1 keeps fleet's "
                                             "micro-batches.")


@dataclass
class ParallelArguments:
    tensor_parallel_degree: int = arg(1, "Tensor (model) parallel degree.")
    sequence_parallel: bool = arg(False, "Sequence parallelism inside tensor-parallel groups.",
                                  **_amp_effect("sequence_parallel"))
    sharding_parallel_degree: int = arg(-1, "Sharding degree (-1: all data-parallel ranks).")
    sharding: str = arg("", "Sharding stage: stage1 shards the optimizer states over the sharding ranks; stage2 "
                            "runs as stage1 here (empty: none).", choices=("", "stage1", "stage2"))
    sharding_parallel_config: str = arg("", "Extra sharding options, space- or comma-separated (PaddleNLP's names; "
                                            "docs/distributed.md says what each does here).")
    pipeline_parallel_degree: int = arg(1, "Pipeline parallel degree.")
    virtual_pp_degree: int = arg(1, "Virtual pipeline stages per pipeline rank.")
    rollout_tensor_parallel_degree: int = arg(-1, "Tensor-parallel degree used for generation (-1: same as "
                                                  "training).",
                                              **nowhere("generation runs on the training model with its "
                                                        "tensor_parallel_degree; there is no separate rollout "
                                                        "engine to reshard"))


@dataclass
class RolloutArguments:
    max_prompt_len: int = arg(512, "Prompts longer than this are truncated from the left (the end is kept).")
    max_dec_len: int = arg(4096, "Maximum number of generated tokens per completion.")
    min_dec_len: int = arg(32, "Minimum number of generated tokens before EOS is allowed.")
    top_p: float = arg(1.0, "Nucleus sampling threshold, in (0, 1].")
    top_k: int = arg(0, "(new) Sample only among the top_k most likely tokens (ties at the k-th kept; 0: off), "
                        "applied before top_p as in PaddleNLP's generation; both restrict to a few candidates "
                        "instead of sorting the vocabulary.")
    temperature: float = arg(0.7, "Sampling temperature (> 0); log-probs are computed at the same temperature.")
    repetition_penalty: float = arg(1.0, "Repetition penalty (1.0: none).")
    rollout_max_num_seqs: int = arg(32, "Most sequences one generation call handles; larger rollouts are chunked.")
    rollout_quant_type: str = arg("", "Weight quantisation of the rollout model (e.g. weight_only_int8).",
                                  cpu=off("quantised inference kernels are GPU-only in PaddleNLP"),
                                  gpu=off("not implemented: generation runs on the training model's weights, "
                                          "there is no separate (quantised) rollout model"))


@dataclass
class TrainingArguments:
    do_train: bool = arg(True, "Run training.", **nowhere("run_rl.py always trains; PaddleNLP's run_rl.py "
                                                          "with do_train: false only evaluates, which is not "
                                                          "implemented here (evaluation runs every eval_steps "
                                                          "of training)"))
    seed: int = arg(42, "Random seed (data order, sampling, initialisation).")
    global_batch_size: int = arg(8, "Prompts sampled per step (over all data-parallel ranks).")
    global_gen_batch_size: int = arg(-1, "Prompts per generation round with dynamic sampling "
                                         "(-1: global_batch_size).")
    global_mini_batch_size: int = arg(-1, "Prompts per optimizer step (-1: global_batch_size).")
    rollout_n: int = arg(8, "Completions sampled per prompt (the group size G).")
    update_iters: int = arg(1, "Passes of mini-batch updates over each rollout.")
    per_device_logprob_batch_size: int = arg(8, "Sequences per forward pass when computing log-probs.")
    per_device_reward_batch_size: int = arg(8, "Sequences per reward-model forward pass (reward_model_name_or_path "
                                               "in-process; reward functions score whole batches).")
    per_device_value_batch_size: int = arg(8, "Sequences per forward pass of the critic when it computes the values "
                                              "of a rollout (ppo, vapo), as per_device_logprob_batch_size for the "
                                              "log-probs: any number of rows, the last pass takes the remainder. "
                                              "The critic's update uses the policy's micro-batches "
                                              "(per_device_train_batch_size).")
    per_device_train_batch_size: int = arg(8, "Sequences per micro-batch of the policy update.")
    num_train_epochs: float = arg(6.0, "Epochs over the training prompts; max_steps > 0 overrides it (as in "
                                       "PaddleNLP, where -1 with max_steps is common).")
    max_steps: int = arg(-1, "Total training steps (-1: from num_train_epochs).")
    max_length: int = arg(4608, "Longest prompt + completion; at least max_prompt_len + max_dec_len.",
                          **nowhere("only checked: a sequence is at most max_prompt_len + max_dec_len tokens, "
                                    "which bound every buffer here"))
    learning_rate: float = arg(5e-7, "Peak learning rate of AdamW.")
    min_learning_rate: float = arg(0.0, "Floor of the policy's learning-rate decay: after warm-up the linear and "
                                        "cosine schedules go from learning_rate down to min_learning_rate, as "
                                        "PaddleNLP's LinearAnnealingWithWarmupDecay / CosineAnnealingWithWarmupDecay "
                                        "do; at most learning_rate. No effect with a constant schedule.")
    lr_scheduler_type: str = arg("constant", "Learning-rate schedule after warm-up.", choices=LR_SCHEDULERS)
    warmup_steps: int = arg(0, "Linear warm-up steps (optimizer steps).")
    warmup_ratio: float = arg(0.0, "Warm-up as a fraction of all optimizer steps (used when warmup_steps is 0).")
    weight_decay: float = arg(0.01, "AdamW weight decay.")
    adam_beta1: float = arg(0.9, "AdamW beta1.")
    adam_beta2: float = arg(0.999, "AdamW beta2.")
    adam_epsilon: float = arg(1e-8, "AdamW epsilon.")
    max_grad_norm: float = arg(1.0, "Clip the global gradient norm to this value (0: no clipping).")
    save_steps: int = arg(500, "Save a checkpoint every this many steps.")
    save_strategy: str = arg("steps", "When to save: steps or no.", choices=("steps", "no"))
    save_total_limit: int = arg(-1, "Keep at most this many checkpoints (-1: all).")
    save_on_each_node: bool = arg(False, "With several nodes whose output_dir is not one shared file system: each "
                                          "node's local rank 0 writes every checkpoint to its own disk (data "
                                          "parallel only). On a shared file system checkpoints are written once "
                                          "whatever this says (docs/distributed.md).")
    ignore_save_lr_and_optim: bool = arg(False, "Save only model and tokenizer, not optimizer/scheduler/RNG state.")
    resume_from_checkpoint: Optional[Union[bool, str]] = arg(None, "Checkpoint directory to resume from, or true for "
                                                                   "the latest in output_dir.")
    disable_tqdm: bool = arg(False, "Disable the progress bar.")
    max_consecutive_nonfinite: int = arg(3, "(new) Stop the run after this many consecutive updates with a "
                                            "non-finite loss or gradient (each is skipped and counted).")


@dataclass
class AlgorithmArguments:
    rl_algorithm: str = arg("grpo", "Advantage estimator.",
                            choices=_from_algorithms("available_advantage_estimators"))
    norm_adv_by_std: bool = arg(True, "(new) GRPO: divide by the group std; false gives Dr.GRPO.")
    kl_coeff: float = arg(0.001, "KL penalty coefficient inside the reward (REINFORCE++ style). With "
                                 "rl_algorithm grpo (and the other GRPO-family estimators) it has no effect unless "
                                 "use_kl_in_reward, as in PaddleNLP, whose GRPO ignores it.")
    use_kl_in_reward: bool = arg(False, "(new) GRPO-family estimators only: also put kl_coeff's KL into the reward, "
                                        "per sequence (verl's use_kl_in_reward). PaddleNLP's GRPO ignores kl_coeff.")
    kl_estimator: str = arg("k1", "(new) KL estimator for the KL in the reward.",
                            choices=_from_algorithms("KL_ESTIMATORS"))
    kl_loss_coeff: float = arg(0.0, "KL loss coefficient (GRPO style); works for every estimator.")
    kl_loss_estimator: str = arg("k3", "(new) KL estimator for the KL loss.",
                                 choices=_from_algorithms("KL_ESTIMATORS"))
    pg_loss_coeff: float = arg(1.0, "Policy-gradient loss coefficient.")
    entropy_coeff: float = arg(0.0, "Entropy bonus coefficient.")
    clip_range_ratio: float = arg(0.2, "PPO clip range of the ratio.")
    clip_range_ratio_low: Optional[float] = arg(None, "Lower clip range (default: clip_range_ratio).")
    clip_range_ratio_high: Optional[float] = arg(None, "Upper clip range (default: clip_range_ratio; DAPO's "
                                                       "clip-higher uses a larger value).")
    clip_ratio_c: Optional[float] = arg(None, "(new) Dual-clip constant c > 1 for negative advantages (off when "
                                              "unset).")
    importance_sampling_level: str = arg("token", "(new) token: per-token ratio; sequence: GSPO's sequence ratio.",
                                         choices=_from_algorithms("importance_sampling_levels"))
    loss_agg_mode: str = arg("token-mean", "(new) How per-token losses are averaged.",
                             choices=_from_algorithms("LOSS_AGG_MODES"))
    clip_range_score: float = arg(10.0, "Rewards are clipped to [-c, c] (0: no clipping).")
    clip_range_value: float = arg(5.0, "Critic (ppo, vapo): the value loss's clip range, PaddleNLP's "
                                       "RLHFValueLoss: 0.5 * token-mean of max((V - R)^2, (V_old + clip(V - V_old, "
                                       "-c, c) - R)^2), V_old the critic's values at the rollout.")
    gamma: float = arg(1.0, "Discount factor of GAE (ppo, vapo), in [0, 1]; PaddleNLP hard-codes 1.0.")
    lam: float = arg(0.95, "GAE's lambda of ppo's advantages and returns, in [0, 1]; PaddleNLP hard-codes 0.95.")
    lam_critic: float = arg(1.0, "(new) vapo: GAE's lambda of the critic's returns (decoupled GAE, VAPO arXiv "
                                 "2504.05118), in [0, 1]. The advantages use the length-adaptive lambda of "
                                 "vapo_alpha.")
    vapo_alpha: float = arg(0.05, "(new) vapo: alpha of the length-adaptive GAE lambda of the advantages, "
                                  "lam_policy = max(0, 1 - 1 / (vapo_alpha * l)) per completion of l tokens (the "
                                  "paper's formula is negative below 1 / vapo_alpha tokens, hence the 0). > 0.")
    positive_example_lm_coeff: Optional[float] = arg(
        None, "(new) Coefficient of VAPO's positive-example LM loss: the NLL of the completions with their group's "
              "highest reward (in groups whose rewards are not all equal), added to the policy loss. Unset "
              "(null): the estimator's default, 0.1 for rl_algorithm vapo (the paper's recipe), else 0 (off). "
              "Needs rollout_n > 1: a group of one has no positive example.")
    normalize_reward: bool = arg(False, "Normalise rewards with running statistics. No effect with rl_algorithm "
                                        "grpo, as in PaddleNLP (which forces it off for GRPO).")
    normalize_advantage: bool = arg(False, "Whiten advantages over the global batch. No effect with rl_algorithm "
                                           "grpo, as in PaddleNLP (which forces it off for GRPO).")
    enable_overlong_reward_buffer: bool = arg(False, "DAPO overlong shaping of the reward.")
    overlong_reward_buffer: int = arg(256, "DAPO overlong buffer length L_b.")
    overlong_penalty_factor: float = arg(1.0, "DAPO overlong penalty factor.")
    dynamic_sampling: bool = arg(False, "DAPO dynamic sampling: drop groups with zero reward variance and sample "
                                        "more prompts.")
    max_gen_batches: int = arg(2, "Most generation rounds per step with dynamic sampling.")
    use_fp32_compute: bool = arg(True, "Compute log-probs, rewards, advantages and losses in float32.",
                                 **nowhere("log-probs, rewards, advantages and losses are always float32, "
                                           "whatever the model's dtype"))
    sync_ref_model: bool = arg(False, "(new) Periodically mix the policy into the reference model (TR-DPO).")
    ref_model_mixup_alpha: float = arg(0.9, "(new) ref <- alpha * policy + (1 - alpha) * ref.")
    ref_model_sync_steps: int = arg(64, "(new) Steps between reference-model syncs.")


@dataclass
class EvalArguments:
    do_eval: bool = arg(False, "Evaluate on eval_datasets every eval_steps.")
    per_device_eval_batch_size: int = arg(32, "Prompts per evaluation generation call.")
    evaluation_strategy: str = arg("steps", "When to evaluate: steps or no.", choices=("steps", "no"))
    eval_steps: int = arg(20, "Evaluate every this many steps.")
    eval_max_reward: Optional[float] = arg(None, "(new) The reward that counts as a correct answer in "
                                                "eval/accuracy; default: the maximum the reward functions "
                                                "declare (from the server's /health when use_rm_server).")
    eval_do_sample: bool = arg(False, "(new) Sample at evaluation (with temperature/top_p/top_k) instead of greedy.")


@dataclass
class LoggingArguments:
    output_dir: str = arg("output", "Checkpoints, metrics.jsonl, rollout samples, config.yaml and summary.json go "
                                    "here. When it already holds a run, the run resumes from its latest "
                                    "checkpoint (as in PaddleNLP); without a checkpoint it is refused unless "
                                    "overwrite_output_dir.")
    overwrite_output_dir: bool = arg(False, "Delete a previous run in output_dir (metrics, samples, checkpoints, "
                                            "its VisualDL record) and train from scratch instead of resuming it.")
    logging_dir: str = arg("vdl_log", "VisualDL log directory. One inside the file's output_dir follows an "
                                      "output_dir given on the command line (`--output_dir X` turns the file's "
                                      "`output/quickstart/vdl_log` into `X/vdl_log`), unless logging_dir is given "
                                      "there too. A run whose logging_dir already holds another run's VisualDL "
                                      "record (VisualDL shows one record per folder) writes its own into the "
                                      "subfolder `<output_dir name>-<hash>`, with a warning; a resumed run finds its "
                                      "record again. PaddleNLP's default is `<output_dir>/runs/<date>_<host>`, a new "
                                      "folder at every start; here a resume rebuilds one record per run.")
    logging_steps: int = arg(1, "Log sample completions every this many steps.")
    report_to: str = arg("visualdl", "visualdl, all, wandb or tensorboard (all three: VisualDL here, with a "
                                     "one-line warning for wandb/tensorboard) or none.", choices=REPORT_TO)
    wandb_http_proxy: str = arg("", "HTTP proxy for wandb.", **nowhere("wandb is not used; metrics go to VisualDL "
                                                                       "and metrics.jsonl"))
    run_name: str = arg("", "Experiment name, used as the VisualDL run name.")


@dataclass
class KernelArguments:
    use_flash_attention: bool = arg(False, "FlashAttention-2. Passed to the model config's field of the same name.",
                           **_amp_effect("use_flash_attention"))
    use_fused_rms_norm: bool = arg(False, "Fused RMSNorm kernel. Passed to the model config's field of the same name.",
                           **_amp_effect("use_fused_rms_norm"))
    use_fused_rope: bool = arg(False, "Fused rotary embedding kernel. Passed to the model config's field of the same name.",
                           **_amp_effect("use_fused_rope"))
    use_fused_head_and_loss_fn: Optional[bool] = arg(
        None, "Chunked LM head: the log-probs and entropies of the completion tokens are computed "
              "fused_head_chunk_size positions at a time from the final hidden states (forward and backward, "
              "policy/lm_head.py), so the [rows, T, vocab] logits are never held: peak extra memory O(chunk x "
              "vocab) instead of O(rows x T x vocab). Same numbers as the full logits up to float32 rounding. "
              "Here this is the project's own chunked head, on every device, for the policy and the reference; it "
              "is not passed to the model config (PaddleNLP's fused head + loss returns a loss, not per-token "
              "log-probs). Unset (null), it is chosen from the policy's vocabulary: on from "
              f"{HEAD_CHUNK_MIN_VOCAB:,} tokens (every real model's: Qwen's 151,936, Llama's 32,000), off below "
              "(the quickstart's 300), where the full logits are faster and small (measured: "
              "tools/bench_head.py); the start-up line `LM head: ...` says which and why. PaddleNLP's default is "
              "false; ours differs only when the key is unset, because full logits at a real vocabulary cost GBs "
              "and time for the same numbers. An explicit true or false (file or command line) always wins.",
        cpu=ON,
        gpu=on("the same paddle ops as on CPU; verified only on CPU (tests/policy/test_head_wiring.py)"))
    fused_head_chunk_size: int = arg(DEFAULT_HEAD_CHUNK_SIZE,
                                     "(new) Positions (rows x completion tokens) per chunk of the chunked LM head "
                                     "(use_fused_head_and_loss_fn); PaddleNLP's fused head calls it chunk_size "
                                     "(a model-config field, default 1024). Larger: fewer, bigger matmuls; memory "
                                     "grows as chunk x vocab.")
    use_fused_linear: bool = arg(False, "Fused linear kernel. Passed to the model config's field of the same name.",
                           **_amp_effect("use_fused_linear"))
    recompute: bool = arg(False, "Recompute the policy's decoder activations in the update's backward pass instead "
                                 "of keeping them: less memory, about one more forward pass of time. Trainable "
                                 "policy only (the reference and rollout passes record no gradients); "
                                 "encoder-decoder policies ignore it with a warning.", gpu=_RECOMPUTE_GPU)
    recompute_use_reentrant: bool = arg(True, "With recompute: paddle's re-entrant implementation (a PyLayer) if "
                                              "true, else the saved-tensor-hooks one; same gradients.",
                                        gpu=_RECOMPUTE_GPU)
    recompute_granularity: str = arg("full", "With recompute: what is recomputed per decoder layer. full: the whole "
                                             "layer (least memory, slowest); full_attn: the attention sub-block "
                                             "with its q/k/v projections; core_attn: only softmax(QK^T) V (fastest, "
                                             "most memory of the three).",
                                     choices=("full", "full_attn", "core_attn"), gpu=_RECOMPUTE_GPU)
    bf16: bool = arg(False, "bfloat16 mixed precision.", **_amp_effect("bf16"))
    fp16: bool = arg(False, "float16 mixed precision.", **_amp_effect("fp16"))
    fp16_opt_level: str = arg("O1", "AMP level O1 or O2.", choices=("O1", "O2"),
                              **_amp_effect("fp16_opt_level"))
    amp_master_grad: bool = arg(False, "Keep float32 master gradients under AMP.",
                                **_amp_effect("amp_master_grad"))
    amp_custom_black_list: List[str] = arg(None, "Ops kept in float32 under AMP.", default_factory=list,
                                           **_amp_effect("amp_custom_black_list"))
    amp_custom_white_list: List[str] = arg(None, "Ops run in low precision under AMP.", default_factory=list,
                                           **_amp_effect("amp_custom_white_list"))
    offload_level: str = arg("", "Offload frozen models/optimizer states to host memory.",
                             cpu=off(HOST_MEMORY), gpu=off("not implemented: models and optimizer states stay on the "
                                                       "GPU"))
    release_grads: bool = arg(False, "Free gradient memory after each optimizer step.",
                              **nowhere("gradients are always released (set to None, not zeroed) after "
                                        "every optimizer step"))
    offload_optim: bool = arg(False, "Offload optimizer states to host memory.",
                              cpu=off(HOST_MEMORY), gpu=off("not implemented: models and optimizer states stay on the "
                                                       "GPU"))
    skip_profile_timer: bool = arg(False, "Skip PaddleNLP's profiling timers.",
                                   **nowhere("phase timings are always measured and logged as perf/* metrics; "
                                             "they cost microseconds"))


@dataclass
class CriticArguments:
    """PaddleNLP's PPO / VAPO keys: the critic (value model) of the estimators that need values (rl_algorithm ppo,
    vapo). With another rl_algorithm they have no effect, and each key set says so in one line."""
    critic_model_name_or_path: str = arg("", "The critic (value model): a local directory or a hub ID, resolved as "
                                             "actor_model_name_or_path is. A critic checkpoint (a run's "
                                             "checkpoint-N/critic) or PaddleNLP score model loads with its head, a "
                                             "reward model directory with its score head as the value head, a "
                                             "causal LM with a new value head initialised to zeros (policy/"
                                             "critic.py; the start-up log and --dry_run say which). "
                                             "It must share the policy's vocabulary (it reads the policy's token "
                                             "ids). Required by rl_algorithm ppo and vapo.")
    critic_learning_rate: float = arg(5e-7, "Peak learning rate of the critic's AdamW.")
    critic_min_learning_rate: float = arg(0.0, "Floor of the critic's learning-rate decay (linear, cosine), as "
                                               "min_learning_rate for the policy; at most critic_learning_rate.")
    critic_lr_scheduler_type: str = arg("constant", "The critic's learning-rate schedule after warm-up.",
                                        choices=LR_SCHEDULERS)
    critic_weight_decay: float = arg(0.01, "The critic's AdamW weight decay.")
    critic_warmup_ratio: float = arg(0.0, "The critic's linear warm-up, as a fraction of its optimizer steps.")
    pretrain_critic_steps: int = arg(0, "VAPO's value pretraining: for the first this many steps only the critic "
                                        "is updated (the policy keeps its weights).")


@dataclass
class ToolArguments:
    """Multi-turn rollouts with tools (docs/tools.md). With `tools` empty (the default) a rollout is one completion
    per prompt and the other keys of this group have no effect (each one set says so in one line)."""
    tools: List[str] = arg(None, "(new) Tools the policy may call: registered names (calculator, python), "
                                 "`module:function` or `path/file.py:function`, as a list or a comma-separated "
                                 "string. Set: rollouts are multi-turn (decoding stops at the end of a tool call, "
                                 "the calls run, their results are appended as a tool turn, decoding goes on); "
                                 "tool-output tokens are context, not actions (no gradient, KL, entropy, value "
                                 "loss or length). Empty: single-turn rollouts.", default_factory=list)
    max_turns: int = arg(4, "(new) Most assistant turns per sample (each but the last may end in tool calls); "
                            "max_dec_len bounds all of a sample's completion tokens, actions and tool output.")
    tool_timeout_s: float = arg(10.0, "(new) Time limit in seconds per tool call; a call over it becomes a tool "
                                      "message saying so (error 'timeout'), the rollout goes on.")
    tool_max_workers: int = arg(8, "(new) Tool calls running at once (one pool for all sequences of a rollout).")
    tool_format: str = arg("auto", "(new) The tool-call format: auto (the tokenizer's chat template renders the "
                                   "tools when it can, Hermes / Qwen2.5 `<tool_call>` JSON otherwise) or a format's "
                                   "name (docs/tools.md, \"The format\").")
    max_tool_response_len: int = arg(256, "(new) A tool's output is cut to this many tokens (with a marker saying "
                                          "so) before it is appended to the conversation.")
    tool_server: str = arg("", "(new) URL of a server that runs the tools (`python -m reward_server --tool ...`): "
                               "the calls go there over HTTP (transport failures are retried, then raise; 4xx "
                               "answers raise). Empty: the tools run in the trainer's process.")
    tool_server_token: str = arg("", "(new) Bearer token sent to tool_server (empty: none).")


def yaml_value(value: Any) -> str:
    """`value` as it would be written after `key: ` in a YAML file (one line)."""
    text = yaml.safe_dump(value, default_flow_style=True, width=10**6)
    return text.removesuffix("\n").removesuffix("...").strip()


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
        from .algorithms import reward_kl_coeff  # paddle: see _from_algorithms
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
        from .algorithms import advantage_estimator_spec  # paddle: see _from_algorithms
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
        from .algorithms import advantage_estimator_spec  # paddle: see _from_algorithms
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
                f"({cfg.rollout_n}) = {seqs_per_mini}")
        per_rank = cfg.global_batch_size // dp
        return cls(data_parallel_degree=dp, prompts_per_rank=per_rank, sequences_per_rank=per_rank * cfg.rollout_n,
                   mini_batches_per_rollout=cfg.global_batch_size // mini, sequences_per_mini_batch=seqs_per_mini,
                   grad_accum_steps=seqs_per_mini // cfg.per_device_train_batch_size,
                   optimizer_steps_per_step=cfg.global_batch_size // mini * cfg.update_iters)


def _divides(divisor, divisor_name, value, key, how):
    if value % divisor:
        extra = f" ({how})" if how else ""
        raise ConfigError(f"{key} ({value}) must be divisible by the {divisor_name} {divisor}{extra}")


# ----------------------------------------------------------------------------------------------------- loading

class _Source:
    """Where a value came from, for error messages: 'file.yaml:12' or 'command line'."""

    def __init__(self, path=None, lines=None):
        self.path, self.lines = path, lines or {}

    def where(self, key):
        if self.path is None:
            return "command line"
        line = self.lines.get(key)
        return f"{self.path}:{line}" if line else str(self.path)


def _read_file(path):
    """Flat mapping from a YAML or JSON file, with the line number of each key."""
    if not os.path.isfile(path):
        raise ConfigError(f"config file not found: {path}")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    try:
        node = yaml.compose(text)  # JSON is YAML, and the node tree keeps line numbers
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML/JSON: {e}") from None
    if node is None:
        return {}, {}
    if not isinstance(node, yaml.MappingNode):
        raise ConfigError(f"{path}: the top level must be a mapping of key: value, got a {node.tag.rsplit(':', 1)[-1]}")
    values = yaml.safe_load(text)
    lines = {}
    for key_node, _ in node.value:
        if key_node.value in lines:
            raise ConfigError(f"{path}:{key_node.start_mark.line + 1}: key '{key_node.value}' appears twice "
                              f"(first on line {lines[key_node.value]})")
        lines[key_node.value] = key_node.start_mark.line + 1
    return values, lines


def _parse_overrides(argv):
    """`--key value` / `--key=value` pairs; values stay strings and are converted by field type."""
    out, i = {}, 0
    while i < len(argv):
        tok = argv[i]
        if not tok.startswith("--") or tok == "--":
            raise ConfigError(f"command line: expected --key value, got '{tok}'")
        if "=" in tok:
            key, val = tok[2:].split("=", 1)
            i += 1
        else:
            key = tok[2:]
            if i + 1 >= len(argv) or (argv[i + 1].startswith("--") and len(argv[i + 1]) > 2):
                raise ConfigError(f"command line: --{key} needs a value")
            val = argv[i + 1]
            i += 2
        out[key] = val
    return out


_BOOL_STRINGS = {"true": True, "false": False, "1": True, "0": False, "yes": True, "no": False, "on": True,
                 "off": False}


def _convert(value, tp, key, where):
    """Value of YAML/JSON/command-line origin converted to the field type `tp`, or ConfigError."""
    origin, targs = typing.get_origin(tp), typing.get_args(tp)

    def bad(expected):
        return ConfigError(f"{where}: key '{key}' expects {expected}, got {value!r} ({type(value).__name__})")

    if origin is Union:
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null")):
            if type(None) in targs:
                return None
        members = [a for a in targs if a is not type(None)]
        if len(members) == 1:  # Optional[X]: X's own, more specific message
            return _convert(value, members[0], key, where)
        for t in members:
            try:
                return _convert(value, t, key, where)
            except ConfigError:
                pass
        raise bad(" or ".join(_type_name(a) for a in members))
    if origin in (list, List):
        if isinstance(value, str):  # command line or a YAML scalar: comma-separated
            value = [v.strip() for v in value.strip("[]").split(",") if v.strip()]
        if not isinstance(value, (list, tuple)):
            raise bad("a list")
        return [_convert(v, targs[0], f"{key}[{i}]", where) for i, v in enumerate(value)]
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, int) and value in (0, 1):  # PaddleNLP scripts write `--recompute 1`
            return bool(value)
        if isinstance(value, str) and value.strip().lower() in _BOOL_STRINGS:
            return _BOOL_STRINGS[value.strip().lower()]
        raise bad("true or false")
    if tp is int:
        if isinstance(value, bool):
            raise bad("an integer")
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                return int(value.strip())
            except ValueError:
                try:
                    f = float(value)
                except ValueError:
                    raise bad("an integer") from None
                if f.is_integer():
                    return int(f)
        raise bad("an integer")
    if tp is float:
        if isinstance(value, bool):
            raise bad("a number")
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):
            # PyYAML reads `5e-7` (no dot) as a string; PaddleNLP's own configs are written that way.
            try:
                return float(value.strip())
            except ValueError:
                pass
        raise bad("a number")
    if tp is str:
        if isinstance(value, (dict, list)):
            raise bad("a string")
        return "" if value is None else str(value)
    raise TypeError(f"unsupported field type {tp} for {key}")


def _type_name(tp):
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string"}.get(tp, "a list")


def _field_type(f):
    hints = typing.get_type_hints(Config)
    return hints[f.name]


def _apply(values, source, cfg_values, given):
    for raw_key, value in values.items():
        key = ALIASES.get(raw_key, raw_key)
        if key not in FIELDS:
            close = difflib.get_close_matches(raw_key, list(FIELDS) + list(ALIASES), n=1, cutoff=0.6)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise ConfigError(f"{source.where(raw_key)}: unknown key '{raw_key}'{hint}")
        f = FIELDS[key]
        cfg_values[key] = _convert(value, _field_type(f), raw_key, source.where(raw_key))
        given[key] = source.where(raw_key)


def load_config(path: Union[str, os.PathLike, None] = None, overrides: Sequence[str] = (), *,
                device: Optional[str] = None, warn: bool = True) -> Config:
    """Load `path` (YAML or JSON, flat keys), apply `--key value` `overrides`, validate, and return a `Config`.

    `device` ("cpu"/"gpu"; default: what paddle is compiled for, or "cpu" when paddle is absent) decides which
    GPU-only keys are reported as having no effect. Raises `ConfigError` on any problem.
    """
    values, given = {}, {}
    if path is not None:
        file_values, lines = _read_file(path)
        _apply(file_values, _Source(path, lines), values, given)
    dirs_before = {k: values.get(k, FIELDS[k].default) for k in ("output_dir", "logging_dir")}
    command_line = {ALIASES.get(k, k) for k in _parse_overrides(list(overrides))}
    _apply(_parse_overrides(list(overrides)), _Source(), values, given)
    _follow_output_dir(values, dirs_before, command_line)
    cfg = Config(**values)
    resolve_rule_reward(cfg, given)
    validate(cfg, given)
    cfg._given = dict(given)  # given_keys
    if warn:
        for message in inert_key_messages(cfg, given, device or default_device()):
            logger.warning(message)
    return cfg


def _inside(path: str, directory: str) -> bool:
    path, directory = os.path.abspath(path), os.path.abspath(directory)
    return path == directory or path.startswith(directory.rstrip(os.sep) + os.sep)


def _follow_output_dir(values: Dict[str, Any], before: Dict[str, str], command_line: set) -> None:
    """A logging_dir inside the file's output_dir follows an output_dir given on the command line (the file's
    `output/quickstart/vdl_log` becomes `X/vdl_log` with `--output_dir X`), so that a second run's VisualDL record
    does not land in the first run's folder; a logging_dir given on the command line, or one outside the file's
    output_dir (a folder shared by runs on purpose), stays as it is."""
    if "output_dir" not in command_line or "logging_dir" in command_line or not before["logging_dir"]:
        return
    if not _inside(before["logging_dir"], before["output_dir"]):
        return
    rel = os.path.relpath(os.path.abspath(before["logging_dir"]), os.path.abspath(before["output_dir"]))
    moved = os.path.normpath(os.path.join(values["output_dir"], rel))
    if moved != os.path.normpath(before["logging_dir"]):
        values["logging_dir"] = moved
        logger.info("logging_dir follows --output_dir: %s (the file's %s lies inside its output_dir %s; give "
                    "--logging_dir to choose another)", moved, before["logging_dir"], before["output_dir"])


def default_device() -> str:
    """"gpu" when paddle is compiled with CUDA and sees a GPU, else "cpu" (also when paddle is absent)."""
    try:
        import paddle
        return "gpu" if paddle.device.is_compiled_with_cuda() and paddle.device.cuda.device_count() > 0 else "cpu"
    except ImportError:
        return "cpu"


# PaddleNLP's `sharding_parallel_config` options -> what they do here (None: what this trainer always does).
SHARDING_OPTIONS = {
    "enable_release_grads": None,  # gradients are released (not zeroed) after every optimizer step anyway
    "enable_stage1_tensor_fusion": "a GPU communication optimisation; gradients are reduced parameter by parameter",
    "enable_stage1_overlap": "a GPU communication optimisation; the reduction runs after the backward pass",
    "enable_stage1_broadcast_overlap": "a GPU communication optimisation; parameters are broadcast after the step",
    "enable_stage1_allgather_overlap": "applies to split_param (sharding V2), which is not supported",
    "enable_stage2_overlap": "applies to sharding stage2, which is not supported",
    "disable_stage1_reduce_avg": "gradients are summed with the trainer's own scaling (docs/distributed.md)",
    "enable_fuse_optimizer_states": "fleet's stage1 optimizer does not support it",
    "split_param": None,  # rejected at start-up with more than one process (distributed.unsupported_layout)
}


def sharding_options(cfg: Config) -> List[str]:
    """The options in `sharding_parallel_config`, split as PaddleNLP splits them (by commas if any, else spaces)."""
    text = cfg.sharding_parallel_config
    return [x.strip() for x in (text.split(",") if "," in text else text.split(" ")) if x.strip()]


def inert_key_messages(cfg: Config, given: Dict[str, str], device: str) -> List[str]:
    """One line per key set (file or command line) that does not do here what it says on `device`, and why.

    Keys with no effect are reported when set to a non-default value (they default to off, so setting one on is
    always reported); so are the values that run as something else (report_to wandb, sharding stage2) and kl_coeff
    under a GRPO-family estimator without use_kl_in_reward."""
    defaults = Config()
    out = []
    for key, where in given.items():
        effect = run_key_effect(cfg, key, device)
        if not effect.active and getattr(cfg, key) != getattr(defaults, key):
            out.append(f"{where}: key '{key}' has no effect here: {effect.note}")
    if cfg.report_to in VISUALDL_STANDS_IN:
        out.append(f"{given.get('report_to', 'report_to')}: report_to '{cfg.report_to}' is not available here; "
                   "metrics go to VisualDL (logging_dir) and metrics.jsonl instead")
    if cfg.sharding == "stage2":
        out.append(f"{given.get('sharding', 'sharding')}: sharding 'stage2' runs as stage1 (optimizer states "
                   "sharded): stage2 would also shard the gradients, saving (n-1)/n of their memory on each of n "
                   "sharding ranks, and is not implemented here")
    if "sharding_parallel_config" in given:
        for option in sharding_options(cfg):
            if SHARDING_OPTIONS.get(option):
                out.append(f"{given['sharding_parallel_config']}: key 'sharding_parallel_config': option "
                           f"'{option}' has no effect here: {SHARDING_OPTIONS[option]}")
    out.extend(reward_kl_notes(cfg, given))
    for key in ("normalize_reward", "normalize_advantage"):  # PaddleNLP forces both off for GRPO
        if key in given and getattr(cfg, key) and not cfg._normalization_keys_apply:
            out.append(f"{given[key]}: key '{key}' has no effect here: rl_algorithm {cfg.rl_algorithm!r} normalises "
                       "each group's rewards itself, and PaddleNLP sets normalize_reward and normalize_advantage to "
                       "false for GRPO whatever the config says (its TrainingArguments.__post_init__); so does "
                       "paddle_grpo, so that a PaddleNLP GRPO config trains the same")
    return out


# The critic's keys: they have an effect only when the estimator takes values (Config.needs_critic).
CRITIC_KEYS = ("critic_model_name_or_path", "critic_learning_rate", "critic_min_learning_rate",
               "critic_lr_scheduler_type", "critic_weight_decay", "critic_warmup_ratio", "pretrain_critic_steps",
               "per_device_value_batch_size", "clip_range_value")
CONSTANT_SCHEDULES = ("constant", "constant_with_warmup")
# The tool keys other than `tools`: an effect only with tools (multi-turn rollouts).
TOOL_KEYS = ("max_turns", "tool_timeout_s", "tool_max_workers", "tool_format", "max_tool_response_len",
             "tool_server", "tool_server_token")


def run_key_notes(cfg: Config) -> Dict[str, str]:
    """Key -> why it has no effect in this run, whatever the device: the critic's keys when the estimator trains no
    critic, an estimator option (gamma, lam, norm_adv_by_std, ...) the chosen estimator does not take, a decay floor
    under a schedule that does not decay, the positive-example LM loss with groups of one sample. Read from the
    estimator registry's specs, not from algorithm names."""
    from .algorithms import advantage_estimator_spec, available_advantage_estimators  # paddle: see _from_algorithms
    specs = [advantage_estimator_spec(name) for name in available_advantage_estimators()]
    algorithm, notes = repr(cfg.rl_algorithm), {}
    users: Dict[str, List[str]] = {}
    for spec in specs:
        for key in spec.config_keys:
            users.setdefault(key, []).append(spec.name)
    mine = cfg._estimator.config_keys
    for key, names in users.items():
        if key not in mine:
            notes[key] = f"rl_algorithm {algorithm} does not take it (an option of rl_algorithm {', '.join(names)})"
    if not cfg.needs_critic:
        with_critic = ", ".join(spec.name for spec in specs if spec.needs_values)
        for key in CRITIC_KEYS:
            notes[key] = (f"rl_algorithm {algorithm} trains no critic (value model): its advantages need no values "
                          f"(rl_algorithm {with_critic} train one)")
    elif cfg.critic_lr_scheduler_type in CONSTANT_SCHEDULES:
        notes["critic_min_learning_rate"] = (f"critic_lr_scheduler_type {cfg.critic_lr_scheduler_type!r} does not "
                                             "decay (linear and cosine decay to it)")
    if cfg.lr_scheduler_type in CONSTANT_SCHEDULES:
        notes["min_learning_rate"] = (f"lr_scheduler_type {cfg.lr_scheduler_type!r} does not decay (linear and "
                                      "cosine decay to it)")
    if not cfg.tools:
        for key in TOOL_KEYS:
            notes[key] = "tools is empty: rollouts are single-turn (one completion per prompt, no tool calls)"
    elif not cfg.tool_server.strip():
        notes["tool_server_token"] = "tool_server is empty: the tools run in the trainer's process"
    if cfg.rollout_n == 1:
        notes["positive_example_lm_coeff"] = ("rollout_n is 1: a group of one sample has no positive example (the "
                                              "loss takes the best-rewarded samples of groups whose rewards differ)")
    return notes


def run_key_effect(cfg: Config, key: str, device: str) -> Effect:
    """The effect of `key` in the run `cfg` configures on `device`: its device statement (key_effect) when that
    says no effect, else off with run_key_notes' reason when it has one, else the device statement."""
    effect = key_effect(key, device)
    if not effect.active:
        return effect
    note = run_key_notes(cfg).get(key)
    return off(note) if note else effect


def reward_kl_notes(cfg: Config, given: Dict[str, str]) -> List[str]:
    """One line for each of `kl_coeff` / `use_kl_in_reward` set (file or command line) where it has no effect on
    the reward: `kl_coeff` with a group estimator (grpo, rloo) without `use_kl_in_reward`, as in PaddleNLP's GRPO;
    `use_kl_in_reward` with an estimator that always takes the KL per token, or with `kl_coeff` 0."""
    from .algorithms import advantage_estimator_spec  # paddle: see _from_algorithms
    out = []
    per_token = advantage_estimator_spec(cfg.rl_algorithm).reward_kl_per_token
    if "kl_coeff" in given and cfg.kl_coeff != 0 and cfg.reward_kl_coeff == 0:
        out.append(f"{given['kl_coeff']}: key 'kl_coeff' has no effect here: rl_algorithm {cfg.rl_algorithm!r} "
                   "keeps the reference KL out of the reward, as PaddleNLP's GRPO does (its KL is kl_loss_coeff); "
                   "set use_kl_in_reward: true to subtract kl_coeff * KL from each sequence reward")
    if "use_kl_in_reward" in given and cfg.use_kl_in_reward and (per_token or cfg.kl_coeff == 0):
        why = (f"rl_algorithm {cfg.rl_algorithm!r} always puts kl_coeff * KL in the reward, per token" if per_token
               else "kl_coeff is 0")
        out.append(f"{given['use_kl_in_reward']}: key 'use_kl_in_reward' has no effect here: {why}")
    return out


# ------------------------------------------------------------------------------------------------- validation

def validate(cfg: Config, given: Optional[Dict[str, str]] = None) -> Config:
    """Check ranges, choices and combinations; raise ConfigError naming the key, its value and where it was set."""
    given = given or {}

    def fail(key, msg):
        where = given.get(key)
        prefix = f"{where}: " if where else ""
        raise ConfigError(f"{prefix}key '{key}' = {getattr(cfg, key)!r}: {msg}")

    # First: a config for an algorithm this trainer does not have says so before anything else.
    algorithms = field_choices(FIELDS["rl_algorithm"])
    if cfg.rl_algorithm not in algorithms:
        fail("rl_algorithm", f"is not supported: the supported algorithms are {', '.join(algorithms)}")

    for key, f in FIELDS.items():
        choices = field_choices(f)
        if choices is not None and getattr(cfg, key) not in choices:
            fail(key, f"must be one of {', '.join(repr(c) for c in choices)}")
        value = getattr(cfg, key)
        if isinstance(value, float) and not math.isfinite(value):
            fail(key, "must be a finite number")

    positive = ("global_batch_size", "rollout_n", "update_iters", "per_device_logprob_batch_size",
                "per_device_train_batch_size", "per_device_eval_batch_size", "max_prompt_len", "max_dec_len",
                "rollout_max_num_seqs", "logging_steps", "tensor_parallel_degree", "pipeline_parallel_degree",
                "virtual_pp_degree", "max_gen_batches", "max_consecutive_nonfinite", "ref_model_sync_steps",
                "overlong_reward_buffer", "max_length", "lora_rank", "fused_head_chunk_size",
                "per_device_value_batch_size", "max_turns", "tool_max_workers", "max_tool_response_len")
    for key in positive:
        if getattr(cfg, key) < 1:
            fail(key, "must be at least 1")
    non_negative = ("learning_rate", "weight_decay", "max_grad_norm", "clip_range_ratio", "clip_range_score",
                    "kl_coeff", "kl_loss_coeff", "pg_loss_coeff", "entropy_coeff", "min_dec_len", "warmup_steps",
                    "overlong_penalty_factor", "adam_epsilon", "reward_server_timeout",
                    "reward_server_max_wait_s", "reward_timeout_s", "seed", "max_tokens_per_micro_batch",
                    "min_learning_rate", "critic_learning_rate", "critic_min_learning_rate", "critic_weight_decay",
                    "pretrain_critic_steps", "clip_range_value", "positive_example_lm_coeff")
    for key in non_negative:
        if getattr(cfg, key) is not None and getattr(cfg, key) < 0:
            fail(key, "must not be negative")
    if cfg.reward_server_max_retries < -1:
        fail("reward_server_max_retries", "must be -1 (no limit: reward_server_max_wait_s ends the retries) or >= 0")
    for key in ("clip_range_ratio_low", "clip_range_ratio_high"):
        if getattr(cfg, key) is not None and getattr(cfg, key) < 0:
            fail(key, "must not be negative")
    if cfg.eps_low >= 1:
        fail("clip_range_ratio_low" if cfg.clip_range_ratio_low is not None else "clip_range_ratio",
             "the lower clip range must be below 1 (the ratio is clipped to [1 - low, 1 + high])")
    if cfg.clip_ratio_c is not None and cfg.clip_ratio_c <= 1:
        fail("clip_ratio_c", "the dual-clip constant must be greater than 1 (leave it unset to disable dual-clip)")
    if not 0 < cfg.top_p <= 1:
        fail("top_p", "must be in (0, 1]")
    if cfg.top_k < 0:
        fail("top_k", "must not be negative (0 turns top-k sampling off)")
    if cfg.temperature <= 0:
        fail("temperature", "must be greater than 0")
    if cfg.repetition_penalty <= 0:
        fail("repetition_penalty", "must be greater than 0")
    for key in ("adam_beta1", "adam_beta2"):
        if not 0 <= getattr(cfg, key) < 1:
            fail(key, "must be in [0, 1)")
    for key in ("warmup_ratio", "critic_warmup_ratio"):
        if not 0 <= getattr(cfg, key) < 1:
            fail(key, "must be in [0, 1)")
    for key in ("gamma", "lam", "lam_critic"):
        if not 0 <= getattr(cfg, key) <= 1:
            fail(key, "must be in [0, 1]")
    if cfg.vapo_alpha <= 0:
        fail("vapo_alpha", "must be greater than 0 (lam_policy = 1 - 1 / (vapo_alpha * length))")
    for floor, peak, schedule in (("min_learning_rate", "learning_rate", "lr_scheduler_type"),
                                  ("critic_min_learning_rate", "critic_learning_rate", "critic_lr_scheduler_type")):
        if getattr(cfg, schedule) not in CONSTANT_SCHEDULES and getattr(cfg, floor) > getattr(cfg, peak):
            fail(floor, f"must not exceed {peak} ({getattr(cfg, peak)}): the {getattr(cfg, schedule)} schedule "
                        f"({schedule}) decays from {peak} down to it")
    if not 0 <= cfg.ref_model_mixup_alpha <= 1:
        fail("ref_model_mixup_alpha", "must be in [0, 1]")
    for key in ("global_mini_batch_size", "global_gen_batch_size", "sharding_parallel_degree",
                "rollout_tensor_parallel_degree", "save_total_limit"):
        if getattr(cfg, key) != -1 and getattr(cfg, key) < 1:
            fail(key, "must be -1 (automatic) or at least 1")
    if cfg.max_steps == 0 or cfg.max_steps < -1:
        fail("max_steps", "must be -1 (from num_train_epochs) or at least 1")
    if cfg.num_train_epochs < 0 and cfg.max_steps < 1:  # PaddleNLP: max_steps > 0 overrides num_train_epochs
        fail("num_train_epochs", "must not be negative unless max_steps (which then sets the length) is at least 1")
    unknown = [x for x in sharding_options(cfg) if x not in SHARDING_OPTIONS]
    if unknown:
        fail("sharding_parallel_config", f"unknown option {unknown[0]!r}; the options are "
                                         f"{', '.join(sorted(SHARDING_OPTIONS))}")

    # Combinations.
    if cfg.min_dec_len > cfg.max_dec_len:
        fail("min_dec_len", f"must not exceed max_dec_len ({cfg.max_dec_len})")
    if cfg.max_length < cfg.max_prompt_len + cfg.max_dec_len:
        fail("max_length", f"must be at least max_prompt_len + max_dec_len = {cfg.max_prompt_len} + "
                           f"{cfg.max_dec_len} = {cfg.max_prompt_len + cfg.max_dec_len}")
    if cfg.global_batch_size % cfg.mini_batch_prompts:
        fail("global_mini_batch_size", f"must divide global_batch_size ({cfg.global_batch_size}): each rollout is "
                                       "split into whole mini-batches")
    if cfg.global_gen_batch_size != -1 and cfg.global_gen_batch_size < cfg.global_batch_size and \
            not cfg.dynamic_sampling:
        fail("global_gen_batch_size", f"is smaller than global_batch_size ({cfg.global_batch_size}); it only "
                                      "differs from it with dynamic_sampling")
    if cfg.enable_overlong_reward_buffer and cfg.overlong_reward_buffer > cfg.max_dec_len:
        fail("overlong_reward_buffer", f"must not exceed max_dec_len ({cfg.max_dec_len})")
    from .algorithms import advantage_estimator_spec  # paddle: see _from_algorithms
    estimator = advantage_estimator_spec(cfg.rl_algorithm)
    if cfg.rollout_n < estimator.min_group_size:
        fail("rollout_n", f"{cfg.rl_algorithm} needs at least {estimator.min_group_size} samples per prompt (its "
                          "advantage compares each sample with the others of its group)")
    unknown_options = [k for k in estimator.config_keys if k not in FIELDS]
    unknown_options += [k for k, _ in estimator.key_defaults if k not in FIELDS]
    if unknown_options:
        fail("rl_algorithm", f"the estimator takes config option {unknown_options[0]!r}, which is not a config key")
    if estimator.needs_values:
        critic_refusals(cfg, given)
    has_rm = bool(cfg.reward_model_name_or_path.strip())
    if has_rm and cfg.use_rm_server:
        fail("reward_model_name_or_path", "is set while use_rm_server is true: the reward server hosts the reward "
                                          "model (python -m reward_server --reward-model DIR); set use_rm_server: "
                                          "false to score with it in-process")
    if cfg.per_device_reward_batch_size < 1:
        fail("per_device_reward_batch_size", "must be at least 1")
    if cfg.use_rm_server and not cfg.reward_server.strip():
        fail("reward_server", "is empty while use_rm_server is true")
    if not cfg.use_rm_server and not cfg.reward_funcs.strip() and not has_rm:
        fail("reward_funcs", "is empty while use_rm_server is false: name the reward functions to run in-process "
                             "(for example reward_funcs: kk), or set reward_model_name_or_path (or "
                             "use_rule_reward: true, PaddleNLP's GSM8K rule reward)")
    if cfg.reward_weights is not None:
        n_funcs = len([r for r in cfg.reward_funcs.split(",") if r.strip()]) + has_rm
        listed = f"{cfg.reward_funcs}, then the reward model, whose weight comes last" if has_rm else cfg.reward_funcs
        if not cfg.use_rm_server and len(cfg.reward_weights) != n_funcs:
            fail("reward_weights", f"has {len(cfg.reward_weights)} weights for {n_funcs} reward functions "
                                   f"({listed.lstrip(', ')})")
        if cfg.use_rm_server:
            fail("reward_weights", "applies to in-process reward functions; with use_rm_server the server "
                                   "weighs its functions (python -m reward_server --weights ...)")
    if cfg.do_eval and cfg.evaluation_strategy == "steps" and not cfg.eval_datasets.strip():
        fail("eval_datasets", "is empty while do_eval is true")
    if cfg.do_eval and cfg.eval_steps < 1:
        fail("eval_steps", "must be at least 1")
    if cfg.save_strategy == "steps" and cfg.save_steps < 1:
        fail("save_steps", "must be at least 1")
    if cfg.fp16 and cfg.bf16:
        fail("fp16", "fp16 and bf16 cannot both be true")
    if cfg.lora_alpha <= 0 and cfg.lora_alpha != -1:
        fail("lora_alpha", "must be positive (or -1: 2 x lora_rank)")
    if not 0 <= cfg.lora_dropout < 1:
        fail("lora_dropout", "must be in [0, 1)")
    for pattern in cfg.target_modules:
        try:
            re.compile(pattern)
        except re.error as e:
            fail("target_modules", f"'{pattern}' is not a valid regular expression ({e})")
    if cfg.lora and cfg.sync_ref_model:
        fail("sync_ref_model", "cannot be used with lora: the reference model is the base model with the adapters "
                               "disabled; there is no separate copy to mix the policy into")
    if cfg.tool_timeout_s <= 0:
        fail("tool_timeout_s", "must be greater than 0")
    if cfg.tool_server.strip():
        bad_url = url_problem(cfg.tool_server)
        if bad_url:
            fail("tool_server", bad_url)
    # The tools themselves load where the trainer builds them (step.build_tools) and in --dry_run, as the reward
    # functions do: an unknown name is refused there with the registered tools listed (config.py imports no tools).
    return cfg


def url_problem(url: str) -> Optional[str]:
    """Why `url` is not an http(s) URL with a host (None when it is)."""
    from urllib.parse import urlparse
    try:
        parts = urlparse(url.strip())
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError as e:
        return f"is not a URL ({e})"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "must be an http:// or https:// URL with a host, e.g. http://127.0.0.1:8731"
    return None


def critic_refusals(cfg: Config, given: Dict[str, str]) -> None:
    """Raise ConfigError for what a critic run (Config.needs_critic) refuses, naming the keys and where they were
    set: no critic model, pipeline stages (the critic is built whole on each rank: policy/critic.py has no pipeline
    layers). An encoder-decoder policy is refused by `encoder_decoder_refusal` where the policy's config.json is
    read (dry run, start-up)."""
    algorithm = f"rl_algorithm {cfg.rl_algorithm!r} trains a critic (value model)"
    place = given.get("critic_model_name_or_path") or given.get("rl_algorithm")
    if not cfg.critic_model_name_or_path.strip():
        raise ConfigError(f"{place + ': ' if place else ''}key 'critic_model_name_or_path' is empty: {algorithm} "
                          f"(rl_algorithm: {cfg.rl_algorithm}); name its directory or hub ID (PaddleNLP's configs "
                          "use the policy's, e.g. Qwen/Qwen2.5-1.5B-Instruct)")
    if cfg.pipeline_parallel_degree > 1:
        place = given.get("pipeline_parallel_degree")
        raise ConfigError(f"{place + ': ' if place else ''}key 'pipeline_parallel_degree' = "
                          f"{cfg.pipeline_parallel_degree}: must be 1: {algorithm}, and the critic is not built for "
                          "pipeline stages; use tensor_parallel_degree and sharding instead "
                          f"(critic_model_name_or_path {cfg.critic_model_name_or_path!r})")


def encoder_decoder_refusal(cfg: Config, is_encoder_decoder: bool) -> Optional[str]:
    """The refusal (a message naming the keys) of a run an encoder-decoder policy cannot do, or None: a critic
    (a decoder backbone reading prompt + completion as one sequence: an encoder-decoder policy's completions have
    no such decoder states to value), or tools (the multi-turn rollout appends tool turns to the model's own
    sequence; an encoder-decoder's decoder holds the answer alone)."""
    if not is_encoder_decoder:
        return None
    if cfg.tools:
        return (f"actor_model_name_or_path: '{cfg.actor_model_name_or_path}' is an encoder-decoder model, and tools "
                f"({', '.join(cfg.tools)}) make rollouts multi-turn, whose tool turns continue the model's own "
                "sequence: not supported for encoder-decoder policies (use a decoder-only policy, or leave tools "
                "empty)")
    if not cfg.needs_critic:
        return None
    return (f"actor_model_name_or_path: '{cfg.actor_model_name_or_path}' is an encoder-decoder model, and "
            f"rl_algorithm {cfg.rl_algorithm!r} trains a critic (critic_model_name_or_path), which is a decoder "
            "backbone valuing the policy's prompt + completion as one sequence: not supported for encoder-decoder "
            "policies (use a decoder-only policy, or an estimator without a critic)")


def resolve_rule_reward(cfg: Config, given: Dict[str, str]) -> None:
    """PaddleNLP's `use_rule_reward: true` (its PPO configs' GSM8K rule reward, scored in-process) becomes
    `reward_funcs: gsm8k`, logged; combinations PaddleNLP would resolve by ignoring a key are refused, naming both."""
    if not cfg.use_rule_reward:
        return
    where = given.get("use_rule_reward")
    prefix = f"{where}: " if where else ""
    if cfg.use_rm_server:
        raise ConfigError(f"{prefix}key 'use_rule_reward' = True: scores in-process with the GSM8K rule reward, "
                          "while use_rm_server is true (the reward server would be ignored); set use_rm_server: "
                          "false, or use_rule_reward: false to score with the server")
    if cfg.reward_funcs.strip() not in ("", "gsm8k"):
        raise ConfigError(f"{prefix}key 'use_rule_reward' = True: means reward_funcs: gsm8k, while reward_funcs is "
                          f"{cfg.reward_funcs!r}; set one of the two")
    if cfg.reward_model_name_or_path.strip():
        raise ConfigError(f"{prefix}key 'use_rule_reward' = True: scores with the GSM8K rule reward, while "
                          f"reward_model_name_or_path is {cfg.reward_model_name_or_path!r} (it would be ignored, as "
                          "in PaddleNLP); set one of the two")
    if not cfg.reward_funcs.strip():
        cfg.reward_funcs = "gsm8k"
        logger.info("%suse_rule_reward: true: completions are scored in-process with PaddleNLP's GSM8K rule reward, "
                    "reward_funcs: gsm8k", prefix)


def parse_args(argv: Sequence[str]) -> Config:
    """`[CONFIG.yaml|CONFIG.json] [--key value ...]` -> Config (PaddleNLP's run_rl.py convention)."""
    argv = list(argv)
    path = argv.pop(0) if argv and not argv[0].startswith("--") else None
    return load_config(path, argv)


def config_from_dict(values: Dict[str, Any], **kwargs: Any) -> Config:
    """A validated Config from a plain dict (tests, tools); the same conversions and errors as a file."""
    cfg_values, given = {}, {}
    _apply(values, _Source("<dict>"), cfg_values, given)
    cfg = Config(**cfg_values)
    resolve_rule_reward(cfg, given)
    validate(cfg, given)
    cfg._given = dict(given)  # given_keys
    return cfg


def given_keys(cfg: Config) -> Dict[str, str]:
    """The keys the file or command line set (key -> 'file:line', 'command line' or '<dict>'); {} for a Config built
    directly."""
    return dict(getattr(cfg, "_given", {}))


def dump_config(cfg: Config, path: Union[str, os.PathLike]) -> None:
    """Write the resolved configuration as YAML (JSON if `path` ends in .json)."""
    with open(path, "w", encoding="utf-8") as f:
        if str(path).endswith(".json"):
            json.dump({k: ("***" if k in SECRET_KEYS and v else v) for k, v in cfg.to_dict().items()}, f, indent=2)
        else:
            f.write(cfg.format())


def write_config(cfg: Config, path: Union[str, os.PathLike]) -> None:
    """Write the resolved configuration to `path` (a run's `output_dir/config.yaml`). When a previous start of
    the same run wrote one (a resume), name the keys whose values changed since, rather than replace it silently."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            before = yaml.safe_load(f) or {}
        now = yaml.safe_load(cfg.format())
        changed = sorted(k for k in now if k in before and before[k] != now[k])
        if changed:
            logger.info("%s: keys changed since the run's previous start: %s", path,
                        ", ".join(f"{k} {before[k]!r} -> {now[k]!r}" for k in changed))
    dump_config(cfg, path)
