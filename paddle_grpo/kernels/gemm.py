"""Skinny matrix products for the decode step: x [M, K] @ W [K, N] with few rows (M = 1..128) and W fixed for a
whole rollout, W packed or reordered once.

    p = gemm.pack(w)                          # w [K, N] float32; values copied, w may be reused afterwards
    y = p(x)                                  # x [M, K] float32 C-contiguous, any M, changing between calls
    p(x, out=y)                               # written in place, returned
    head = gemm.pack(embed, transposed=True)  # embed [V, D]: x @ embed^T (the tied LM head)

Backends (`BACKENDS`; each also has the precisions in `SUPPORTS`):
- "mkl": MKL's packed API on paddle's libmklml_intel.so (kernels/mkl.py), float32;
- "onednn": oneDNN's matmul primitive on paddle's libdnnl.so.3 (kernels/onednn.py): float32 and bfloat16 (bf16
  weights and activations, f32 accumulation and output). Its weight-only int8 (kernels/onednn.py) is not offered:
  on the measured CPU it was slower than bf16 at 8-32 rows and 3x less accurate (docs/PERFORMANCE.md);
- "numpy": np.matmul (numpy's OpenBLAS), always there; its "bfloat16" rounds weights and activations to bf16
  (nearest even) and multiplies in float32: the same rounding of the inputs as oneDNN's, at float32 speed;
- "paddle": paddle.matmul, the reference (what the decode did before).

Which backend: `pack(..., backend=...)`, else `PADDLE_GRPO_GEMM` (a backend name), else `best_backend(precision)`:
the row of `TABLE` for this CPU's family (vendor and ISA level, `cpu_family()`), or where the table has no row,
the first available backend in `DEFAULT_ORDER`. Only the rows in `MEASURED` were measured (tools/bench/bench_gemm.py,
docs/PERFORMANCE.md "Skinny matrix products"); the choice never times anything at run time, so a run resumes with
the same kernels and the same rounding. `describe()` is the start-up log's line.

Results: float32 backends differ from each other by float rounding (other summation orders); one backend gives
bit-identical results for the same inputs within a process (same thread count).
Threads: MKL and oneDNN follow paddle.base.core.set_num_threads (oneDNN made to in every calling thread, see
kernels/onednn.py); numpy's OpenBLAS keeps its own pool (OPENBLAS_NUM_THREADS / OMP_NUM_THREADS at start-up).
ctypes releases the GIL during the MKL and oneDNN calls.
"""
from __future__ import annotations

import os
import platform
from typing import Dict, Iterable, Optional, Protocol, Tuple

import numpy as np

from . import mkl, onednn

__all__ = ["BACKENDS", "PRECISIONS", "SUPPORTS", "TABLE", "MEASURED", "DEFAULT_ORDER", "Packed", "pack",
           "available", "best_backend", "choose", "cpu_family", "describe"]

BACKENDS = ("mkl", "onednn", "numpy", "paddle")
PRECISIONS = ("float32", "bfloat16")
SUPPORTS = {"mkl": ("float32",), "onednn": PRECISIONS, "numpy": PRECISIONS, "paddle": ("float32",)}
ENV = "PADDLE_GRPO_GEMM"

# CPU family -> precision -> backend, from tools/bench/bench_gemm.py's output at the decode shapes (M = 32 weighs
# most: the decode's typical rows). Families without a row fall back to DEFAULT_ORDER.
TABLE: Dict[str, Dict[str, str]] = {
    # GFLOP/s of the decoder products at M = 1 / 8 / 32 rows, one thread (two threads: M = 8 / 32):
    # mkl 10-16 / 65-87 / 94-100 (112-123 / 183), onednn 6-7 / 50-58 / 95-97 (86-95 / 171); bf16 onednn
    # 14-15 / 102-111 / 176-180 (147-157 / 280-313), numpy's emulation 8-10 / 16-19 / 47-49.
    # float32 takes oneDNN although MKL is faster at 1-8 rows: MKL's packed copy is ~4.6x the weights (1.95 GB for
    # SmolLM2-135M's decoder against 0.42 GB reordered by oneDNN, kept by the allocator after the rollout) and took
    # 1.08 s to pack against 0.32 s; at the rollout's 32 rows the two decode SmolLM2 equally fast (112 and 111
    # ms a step, one core).
    "amd-avx512": {"float32": "onednn", "bfloat16": "onednn"},
}
MEASURED = {"amd-avx512": "AMD EPYC Zen 4 (family 25 model 17, AVX512-BF16), 2 cores, 2026-12-07"}
# Where no row was measured: oneDNN before MKL's packed API for float32 (the memory above), oneDNN for bf16 (numpy's
# bf16 only emulates the rounding, at float32 speed).
DEFAULT_ORDER = {"float32": ("onednn", "mkl", "numpy"), "bfloat16": ("onednn", "numpy")}


