"""Process-level settings that make paddle's CPU kernels several times faster on the project's machines.

Three causes, all measured on the 2-core AMD EPYC hosts (docs/PERFORMANCE.md):

1. paddle's CPU wheel links MKL 2019.0.5 (`libmklml_intel.so`), which on a non-Intel CPU dispatches to a generic
   SSE code path unless `MKL_DEBUG_CPU_TYPE=5` selects the AVX2 kernels (the variable is honoured by MKL <= 2020.0
   and read at the first MKL call, so it works when set after `import paddle`). fp32 GEMM 4096x256 @ 256x704 goes
   from ~17 to ~45-70 GFLOP/s. Results differ from the SSE path only by float rounding (different summation order).
2. paddle allocates every CPU tensor with glibc `malloc`; blocks above the (dynamic) mmap threshold are mmap'ed and
   returned to the kernel when freed, so each op on a few-MB tensor page-faults its output again (~0.25 us per
   4 KiB page). An elementwise multiply of a 4 MB tensor took 4-10 ms instead of 0.2-0.5 ms. `mallopt` keeps such
   blocks in the heap (mmap threshold 32 MiB, the glibc maximum; trim threshold 1 GiB), trading some resident
   memory for the page faults.
3. With paddle's stride kernels (`FLAGS_use_stride_kernel`, on by default) `transpose`/`slice` return views, and the
   op that later needs contiguous memory copies them with a generic strided-copy kernel: ~6.5 ms for a 2 MB 5-D
   transpose that the dedicated transpose kernel does in ~0.08 ms. Attention is full of such transposes (forward and
   backward). Turning the flag off makes these ops copy eagerly with the fast kernels; values are identical. What
   changes: a view no longer aliases its base, so an in-place op on a slice/transpose result would not write
   through to the base (nothing in paddle_grpo, or in PaddleNLP's Qwen2 model, relies on that).

`apply()` is idempotent and does nothing when `PADDLE_GRPO_CPU_TUNING=0` or when the process runs on another device
than the CPU (`paddle.get_device()`: a GPU process keeps paddle's own process-wide defaults, since these settings
were measured for CPU kernels only); `PADDLE_GRPO_CPU_TUNING=mkl,malloc` (any subset of mkl, malloc,
stride) applies only those. `wanted(device, choice)` is that decision. It never overrides an `MKL_DEBUG_CPU_TYPE` or
`FLAGS_use_stride_kernel` the user set in the environment and sets the MKL variable only on AMD CPUs. It is called
by `policy.causal.load_causal_lm` (before any model runs) and by tools/bench.py. It changes no numbers beyond float
rounding.
"""
from __future__ import annotations

import ctypes
import logging
import os
import platform
from typing import Any, Dict, Optional, Set

logger = logging.getLogger("paddle_grpo.cpu_tuning")

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3   # glibc mallopt parameters (malloc.h)
MMAP_THRESHOLD = 32 << 20                      # glibc's largest accepted value (HEAP_MAX_SIZE / 2 on 64-bit)
TRIM_THRESHOLD = 1 << 30

_applied = None
SETTINGS = ("mkl", "malloc", "stride")


def _is_amd():
    try:
        with open("/proc/cpuinfo") as f:
            return "AuthenticAMD" in f.read(4096)
    except OSError:
        return False


def wanted(device: str, choice: str = "1") -> Set[str]:
    """Which of SETTINGS to apply on `device` ('cpu', 'gpu:0', ...) for PADDLE_GRPO_CPU_TUNING = `choice` ('1': all,
    '0': none, or a comma-separated subset): none off the CPU."""
    if str(device).split(":")[0].lower() != "cpu" or choice == "0":
        return set()
    return set(SETTINGS) if choice == "1" else set(choice.split(",")) & set(SETTINGS)


def apply(device: Optional[str] = None) -> Dict[str, Any]:
    """Apply the settings once per process on the CPU (`device`: paddle.get_device() unless given); returns a dict of
    what was set (empty when disabled or on another device)."""
    global _applied
    if _applied is not None:
        return _applied
    if device is None:
        import paddle

        device = paddle.get_device()
    if str(device).split(":")[0].lower() != "cpu":
        return {}  # not cached: a later call for a CPU (a tool choosing its device) still applies them
    chosen = wanted(device, os.environ.get("PADDLE_GRPO_CPU_TUNING", "1"))
    _applied = {}
    if "mkl" in chosen and "MKL_DEBUG_CPU_TYPE" not in os.environ and _is_amd():
        os.environ["MKL_DEBUG_CPU_TYPE"] = "5"
        _applied["MKL_DEBUG_CPU_TYPE"] = "5"
    if "malloc" in chosen and platform.system() == "Linux":
        try:
            libc = ctypes.CDLL("libc.so.6")
            if libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) and libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD):
                _applied["mallopt"] = {"mmap_threshold": MMAP_THRESHOLD, "trim_threshold": TRIM_THRESHOLD}
        except OSError:  # not glibc (e.g. musl): nothing to tune
            pass
    if "stride" in chosen and "FLAGS_use_stride_kernel" not in os.environ:
        import paddle

        paddle.set_flags({"FLAGS_use_stride_kernel": False})
        _applied["FLAGS_use_stride_kernel"] = False
    if _applied:
        logger.info("%s", describe(_applied))
    return _applied


def describe(applied: Dict[str, Any]) -> str:
    """`apply()`'s result as one line for the start-up log."""
    parts = []
    if "MKL_DEBUG_CPU_TYPE" in applied:
        parts.append(f"MKL's AVX2 kernels on this AMD CPU (MKL_DEBUG_CPU_TYPE={applied['MKL_DEBUG_CPU_TYPE']})")
    if "mallopt" in applied:
        parts.append(f"malloc keeps blocks up to {applied['mallopt']['mmap_threshold'] >> 20} MiB in the heap")
    if "FLAGS_use_stride_kernel" in applied:
        parts.append("paddle's stride kernels off")
    return f"CPU tuning: {', '.join(parts)} (PADDLE_GRPO_CPU_TUNING=0 disables it)"
