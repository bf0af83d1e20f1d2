"""DataArguments: datasets, chat template, prompt and completion lengths, batch sizes of the step."""
from __future__ import annotations

from dataclasses import dataclass

from .fields import arg


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
