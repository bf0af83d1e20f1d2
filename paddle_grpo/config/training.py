"""TrainingArguments: steps, optimizer, schedule, checkpoints, faults (PaddleNLP's TrainingArguments)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

from .fields import LR_SCHEDULERS, arg, nowhere


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
