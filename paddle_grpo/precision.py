"""The precision plan: which dtype the models load in, whether the update runs under AMP, and which PaddleNLP model
kernels are switched on, decided from the config and the device by one pure function.

`precision_plan(cfg, device)` reads the PaddleNLP keys `bf16`, `fp16`, `fp16_opt_level`, `amp_master_grad`,
`amp_custom_white_list`, `amp_custom_black_list`, `use_flash_attention`, `use_fused_rms_norm`, `use_fused_rope`,
`use_fused_linear`, `sequence_parallel` (and `pipeline_parallel_degree`), and returns a
frozen `PrecisionPlan`. Every key that asks for something this run will not do is in `plan.not_applied` with the
reason; the trainer prints `plan.describe()` at start-up and warns each reason, so nothing is ignored silently.

On a GPU the plan follows PaddleNLP's trainer (docs/precision.md):
- `bf16` / `fp16` with `fp16_opt_level: O1`: parameters stay float32; the update's forward runs under
  `paddle.amp.auto_cast(level="O1", dtype=...)` with the custom white/black lists.
- with `O2`: the policy and the reference load in bfloat16/float16, `paddle.amp.decorate(level="O2",
  master_weight=True, master_grad=amp_master_grad)` keeps float32 master weights in the optimizer, and the forward
  runs under `auto_cast(level="O2")`.
- `fp16` (either level): a dynamic loss scale (`LossScale`: GradScaler's rule, PaddleNLP's trainer's settings),
  saved in checkpoints; bf16 needs none.
- the kernel keys are set on the model config (PaddleNLP's `LlmMetaConfig` fields of the same names).
Log-probs, entropies and losses are float32 whatever the plan: the logits are cast before the log-softmax.

A GPU without the requested AMP dtype (bfloat16 below compute capability 8.0, e.g. V100 and T4; float16 below 7.0)
runs float32, and the plan says so (`GpuInfo`): paddle's own AMP would switch itself off there. A kernel flag with a
device requirement Paddle documents (`KERNEL_NEEDS`: flash attention needs compute capability 8.0) is turned off on a
GPU without it, with the reason in the start-up line.

On a CPU everything is float32 and no kernel flag is set: paddle has no bfloat16 matmul kernel on CPU
(docs/platform.md), and flash attention and the fused kernels are GPU kernels. The runtime side (`autocast`,
`decorate`, `LossScale`) imports paddle only when called, so the plan itself is cheap to compute (e.g. in a dry run).
"""
from __future__ import annotations

import contextlib
import logging
import math
from dataclasses import dataclass
from typing import Any, ContextManager, Dict, List, Optional, Sequence, Tuple

logger = logging.getLogger("paddle_grpo.precision")

AMP_KEYS = ("bf16", "fp16", "fp16_opt_level", "amp_master_grad", "amp_custom_white_list", "amp_custom_black_list")
# Config keys that are PaddleNLP model-config fields of the same name (LlmMetaConfig, PaddleNLP 3.0.0b4).
MODEL_FLAG_KEYS = ("use_flash_attention", "use_fused_rms_norm", "use_fused_rope", "use_fused_linear")

# What each key does on a GPU run (docs/configuration.md's per-device table reads this). Verified on CPU only: the
# plan's decisions, the calls' arguments against paddle's API, the loading dtype and flags (tests/test_precision.py).
GPU_EFFECT: Dict[str, str] = {
    "bf16": "bfloat16 AMP: paddle.amp.auto_cast(dtype='bfloat16') around the update's forward; with O2 the models "
            "load in bfloat16",
    "fp16": "float16 AMP as bf16, plus a dynamic loss scale (GradScaler's rule)",
    "fp16_opt_level": "O1: float32 parameters, autocast per op; O2: low-precision parameters, paddle.amp.decorate "
                      "with float32 master weights",
    "amp_master_grad": "O2: float32 gradients (paddle.amp.decorate master_grad); O1 has float32 gradients anyway",
    "amp_custom_white_list": "passed to paddle.amp.auto_cast(custom_white_list=...)",
    "amp_custom_black_list": "passed to paddle.amp.auto_cast(custom_black_list=...)",
    "use_flash_attention": "set on the model config (PaddleNLP's flash-attention path); turned off, with the "
                           "reason at start-up, on a GPU below compute capability 8.0 (V100, T4)",
    "use_fused_rms_norm": "set on the model config (PaddleNLP's fused RMSNorm)",
    "use_fused_rope": "set on the model config (PaddleNLP's fused rotary embedding)",
    "use_fused_linear": "set on the model config; in PaddleNLP 3.0.0b4 only GPT models read it (Qwen2 and Llama "
                        "have no fused-linear path); turned off, with the reason, with a paddle built for CUDA < 11.6",
    "sequence_parallel": "not implemented (see NOT_IMPLEMENTED)",
}

