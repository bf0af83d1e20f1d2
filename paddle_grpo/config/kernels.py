"""KernelArguments: precision, fused kernels, recompute, the chunked LM head, offloading."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

from .fields import (
    _RECOMPUTE_GPU,
    DEFAULT_HEAD_CHUNK_SIZE,
    HEAD_CHUNK_MIN_VOCAB,
    HOST_MEMORY,
    ON,
    _amp_effect,
    arg,
    nowhere,
    off,
    on,
)


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
              "tools/bench/bench_head.py); the start-up line `LM head: ...` says which and why. PaddleNLP's default is "
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
