"""MKL's packed GEMM through ctypes on paddle's own libmklml_intel.so (kernels/gemm.py's "mkl" backend, float32).

W [K, N] is packed once with cblas_sgemm_pack (identifier B, values copied), and each product is
cblas_sgemm_compute(row major, A not transposed, B packed). paddle.matmul calls MKL's cblas_sgemm, which re-packs
the weight at every product: at 8 rows that is most of its time.

One packed copy serves every M. The buffer describes its own layout: the m given to pack only picks MKL's blocking
(packed into one buffer, the bytes for m in 1..4096 took 13 different layouts at one thread, and differ between 1
and 2 threads: read on the Zen 4 host), and compute with another m than the pack's gives the product (checked
against float64 for m = 1..1000 there, and by tests/kernels/test_gemm.py at every run). PACK_M = 32, the decode's
typical rows: a copy packed for m = 1 ran ~2x slower at m >= 8; packed for 8, 32 or 128, the speeds at m = 8..128
were within the run-to-run noise. MKL's documentation asks for the same thread count at pack and compute for the
best speed (not for correctness).

Memory: MKL 2019 asks for ~2x the weight plus ~7.9 MB per packed matrix (cblas_sgemm_pack_get_size; the whole
buffer is written): SmolLM2-135M's 150 decoder matrices take 1.95 GB packed against 0.42 GB of weights, its head
233 MB against 113 MB. The buffer holds pointers into itself, so it is never moved or copied.

MKL picks its code path at its first call from MKL_DEBUG_CPU_TYPE (paddle_grpo/cpu_tuning.py: on AMD CPUs, its
AVX2 or AVX-512 kernels instead of a generic one). kernels/ may not import cpu_tuning (docs/architecture.md), so
`require_tuning()` refuses to make the first MKL call on an AMD CPU where the variable is unset while the tuning
is on: call `cpu_tuning.apply()` first (run_rl.py, policy.causal.load_causal_lm and the test suite do).
"""
from __future__ import annotations

import ctypes as C
import os
import platform
import threading
from typing import Optional, Tuple

import numpy as np

__all__ = ["available", "code_path", "cpu_vendor_flags", "max_threads", "require_tuning", "Weights", "PACK_M"]

ROW_MAJOR, NO_TRANS, TRANS, PACKED, B_MATRIX = 101, 111, 112, 151, 162  # mkl_cblas.h
PACK_M = 32
# mkl_serv_cpu_detect() -> MKL's code path (cpu_tuning.MKL_CODE_PATHS)
CODE_PATHS = {0: "generic", 2: "SSE", 4: "AVX", 5: "AVX2", 6: "AVX-512 (Xeon Phi)", 7: "AVX-512"}

_lib: Optional[C.CDLL] = None
_load_error: Optional[str] = None
_checked = False
_lock = threading.Lock()


def _load() -> C.CDLL:
    global _lib
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is None:
            import paddle  # loads libiomp5, which libmklml_intel.so needs and does not find by itself

            lib = C.CDLL(os.path.join(os.path.dirname(paddle.__file__), "libs", "libmklml_intel.so"))
            i, f, p = C.c_int, C.c_float, C.c_void_p
            lib.cblas_sgemm_pack_get_size.restype = C.c_size_t
            lib.cblas_sgemm_pack_get_size.argtypes = [i, i, i, i]
            lib.cblas_sgemm_pack.argtypes = [i, i, i, i, i, i, f, p, i, p]
            lib.cblas_sgemm_compute.argtypes = [i, i, i, i, i, i, p, i, p, i, f, p, i]
            lib.MKL_Get_Max_Threads.restype = i
            lib.mkl_serv_cpu_detect.restype = i
            _lib = lib
    return _lib


def available() -> Tuple[bool, str]:
    """(True, "") when paddle's libmklml_intel.so loads and exports the packed API, else (False, the reason)."""
    global _load_error
    if _lib is None and _load_error is None:
        try:
            _load()
        except (OSError, AttributeError, ImportError) as e:  # ARM or GPU wheels, paddle without MKL
            _load_error = f"{type(e).__name__}: {e}"
    return _lib is not None, _load_error or ""