# Keys that have no effect on any device, and why.
NOT_IMPLEMENTED: Dict[str, str] = {
    "sequence_parallel": "PaddleNLP's sequence-parallel models scatter the sequence over the tensor-parallel ranks "
                         "(length divisible by tensor_parallel_degree); the log-prob path slices the decoder's "
                         "hidden states by position and the decode loop feeds one token at a time, which neither "
                         "handles (not implemented)",
}

CPU_REASONS: Dict[str, str] = {
    "bf16": "paddle has no bfloat16 matmul kernel on CPU (docs/platform.md); the run computes in float32",
    "fp16": "paddle's float16 AMP (auto_cast, loss scaling) runs on GPU only; the run computes in float32",
    "use_flash_attention": "flash attention is a GPU kernel",
    "use_fused_rms_norm": "the fused kernels are GPU kernels",
    "use_fused_rope": "the fused kernels are GPU kernels",
    "use_fused_linear": "the fused kernels are GPU kernels",
}

_DTYPES = {"bf16": "bfloat16", "fp16": "float16"}


@dataclass(frozen=True)
class GpuInfo:
    """What the plan needs to know of the GPU: its name, CUDA compute capability (major, minor), the CUDA version
    paddle was built with (`paddle.version.cuda()`, None without CUDA) and whether paddle is a ROCm build."""
    name: str
    capability: Tuple[int, int]
    cuda_version: Optional[str]
    rocm: bool = False

    def amp_unsupported(self, dtype: str) -> Optional[str]:
        """None when paddle runs `dtype` ('bfloat16', 'float16') AMP on this GPU, else why not. paddle's own rule
        (paddle/amp/auto_cast.py, `_is_gpu_bfloat16_supported` / `_is_gpu_float16_supported`, Paddle 3.x): bfloat16
        needs compute capability >= 8.0 and CUDA >= 11, float16 compute capability >= 7.0; a ROCm build has both.
        Without it `auto_cast` switches itself off and `decorate` returns without float32 master weights."""
        if self.rocm:
            return None
        major, minor = self.capability
        if dtype == "bfloat16" and major >= 8 and _version(self.cuda_version) >= (11,) or \
                dtype == "float16" and major >= 7:
            return None
        need = "compute capability >= 8.0 and CUDA >= 11" if dtype == "bfloat16" else "compute capability >= 7.0"
        return (f"{self.name} (compute capability {major}.{minor}, CUDA {self.cuda_version}) has no {dtype} AMP in "
                f"paddle, which needs {need} (its auto_cast would switch itself off, and decorate would keep no "
                "float32 master weights); the run computes in float32")

    def kernel_unsupported(self, key: str) -> Optional[str]:
        """None when the model-config kernel flag `key` (MODEL_FLAG_KEYS) can run on this GPU, else why not, from
        what Paddle documents of each kernel (KERNEL_NEEDS). A ROCm build has its own flash attention (paddle's
        cmake/external/flashattn.cmake builds it for ROCm) and no documented limit: nothing is turned off there."""
        need = KERNEL_NEEDS.get(key)
        if need is None or self.rocm:
            return None
        capability, cuda, why = need
        if tuple(self.capability) >= capability and _version(self.cuda_version) >= cuda:
            return None
        major, minor = self.capability
        return (f"{self.name} (compute capability {major}.{minor}, CUDA {self.cuda_version}) cannot run it: {why}; "
                "turned off, PaddleNLP's plain path runs")


