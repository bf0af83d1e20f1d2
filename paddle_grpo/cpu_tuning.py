"""Process-level settings that make paddle's CPU kernels several times faster on the project's machines.

Three causes, all measured on the 2-core AMD EPYC hosts (docs/PERFORMANCE.md):

1. paddle's CPU wheel links MKL 2019.0.5 (`libmklml_intel.so`), which on a non-Intel CPU dispatches to a generic
   SSE code path unless `MKL_DEBUG_CPU_TYPE` selects better kernels: 5 the AVX2 ones, 7 the AVX-512 ones, chosen
   when the CPU has the five AVX-512 subsets they use (`mkl_cpu_type`). The variable is honoured by MKL <= 2020.0
   and read at the first MKL call, so it works when set after `import paddle`, but not after a first matmul: `apply()`
   then reports `mkl_too_late` and warns instead of claiming the setting. fp32 GEMM 4096x256 @ 256x704 goes from
   ~17 to ~45-70 GFLOP/s with AVX2 on the AVX2-only EPYC, from ~130 (AVX2) to ~245 (AVX-512) at 1 thread on a
   Zen 5 EPYC. Results differ between the paths only by float rounding (different summation order).
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
by `policy.causal.load_causal_lm` (before any model runs) and by tools/bench/bench.py. It changes no numbers beyond
float rounding.
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


def cpu_fields() -> Dict[str, str]:
    """The first processor's /proc/cpuinfo fields (empty without /proc)."""
    try:
        with open("/proc/cpuinfo") as f:
            text = f.read(1 << 16)
    except OSError:
        return {}
    fields = dict(line.split(":", 1) for line in text.split("\n\n")[0].splitlines() if ":" in line)
    return {k.strip(): v.strip() for k, v in fields.items()}


# The AVX-512 subsets MKL's AVX-512 ("Skylake server") kernels execute; a CPU missing one would fault on them.
MKL_AVX512_FLAGS = frozenset({"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"})


def mkl_cpu_type(vendor: Optional[str], flags: Set[str]) -> Optional[str]:
    """The MKL_DEBUG_CPU_TYPE that selects MKL's fastest kernels for a CPU of `vendor` with /proc/cpuinfo `flags`,
    or None to leave MKL's own choice (Intel CPUs, and AMD CPUs without AVX2, which MKL's SSE path suits): on AMD
    "7" (AVX-512) when the CPU has every subset in MKL_AVX512_FLAGS, else "5" (AVX2). Measured: on a Zen 5 EPYC the
    AVX-512 path made the toy step 1.38x and the real-vocabulary step 1.42x shorter than AVX2 (docs/PERFORMANCE.md,
    "MKL's AVX-512 kernels on AMD")."""
    if vendor != "AuthenticAMD" or not {"avx2", "fma"} <= flags:
        return None
    return "7" if MKL_AVX512_FLAGS <= flags else "5"


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
    fields = cpu_fields()
    cpu_type = mkl_cpu_type(fields.get("vendor_id"), set(fields.get("flags", "").split()))
    if "mkl" in chosen and "MKL_DEBUG_CPU_TYPE" not in os.environ and cpu_type is not None:
        os.environ["MKL_DEBUG_CPU_TYPE"] = cpu_type
        # MKL reads the variable once, at its first call; if a matmul ran before apply(), it keeps the path it chose
        # then (the generic one on AMD: ~4x slower GEMMs). Say so rather than claim the setting took effect.
        path = _mkl_code_path()
        if path is None or str(path) == cpu_type:
            _applied["MKL_DEBUG_CPU_TYPE"] = cpu_type
        else:
            _applied["mkl_too_late"] = MKL_CODE_PATHS.get(path, str(path))
            logger.warning("paddle's MKL chose its %s kernels before cpu_tuning.apply() (a matmul ran first): "
                           "MKL_DEBUG_CPU_TYPE=%s has no effect in this process; apply the CPU tuning before the "
                           "first matmul", _applied["mkl_too_late"], cpu_type)
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


