"""RolloutArguments: sampling (temperature, top-p/k, repetition penalty, group size) and where it runs (the
asynchronous rollout worker, docs/async.md)."""
from __future__ import annotations

from dataclasses import dataclass

from .fields import arg, off


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
    rollout_precision: str = arg(
        "float32", "(new) Precision of the rollout's matrix products on a CPU (the CPU decode engine, "
        "docs/PERFORMANCE.md \"Generation\"): float32, or bfloat16 (bf16 weights and activations, float32 sums: "
        "AVX512-BF16 or AMX CPUs; refused where this CPU has no bf16 kernel). The update and the log-probs stay "
        "float32; the samples then come from a slightly different policy, which rollout_correction corrects (tis "
        "when rollout_correction is not set) and logs (rollout_correction/kl). Evaluation samples in float32.",
        choices=("float32", "bfloat16"),
        gpu=off("a GPU rollout runs in the precision of bf16 / fp16 (AMP); this key picks the CPU decode engine's"))
    async_rollout: bool = arg(False, "(new) Generate and reward the next step's samples in a rollout worker "
                                     "process while the trainer updates on this step's (docs/async.md): both cores "
                                     "of a CPU busy. The samples of step t come from the weights after step "
                                     "t - 1 - rollout_lag, so a run stays deterministic and resumes exactly. One "
                                     "trainer process only (not with data, tensor or pipeline parallelism).")
    rollout_lag: int = arg(1, "(new) With async_rollout: how many updates the sampling weights trail the trainer's "
                              "(the batch's staleness). 0: each step waits for the weights of the previous update "
                              "(the synchronous results, no overlap); 1: one step's rollout overlaps the previous "
                              "step's update.")
    rollout_worker_timeout_s: float = arg(1800.0, "(new) With async_rollout: seconds the trainer waits for a step's "
                                                  "samples before it stops the run, naming the rollout worker as "
                                                  "hung (0: no limit).")
    rollout_worker_threads: int = arg(0, "(new) With async_rollout: CPU threads of the rollout worker's kernels "
                                         "(its OMP_NUM_THREADS and MKL_NUM_THREADS); 0: the trainer's. A model whose "
                                         "update is much longer than its rollout gains from a 2-thread trainer beside "
                                         "a 1-thread worker on 2 cores (SmolLM2-135M: 1.00-1.15x shorter than "
                                         "synchronous; docs/async.md).")
    rollout_worker_reference: bool = arg(True, "(new) With async_rollout and a KL term (kl_loss_coeff or "
                                               "reward_kl_coeff): the rollout worker computes the reference "
                                               "model's log-probs of its samples, so that forward pass leaves the "
                                               "trainer's core and the trainer holds no reference copy; false: the "
                                               "trainer computes them (better when the rollout is the longer part: "
                                               "docs/async.md). Not with sync_ref_model (the trainer mixes its "
                                               "reference).")