# Kernel flags with a documented device requirement: key -> (minimum compute capability, minimum CUDA of the paddle
# build, where Paddle says so). use_fused_rms_norm and use_fused_rope: Paddle documents no capability or CUDA limit
# (fused_rms_norm_cn.rst: "GPU only"; fused_rotary_position_embedding_cn.rst: none), so they stay on.
KERNEL_NEEDS: Dict[str, Tuple[Tuple[int, int], Tuple[int, ...], str]] = {
    "use_flash_attention": ((8, 0), (11, 4), "FlashAttention-2 needs compute capability >= 8.0 (paddle 3.3's "
                                             "nn/functional/sdpa.py: flash_attn MINIMUM_SM_VERSION (8, 0); paddle's "
                                             "cmake/third_party.cmake builds it only for CUDA >= 11.4 and sm >= 80)"),
    "use_fused_linear": ((0, 0), (11, 6), "paddle.incubate.nn.functional.fused_linear needs CUDA >= 11.6 "
                                          "(fused_linear_cn.rst)"),
}


def _version(text: Optional[str]) -> Tuple[int, ...]:
    """'12.3' -> (12, 3); None, 'False' or anything unparsable -> (0,) (no CUDA: every CUDA minimum fails)."""
    parts = (text or "").split(".")
    return tuple(int(p) for p in parts) if all(p.isdigit() for p in parts) else (0,)


def gpu_info() -> GpuInfo:
    """This process's GPU, from paddle's documented device API (paddle.device.cuda)."""
    import paddle

    return GpuInfo(name=paddle.device.cuda.get_device_name(),
                   capability=tuple(paddle.device.cuda.get_device_capability()),
                   cuda_version=str(paddle.version.cuda()) if paddle.version.cuda() not in (None, "False") else None,
                   rocm=bool(paddle.is_compiled_with_rocm()))


@dataclass(frozen=True)
class PrecisionPlan:
    """What one run does about precision and kernels (see the module docstring). Defaults: plain float32.

    load_dtype: the dtype the policy and the reference load in. amp_dtype: the autocast dtype (None: no autocast).
    amp_level: "O1" or "O2" under autocast. decorate_o2: `paddle.amp.decorate(level="O2")` with float32 master
    weights; master_grad: its float32 gradients. loss_scaling: a dynamic loss scale (fp16). model_flags: model-config
    fields to set. not_applied: (key, reason) for each requested key this run does not apply."""
    device: str = "cpu"
    load_dtype: str = "float32"
    amp_dtype: Optional[str] = None
    amp_level: str = "O0"
    decorate_o2: bool = False
    master_grad: bool = False
    loss_scaling: bool = False
    custom_white_list: Tuple[str, ...] = ()
    custom_black_list: Tuple[str, ...] = ()
    model_flags: Tuple[Tuple[str, bool], ...] = ()
    not_applied: Tuple[Tuple[str, str], ...] = ()

    @property
    def uses_amp(self) -> bool:
        return self.amp_dtype is not None

    @property
    def load_kwargs(self) -> Dict[str, Any]:
        """Keyword arguments of `load_policy` for this plan: none for float32 without flags (the default load)."""
        out: Dict[str, Any] = {}
        if self.load_dtype != "float32":
            out["dtype"] = self.load_dtype
        if self.model_flags:
            out["config_overrides"] = dict(self.model_flags)
        return out

    def describe(self) -> str:
        """One line, printed at start-up: `precision: <what is done>[; not applied: key (reason), ...]`."""
        if self.uses_amp:
            what = (f"{self.load_dtype} parameters, auto_cast {self.amp_level} {self.amp_dtype}"
                    + (" with float32 master weights" if self.decorate_o2 else "")
                    + (" and float32 master gradients" if self.master_grad else "")
                    + (", dynamic loss scale" if self.loss_scaling else ""))
        else:
            what = f"{self.load_dtype} throughout, no AMP"
        if self.custom_white_list or self.custom_black_list:
            what += (f", white list {list(self.custom_white_list)}, black list {list(self.custom_black_list)}")
        what += f", kernels: {', '.join(k for k, _ in self.model_flags) or 'PaddleNLP defaults'}"
        what += f" ({self.device})"
        if self.not_applied:
            what += "; not applied: " + " | ".join(f"{k}: {reason}" for k, reason in self.not_applied)
        return f"precision: {what}"

    # --------------------------------------------------------------------- runtime: paddle only from here on

    def autocast(self) -> ContextManager:
        """The context of the update's forward: `paddle.amp.auto_cast(...)` under AMP, else a no-op
        (contextlib.nullcontext: a float32 run executes exactly the ops it always did)."""
        if not self.uses_amp:
            return contextlib.nullcontext()
        import paddle

        return paddle.amp.auto_cast(enable=True, custom_white_list=set(self.custom_white_list) or None,
                                    custom_black_list=set(self.custom_black_list) or None, level=self.amp_level,
                                    dtype=self.amp_dtype)

    def decorate(self, model: Any, optimizer: Any) -> Any:
        """`paddle.amp.decorate` level O2 with float32 master weights when the plan says so; returns the optimizer
        to use (unchanged otherwise). `model` is cast in place (norm layers stay float32, as paddle decides)."""
        if not self.decorate_o2:
            return optimizer
        import paddle

        _, optimizer = paddle.amp.decorate(models=model, optimizers=optimizer, level="O2", dtype=self.amp_dtype,
                                           master_weight=True, master_grad=self.master_grad)
        return optimizer

    def runtime(self) -> Optional["Amp"]:
        """What the update needs under AMP (step.Learner.amp), None for a run without AMP."""
        return Amp(self, LossScale() if self.loss_scaling else None) if self.uses_amp else None