# mkl_serv_cpu_detect() of paddle's MKL 2019: the code path it dispatches to. Values 0, 2, 4 and 5 were read on the
# AVX2-only AMD EPYC, 6 and 7 on a Zen 5 EPYC with AVX-512 (0 by default, N under MKL_DEBUG_CPU_TYPE=N); 2, 4, 5 and
# 7 select MKL's SSE, AVX, AVX2 and AVX-512 kernels (their speed and sums differ, docs/PERFORMANCE.md). 7 is also
# what an Intel CPU with AVX-512 reports by itself.
MKL_CODE_PATHS = {0: "generic", 2: "SSE", 4: "AVX", 5: "AVX2", 6: "AVX-512 (Xeon Phi)", 7: "AVX-512"}


def _cpuinfo() -> Dict[str, Any]:
    """Vendor, model name, family and model numbers (they tell CPU generations apart where the hypervisor hides the
    name: AMD family 25 is Zen 3/4, 26 Zen 5) and the vector-ISA flags that decide which kernels MKL, oneDNN and
    numpy take."""
    fields = cpu_fields()
    if not fields:
        return {}
    flags = set(fields.get("flags", "").split())
    return {"vendor": fields.get("vendor_id"), "model_name": fields.get("model name"),
            "family": fields.get("cpu family"), "model": fields.get("model"),
            "isa": [f for f in ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16")
                    if f in flags]}


def _mkl_code_path() -> Optional[int]:
    """The code path paddle's MKL dispatches to (MKL_CODE_PATHS), or None without paddle's MKL."""
    try:
        import paddle

        lib = ctypes.CDLL(os.path.join(os.path.dirname(paddle.__file__), "libs", "libmklml_intel.so"))
        return int(lib.mkl_serv_cpu_detect())
    except (OSError, AttributeError, ImportError):
        return None


def kernel_report() -> Dict[str, Any]:
    """Which CPU this process runs on and which kernel code paths it gets there: paddle's MKL path, numpy's OpenBLAS
    core and SIMD level, transparent huge pages. Recorded by tools/bench/bench.py so that runs on different machines say
    what differed (docs/PERFORMANCE.md, "Speed by CPU family")."""
    report: Dict[str, Any] = {"cpu": _cpuinfo()}
    path = _mkl_code_path()
    report["mkl_code_path"] = None if path is None else MKL_CODE_PATHS.get(path, str(path))
    try:
        import numpy as np

        features = np.core._multiarray_umath.__cpu_features__
        report["numpy_simd"] = [f for f in ("AVX2", "AVX512F", "AVX512_SKX", "AVX512_SPR") if features.get(f)]
    except (ImportError, AttributeError):
        pass
    try:
        import threadpoolctl

        report["openblas_core"] = [p.get("architecture") for p in threadpoolctl.threadpool_info()
                                   if p.get("internal_api") == "openblas"]
    except ImportError:
        pass
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            report["transparent_hugepages"] = f.read().split("[")[1].split("]")[0]
    except (OSError, IndexError):
        pass
    return report


def describe(applied: Dict[str, Any]) -> str:
    """`apply()`'s result as one line for the start-up log."""
    parts = []
    if "MKL_DEBUG_CPU_TYPE" in applied:
        path = MKL_CODE_PATHS.get(int(applied["MKL_DEBUG_CPU_TYPE"]), applied["MKL_DEBUG_CPU_TYPE"])
        parts.append(f"MKL's {path} kernels on this AMD CPU (MKL_DEBUG_CPU_TYPE={applied['MKL_DEBUG_CPU_TYPE']})")
    if "mkl_too_late" in applied:
        parts.append(f"MKL's {applied['mkl_too_late']} kernels (it was called before the tuning)")
    if "mallopt" in applied:
        parts.append(f"malloc keeps blocks up to {applied['mallopt']['mmap_threshold'] >> 20} MiB in the heap")
    if "FLAGS_use_stride_kernel" in applied:
        parts.append("paddle's stride kernels off")
    return f"CPU tuning: {', '.join(parts)} (PADDLE_GRPO_CPU_TUNING=0 disables it)"