def max_threads() -> Optional[int]:
    """MKL's process-wide thread count, which paddle.base.core.set_num_threads sets (None without MKL). Reading it
    does not fix MKL's code path (checked: cpu_tuning.apply() after it still takes effect)."""
    return _lib.MKL_Get_Max_Threads() if _lib is not None or available()[0] else None


def cpu_vendor_flags() -> Tuple[str, set]:
    """(vendor_id, flags) of the first processor in /proc/cpuinfo (empty where there is none)."""
    try:
        with open("/proc/cpuinfo") as f:
            first = f.read(1 << 16).split("\n\n")[0]
    except OSError:
        return "", set()
    fields = dict((k.strip(), v.strip()) for k, v in (line.split(":", 1) for line in first.splitlines() if ":" in line))
    return fields.get("vendor_id", ""), set(fields.get("flags", "").split())


def require_tuning() -> None:
    """Raise unless MKL's first call may happen now: on an AMD CPU with AVX2 (where cpu_tuning.apply() sets
    MKL_DEBUG_CPU_TYPE), the variable must be set, unless PADDLE_GRPO_CPU_TUNING leaves MKL out."""
    global _checked
    if _checked:
        return
    vendor, flags = cpu_vendor_flags()
    choice = os.environ.get("PADDLE_GRPO_CPU_TUNING", "1")
    tuning_on = choice == "1" or "mkl" in choice.split(",")
    if (vendor == "AuthenticAMD" and {"avx2", "fma"} <= flags and platform.machine() in ("x86_64", "AMD64")
            and tuning_on and "MKL_DEBUG_CPU_TYPE" not in os.environ):
        raise RuntimeError("the mkl GEMM backend's first MKL call needs paddle_grpo.cpu_tuning.apply() before it "
                           "(MKL_DEBUG_CPU_TYPE is unset on this AMD CPU: MKL would fix its generic kernels for the "
                           "whole process); call cpu_tuning.apply(), or set PADDLE_GRPO_CPU_TUNING=0 to accept them")
    _checked = True


def code_path() -> str:
    """MKL's code path in this process ('AVX-512', 'AVX2', 'generic', ...), after require_tuning()."""
    require_tuning()
    path = _load().mkl_serv_cpu_detect()
    return CODE_PATHS.get(path, str(path))


class Weights:
    """W [K, N] (or its transpose [N, K] with transposed=True) packed once by MKL; `matmul(x [M, K], out [M, N])`
    writes x @ W into out (float32, C-contiguous, checked by the caller)."""

    precision = "float32"

    def __init__(self, weight: np.ndarray, transposed: bool = False):
        lib = _load()
        require_tuning()
        w = np.ascontiguousarray(weight, dtype=np.float32)
        self.K, self.N = (w.shape[1], w.shape[0]) if transposed else w.shape
        size = int(lib.cblas_sgemm_pack_get_size(B_MATRIX, PACK_M, self.N, self.K))
        self._buf = np.empty(size + 64, dtype=np.uint8)  # never moved: the packed data points into itself
        self._ptr = self._buf.ctypes.data + (-self._buf.ctypes.data) % 64  # aligned as mkl_malloc would
        self.nbytes = size
        lib.cblas_sgemm_pack(ROW_MAJOR, B_MATRIX, TRANS if transposed else NO_TRANS, PACK_M, self.N, self.K, 1.0,
                             w.ctypes.data, w.shape[1], self._ptr)

    def matmul(self, x: np.ndarray, out: np.ndarray) -> None:
        """out [M, N] = x [M, K] @ W."""
        _lib.cblas_sgemm_compute(ROW_MAJOR, NO_TRANS, PACKED, x.shape[0], self.N, self.K, address(x), self.K,
                                 self._ptr, self.N, 0.0, address(out), self.N)


def address(a: np.ndarray) -> int:
    """The data address of a C-contiguous array: through the buffer protocol when writable (0.6 us, against 1.4 us
    for a.ctypes.data: a decode step makes ~150 products)"""
    if a.flags.writeable:
        return C.addressof(C.c_char.from_buffer(a))
    return a.__array_interface__["data"][0]