class LossScale:
    """A dynamic loss scale with the rule and settings of PaddleNLP's trainer, which makes
    `paddle.amp.GradScaler(init_loss_scaling=args.scale_loss)`: start at 2**15 (PaddleNLP's `scale_loss` default;
    GradScaler's own default is 2**16), then GradScaler's defaults: halve after `decr_every_n_nan_or_inf` (1)
    overflowing update, double after `incr_every_n_steps` (2000) good ones in a row. Its state (`state_dict`) is kept
    in checkpoints, so a resumed fp16 run continues with the scale it had.

    Kept here rather than GradScaler itself because the update decides "finite or not" once for all ranks (the
    global gradient norm), while GradScaler decides from this rank's gradients only: under tensor parallelism the
    shards differ, and ranks would disagree on skipping a step."""

    def __init__(self, init_loss_scaling: float = 2.0 ** 15, incr_ratio: float = 2.0, decr_ratio: float = 0.5,
                 incr_every_n_steps: int = 2000, decr_every_n_nan_or_inf: int = 1):
        self.scale = float(init_loss_scaling)
        self.incr_ratio, self.decr_ratio = incr_ratio, decr_ratio
        self.incr_every_n_steps, self.decr_every_n_nan_or_inf = incr_every_n_steps, decr_every_n_nan_or_inf
        self.good_in_a_row = 0
        self.bad_in_a_row = 0

    def state_dict(self) -> Dict[str, float]:
        """The scale and the counts of good / overflowing updates in a row (JSON-serialisable)."""
        return {"scale": self.scale, "good_in_a_row": self.good_in_a_row, "bad_in_a_row": self.bad_in_a_row}

    def load_state_dict(self, state: Dict[str, float]) -> None:
        self.scale = float(state["scale"])
        self.good_in_a_row, self.bad_in_a_row = int(state["good_in_a_row"]), int(state["bad_in_a_row"])

    def update(self, finite: bool) -> None:
        """Count one update whose (unscaled) gradients were finite or not, and adjust the scale."""
        if finite:
            self.bad_in_a_row, self.good_in_a_row = 0, self.good_in_a_row + 1
            if self.good_in_a_row == self.incr_every_n_steps:
                self.scale, self.good_in_a_row = self.scale * self.incr_ratio, 0
        else:
            self.good_in_a_row, self.bad_in_a_row = 0, self.bad_in_a_row + 1
            if self.bad_in_a_row == self.decr_every_n_nan_or_inf:
                self.scale, self.bad_in_a_row = self.scale * self.decr_ratio, 0