def cpu_family(vendor: Optional[str] = None, flags: Optional[Iterable[str]] = None) -> str:
    """'amd-avx512', 'intel-amx', 'intel-avx2', ... or 'other': the vendor and the widest vector ISA of the CPU
    (/proc/cpuinfo's vendor_id and flags unless given), the key of TABLE."""
    if vendor is None or flags is None:
        vendor, flags = mkl.cpu_vendor_flags()
    flags = set(flags)
    name = {"AuthenticAMD": "amd", "GenuineIntel": "intel"}.get(vendor)
    if name is None:
        return "other"
    if {"amx_tile", "amx_bf16"} <= flags:
        return f"{name}-amx"
    if {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags:
        return f"{name}-avx512"
    if {"avx2", "fma"} <= flags:
        return f"{name}-avx2"
    return "other"


_support_cache: Dict[Tuple[str, str], Tuple[bool, str]] = {}


def available(backend: str, precision: str = "float32") -> Tuple[bool, str]:
    """(True, "") when `backend` can multiply in `precision` on this machine, else (False, why). oneDNN's reduced
    precisions count only where it has a real kernel for them (not its reference one, ~100x slower)."""
    key = (backend, precision)
    if key in _support_cache:
        return _support_cache[key]
    if backend not in BACKENDS:
        raise ValueError(f"unknown GEMM backend {backend!r}: one of {', '.join(BACKENDS)}")
    if precision not in PRECISIONS:
        raise ValueError(f"unknown GEMM precision {precision!r}: one of {', '.join(PRECISIONS)}")
    if precision not in SUPPORTS[backend]:
        result = (False, f"{backend} has no {precision} (it has {', '.join(SUPPORTS[backend])})")
    elif backend == "mkl":
        ok, why = mkl.available()
        result = (ok and platform.machine() in ("x86_64", "AMD64"), why or "not an x86 CPU")
    elif backend == "onednn":
        result = onednn.supports(precision)
    else:
        result = (True, "")
    _support_cache[key] = result
    return result


def best_backend(precision: str = "float32", cpu: Optional[str] = None) -> str:
    """The backend for `precision` on a CPU of family `cpu` (this one's by default): TABLE's choice if available
    here, else the first available one in DEFAULT_ORDER. Deterministic: no timing."""
    if precision not in PRECISIONS:
        raise ValueError(f"unknown GEMM precision {precision!r}: one of {', '.join(PRECISIONS)}")
    row = TABLE.get(cpu or cpu_family(), {})
    for name in ((row[precision],) if precision in row else ()) + DEFAULT_ORDER[precision]:
        if available(name, precision)[0]:
            return name
    raise ValueError(f"no GEMM backend has {precision} on this machine: "
                     + "; ".join(f"{n}: {available(n, precision)[1]}" for n in DEFAULT_ORDER[precision]))


def choose(precision: str = "float32", backend: Optional[str] = None) -> str:
    """`backend` if given, else PADDLE_GRPO_GEMM if set, else best_backend(precision); checked to exist and to
    have `precision` here."""
    name = backend or os.environ.get(ENV) or best_backend(precision)
    if name not in BACKENDS:
        source = "backend" if backend else ENV
        raise ValueError(f"unknown GEMM backend {name!r} ({source}): one of {', '.join(BACKENDS)}")
    ok, why = available(name, precision)
    if not ok:
        raise ValueError(f"GEMM backend {name!r} cannot multiply in {precision} here: {why}")
    return name


def _round_bf16(a: np.ndarray) -> np.ndarray:
    """float32 -> the nearest bfloat16 (ties to even), kept as float32 (finite inputs)."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    return ((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)).view(np.float32)


class _NumpyWeights:
    """np.matmul on a float32 copy of W [K, N] (rounded to bf16 values for "bfloat16")."""

    def __init__(self, weight: np.ndarray, precision: str, transposed: bool):
        w = np.array(weight.T if transposed else weight, dtype=np.float32, order="C")  # a copy, [K, N]
        self.w = _round_bf16(w) if precision == "bfloat16" else w
        self.bf16 = precision == "bfloat16"
        self.nbytes = self.w.nbytes

    def matmul(self, x: np.ndarray, out: np.ndarray) -> None:
        np.matmul(_round_bf16(x) if self.bf16 else x, self.w, out=out)


class _PaddleWeights:
    """paddle.matmul on a copy of W [K, N] as a paddle tensor (what the decode ran before: the reference)."""

    def __init__(self, weight: np.ndarray, transposed: bool):
        import paddle

        self.w = paddle.to_tensor(np.ascontiguousarray(weight.T if transposed else weight, dtype=np.float32))
        self.nbytes = int(np.prod(self.w.shape)) * 4

    def matmul(self, x: np.ndarray, out: np.ndarray) -> None:
        import paddle

        from .numpy_kernels import writable_view

        y = paddle.matmul(paddle.to_tensor(x), self.w)
        np.copyto(out, writable_view(y))  # the view is valid while y lives


class Weights(Protocol):
    """What a backend packs: `matmul(x, out)` writes x [M, K] @ W into out [M, N] (checked by Packed, M >= 1)."""

    nbytes: int

    def matmul(self, x: np.ndarray, out: np.ndarray) -> None:
        ...


class Packed:
    """A weight packed for one backend and precision: `packed(x [M, K] float32, out=None) -> [M, N] float32`.

    Attributes: backend, precision, K, N, transposed (the weight came as [N, K]), nbytes (the packed copy's memory).
    One Packed may be called from several threads at once (oneDNN's primitives and buffers are per thread).
    """

    def __init__(self, impl: Weights, backend: str, precision: str, K: int, N: int, transposed: bool):
        self._impl, self.backend, self.precision = impl, backend, precision
        self.K, self.N, self.transposed = K, N, transposed
        self.nbytes = int(impl.nbytes)

    def __call__(self, x: np.ndarray, out: Optional[np.ndarray] = None) -> np.ndarray:
        """x [M, K] float32 C-contiguous -> x @ W [M, N] float32 (into `out`, float32 C-contiguous, when given; it
        must not overlap x)."""
        if (type(x) is not np.ndarray or x.dtype != np.float32 or x.ndim != 2 or x.shape[1] != self.K
                or not x.flags.c_contiguous):
            raise ValueError(f"x must be a C-contiguous float32 [M, {self.K}] numpy array for this [{self.K}, "
                             f"{self.N}] weight, got {_what(x)}")
        M = x.shape[0]
        if out is None:
            out = np.empty((M, self.N), dtype=np.float32)
        elif (type(out) is not np.ndarray or out.dtype != np.float32 or out.shape != (M, self.N)
              or not out.flags.c_contiguous or not out.flags.writeable):
            raise ValueError(f"out must be a writable C-contiguous float32 [{M}, {self.N}] numpy array, "
                             f"got {_what(out)}")
        if M:
            self._impl.matmul(x, out)
        return out

    def __repr__(self) -> str:
        t = ", transposed" if self.transposed else ""
        return f"Packed({self.backend}, {self.precision}, [{self.K}, {self.N}]{t}, {self.nbytes / 2**20:.1f} MiB)"


def _what(a) -> str:
    if not isinstance(a, np.ndarray):
        return type(a).__name__
    layout = "C-contiguous" if a.flags.c_contiguous else "not C-contiguous"
    return f"{a.dtype} {list(a.shape)} ({layout})"


def pack(weight: np.ndarray, precision: str = "float32", backend: Optional[str] = None, *,
         transposed: bool = False) -> Packed:
    """Pack `weight` [K, N] float32 (or [N, K] with transposed=True: x @ weight^T, the LM head over the [V, D]
    embedding) once for `backend` (choose()'s default) in `precision`. The values are copied."""
    if not isinstance(weight, np.ndarray) or weight.ndim != 2 or weight.dtype != np.float32:
        raise ValueError(f"weight must be a 2-D float32 numpy array, got {_what(weight)}")
    name = choose(precision, backend)
    K, N = (weight.shape[1], weight.shape[0]) if transposed else weight.shape
    if name == "mkl":
        impl = mkl.Weights(weight, transposed)
    elif name == "onednn":
        impl = onednn.Weights(weight, precision, transposed)
    elif name == "numpy":
        impl = _NumpyWeights(weight, precision, transposed)
    else:
        impl = _PaddleWeights(weight, transposed)
    return Packed(impl, name, precision, int(K), int(N), bool(transposed))


def describe(precision: str = "float32", backend: Optional[str] = None) -> str:
    """One line for the start-up log: the backend choose() takes for `precision`, the kernels / ISA it got, and
    why it was chosen, e.g. 'GEMM: mkl float32 (MKL AVX-512 path) on amd-avx512 (measured table row)'."""
    name = choose(precision, backend)
    if name == "mkl":
        kernels = f"MKL {mkl.code_path()} path"
    elif name == "onednn":
        kernels = onednn.describe(precision)
    elif name == "numpy":
        kernels = f"numpy {np.__version__} OpenBLAS {_openblas_core()}"
    else:
        kernels = f"paddle.matmul, MKL {mkl.code_path()} path" if mkl.available()[0] else "paddle.matmul"
    family = cpu_family()
    row = TABLE.get(family, {})
    if backend:
        why = "asked for"
    elif os.environ.get(ENV):
        why = f"{ENV}={os.environ[ENV]}"
    elif row.get(precision) == name:
        why = "measured table row" if family in MEASURED else "table row"
    elif precision in row:
        why = f"the table's {row[precision]} is not available here: default order"
    else:
        why = f"default order: no measured row for {family}"
    return f"GEMM: {name} {precision} ({kernels}) on {family} ({why})"


def _openblas_core() -> str:
    try:
        import threadpoolctl

        cores = [p.get("architecture") for p in threadpoolctl.threadpool_info() if p.get("internal_api") == "openblas"]
        return ",".join(str(c) for c in cores) or "?"
    except ImportError:
        return "?"