@dataclass
class Amp:
    """The plan applied to the update (step.Learner.amp): the forward's autocast context, and the loss scale of an
    fp16 run (None otherwise)."""
    plan: PrecisionPlan
    loss_scale: Optional[LossScale] = None

    def autocast(self) -> ContextManager:
        return self.plan.autocast()

    def state_dict(self) -> Optional[Dict[str, float]]:
        """What a checkpoint keeps (trainer_state.json, "loss_scale"): the loss scale's state, None without one."""
        return None if self.loss_scale is None else self.loss_scale.state_dict()

    def load_state_dict(self, state: Optional[Dict[str, float]]) -> None:
        """Restore a checkpoint's loss scale; nothing to do without a loss scale here or a saved one there (a run
        resumed with another precision keeps its fresh scale)."""
        if self.loss_scale is not None and state:
            self.loss_scale.load_state_dict(state)

    def scale(self, loss: Any) -> Any:
        """The loss to call backward on: loss x scale with a loss scale (gradients of small fp16 values stay
        representable), else `loss` itself."""
        return loss if self.loss_scale is None else loss * self.loss_scale.scale

    def unscale(self, parameters: Sequence[Any]) -> None:
        """Divide the gradients by the loss scale, before their norm and clipping (no-op without a loss scale)."""
        if self.loss_scale is None:
            return
        import paddle

        with paddle.no_grad():
            for p in parameters:
                if p.grad is not None:
                    p.grad.scale_(1.0 / self.loss_scale.scale)

    def overflowed(self, loss_finite: bool, grad_norm: float) -> bool:
        """After one mini-batch's gradients (loss finite on every rank or not, their global norm): update the loss
        scale and return True when a non-finite gradient is an fp16 overflow of the scaled loss (the step is then
        skipped without counting as a non-finite update). A gradient that is not finite at a scale of 1 or less,
        or any non-finite loss, is a real failure (False)."""
        if self.loss_scale is None or not loss_finite:
            return False
        finite = math.isfinite(grad_norm)
        scale = self.loss_scale.scale
        self.loss_scale.update(finite)
        if finite or scale <= 1.0:
            return False
        logger.warning("fp16 gradient overflow at loss scale %g: optimizer step skipped (scale now %g)", scale,
                       self.loss_scale.scale)
        return True


def full_precision() -> ContextManager:
    """The context of the float32 maths after the model (log-softmax, entropy, the sampling maths): autocast switched
    off when the update's AMP is active (under O2 it would cast float32 inputs back to bf16/fp16), else a no-op."""
    import paddle

    return paddle.amp.auto_cast(enable=False) if paddle.amp.is_autocast_enabled() else contextlib.nullcontext()


# -------------------------------------------------------------------------------------------------------- the plan

def normalize_device(device: str) -> str:
    """'gpu', 'gpu:0', 'cpu', ... -> 'gpu', 'cpu', or the device type as given ('xpu', ...)."""
    return str(device).split(":")[0].lower()


def precision_plan(cfg: Any, device: str, *, gpu: Optional[GpuInfo] = None) -> PrecisionPlan:
    """The plan for config `cfg` (a Config, or anything with its attributes) on `device` ('cpu', 'gpu', 'gpu:N').
    `gpu`: on a GPU, what it supports (`gpu_info()`; plan_for_run passes it); None: a GPU with bfloat16 and float16
    AMP and every kernel. A GPU without the requested AMP dtype runs float32, and the plan says why
    (`GpuInfo.amp_unsupported`); a kernel flag the GPU cannot run (flash attention below compute capability 8.0) is
    turned off, and the plan says why (`GpuInfo.kernel_unsupported`).

    Pure: no paddle, no I/O. Raises ValueError naming the keys for contradictory settings (bf16 with fp16, an
    fp16_opt_level other than O1/O2)."""
    device = normalize_device(device)
    if cfg.bf16 and cfg.fp16:
        raise ValueError("bf16 and fp16: only one of them can be true")
    if cfg.fp16_opt_level not in ("O1", "O2"):
        raise ValueError(f"fp16_opt_level: '{cfg.fp16_opt_level}' is not one of O1, O2")
    amp_key = "bf16" if cfg.bf16 else "fp16" if cfg.fp16 else None
    not_applied: List[Tuple[str, str]] = []
    flags = [k for k in MODEL_FLAG_KEYS if getattr(cfg, k)]
    for key in NOT_IMPLEMENTED:
        if getattr(cfg, key):
            not_applied.append((key, NOT_IMPLEMENTED[key]))

    if device != "gpu":
        reasons = dict(CPU_REASONS) if device == "cpu" else {
            k: f"AMP and the fused kernels are implemented for GPUs only here (device '{device}')" for k in CPU_REASONS}
        if amp_key:
            not_applied.append((amp_key, reasons[amp_key]))
        not_applied += _amp_detail_reasons(cfg, amp_key, f"no AMP on this device (see {amp_key})" if amp_key else None)
        not_applied += [(k, reasons[k]) for k in flags]
        return PrecisionPlan(device=device, not_applied=_ordered(not_applied))

    turned_off = {k: why for k in flags if gpu is not None for why in [gpu.kernel_unsupported(k)] if why}
    not_applied += list(turned_off.items())
    model_flags = tuple((k, True) for k in flags if k not in turned_off)
    if amp_key and cfg.pipeline_parallel_degree > 1:
        not_applied.append((amp_key, "pipeline_parallel_degree > 1: the pipeline schedule (parallel/pipeline.py) runs "
                                     "its forward outside the autocast context and has no loss scale (not "
                                     "implemented); the run computes in float32"))
        not_applied += _amp_detail_reasons(cfg, amp_key, f"no AMP under pipeline parallelism (see {amp_key})")
        return PrecisionPlan(device=device, model_flags=model_flags, not_applied=_ordered(not_applied))
    if not amp_key:
        not_applied += _amp_detail_reasons(cfg, None, None)
        return PrecisionPlan(device=device, model_flags=model_flags, not_applied=_ordered(not_applied))

    dtype, o2 = _DTYPES[amp_key], cfg.fp16_opt_level == "O2"
    unsupported = gpu.amp_unsupported(dtype) if gpu is not None else None
    if unsupported:
        not_applied.append((amp_key, unsupported))
        not_applied += _amp_detail_reasons(cfg, amp_key, f"no AMP on this GPU (see {amp_key})")
        return PrecisionPlan(device=device, model_flags=model_flags, not_applied=_ordered(not_applied))
    if cfg.amp_master_grad and not o2:
        not_applied.append(("amp_master_grad", "applies to fp16_opt_level O2; under O1 the parameters and their "
                                               "gradients are float32 already"))
    return PrecisionPlan(device=device, load_dtype=dtype if o2 else "float32", amp_dtype=dtype,
                         amp_level=cfg.fp16_opt_level, decorate_o2=o2, master_grad=bool(o2 and cfg.amp_master_grad),
                         loss_scaling=amp_key == "fp16", custom_white_list=tuple(cfg.amp_custom_white_list),
                         custom_black_list=tuple(cfg.amp_custom_black_list), model_flags=model_flags,
                         not_applied=_ordered(not_applied))


def _amp_detail_reasons(cfg: Any, amp_key: Optional[str], reason: Optional[str]) -> List[Tuple[str, str]]:
    """(key, reason) for each AMP detail key set to something other than its default while AMP does not run."""
    reason = reason or "neither bf16 nor fp16 is set: no AMP"
    out = []
    if cfg.fp16_opt_level != "O1":
        out.append(("fp16_opt_level", reason))
    for key in ("amp_master_grad", "amp_custom_white_list", "amp_custom_black_list"):
        if getattr(cfg, key):
            out.append((key, reason))
    return out


def _ordered(pairs: List[Tuple[str, str]]) -> Tuple[Tuple[str, str], ...]:
    """The (key, reason) pairs in the order of the config's keys (stable output)."""
    order = {k: i for i, k in enumerate(AMP_KEYS + MODEL_FLAG_KEYS + tuple(NOT_IMPLEMENTED))}
    return tuple(sorted(pairs, key=lambda kv: order.get(kv[0], len(order))))


def plan_for_run(cfg: Any, device: Optional[str] = None, *, gpu: Optional[GpuInfo] = None,
                 announce: bool = True) -> PrecisionPlan:
    """The plan on this process's device (paddle.get_device() unless given; on a GPU, `gpu_info()` unless `gpu` is
    given); with `announce`, logs its one `precision: ...` line (trainer start-up), as a warning when a requested
    key is not applied."""
    if device is None:
        import paddle

        device = paddle.get_device()
    if gpu is None and normalize_device(device) == "gpu":
        gpu = gpu_info()
    plan = precision_plan(cfg, device, gpu=gpu)
    if announce:
        logger.log(logging.WARNING if plan.not_applied else logging.INFO, plan.describe())
    return plan
