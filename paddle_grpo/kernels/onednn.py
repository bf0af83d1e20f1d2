"""oneDNN's matmul primitive through ctypes on paddle's own libdnnl.so.3 (kernels/gemm.py's "onednn" backend).

x [M, K] float32 @ W [K, N] -> [M, N] float32, W reordered once into the layout the primitive prefers (its weights
descriptor asked with format "any": blocked for the brgemm kernels) and kept as a copy owned by oneDNN.

Precisions (the weights' storage; accumulation is float32 in every case):
- "float32": f32 activations and weights;
- "bfloat16": weights rounded to bf16 once, activations rounded to bf16 at each call by a oneDNN reorder (both round
  to nearest even), f32 output. oneDNN 3.6 has no f32-activation x bf16-weight matmul (`unimplemented`), hence the
  activation's reorder;
- "weight_only_int8" (PaddleNLP's rollout_quant_type value): s8 weights, one float32 scale per output column
  (max |W[:, n]| / 127, symmetric, round to nearest even), decompressed by oneDNN inside the matmul
  (fpmath mode bf16 applied to integer weights), activations rounded to bf16 as above. With f32 activations oneDNN
  3.6 falls back to its reference kernel (`ref:any`), so they are bf16 here too. Measured, not offered by
  kernels/gemm.py: on the Zen 4 host it ran below bf16 from 8 rows up, with 1 and 2 threads (one thread, 8 / 32
  rows: 80-85 / 155-161 against 102-111 / 176-180 GFLOP/s), equal at 1 row, with ~3x bf16's error (relative
  7.6e-3 against 2.3e-3 on N(0, 0.05^2) weights; docs/PERFORMANCE.md, "Skinny matrix products").

One primitive per (M, K, N, precision) and thread, cached: oneDNN's weights layout does not depend on M (one layout
for M = 1..128 at each decode shape and precision, and for M up to 8192 at other shapes, on the Zen 4 host); where
it does (another CPU or kernel), the weights are reordered once more for that layout and kept (`Weights._for`).
Primitives and streams are per thread (executing one primitive with the library's scratchpad is thread-safe, a
memory object whose data handle each call sets is not).

Threads: paddle's libdnnl.so.3 runs on the OpenMP runtime paddle loads (libiomp5, checked with LD_DEBUG=bindings),
whose thread count is per calling thread: `paddle.base.core.set_num_threads(n)` sets it for the thread that calls
it (and MKL's, process-wide), but another thread keeps the process's initial count (OMP_NUM_THREADS). Each call
therefore sets the calling thread's OpenMP count to `mkl.max_threads()` (MKL's process-wide count, the one paddle
sets) when it differs from the count it last set there. `workers_sleep_between_products()` makes the OpenMP threads
sleep after each product instead of spinning, for a block where other Python threads want the cores.
"""
from __future__ import annotations

import contextlib
import ctypes as C
import os
import threading
from typing import Dict, Iterator, Optional, Tuple

import numpy as np

from . import mkl

__all__ = ["available", "describe", "supports", "version", "Weights", "PRECISIONS"]

PRECISIONS = ("float32", "bfloat16", "weight_only_int8")

# oneDNN 3.x C API constants (include/oneapi/dnnl/dnnl_types.h); stable across 3.x, and the dt / format values
# are checked at load against dnnl_dt2str / dnnl_fmt_tag2str of the library itself (`_check_constants`).
F32, BF16, S8 = 3, 2, 5
FORMAT_ANY = 1
ENGINE_CPU = 1
STREAM_DEFAULT = 1
QUERY_IMPL_INFO_STR, QUERY_WEIGHTS_MD = 8, 131
ARG_SRC, ARG_DST, ARG_WEIGHTS, ARG_ATTR_SCALES = 1, 17, 33, 4096
FPMATH_BF16 = 1
MEMORY_ALLOCATE = C.c_void_p(-1 & (2 ** 64 - 1))  # DNNL_MEMORY_ALLOCATE: ((void *)(size_t)-1)

_P, _PP = C.c_void_p, C.POINTER(C.c_void_p)
_Dims = C.c_int64 * 12


class _Arg(C.Structure):
    _fields_ = [("arg", C.c_int), ("memory", C.c_void_p)]


_lib: Optional[C.CDLL] = None
_omp: Optional[C.CDLL] = None
_engine = _P()
_local = threading.local()
_load_lock = threading.Lock()
_load_error: Optional[str] = None


def _paddle_libs() -> str:
    import paddle

    return os.path.join(os.path.dirname(paddle.__file__), "libs")


def _load() -> C.CDLL:
    """paddle's libdnnl.so.3 with the prototypes used here, and one CPU engine (once per process)."""
    global _lib, _omp
    if _lib is not None:
        return _lib
    with _load_lock:
        if _lib is not None:
            return _lib
        lib = C.CDLL(os.path.join(_paddle_libs(), "libdnnl.so.3"))
        for name, res, args in (
                ("dnnl_status2str", C.c_char_p, [C.c_int]), ("dnnl_dt2str", C.c_char_p, [C.c_int]),
                ("dnnl_fmt_tag2str", C.c_char_p, [C.c_int]), ("dnnl_cpu_isa2str", C.c_char_p, [C.c_int]),
                ("dnnl_engine_create", C.c_int, [_PP, C.c_int, C.c_size_t]),
                ("dnnl_stream_create", C.c_int, [_PP, _P, C.c_uint]),
                ("dnnl_memory_desc_create_with_strides", C.c_int, [_PP, C.c_int, _Dims, C.c_int, _Dims]),
                ("dnnl_memory_desc_create_with_tag", C.c_int, [_PP, C.c_int, _Dims, C.c_int, C.c_int]),
                ("dnnl_memory_desc_get_size", C.c_size_t, [_P]),
                ("dnnl_memory_desc_get_blob", C.c_int, [_P, C.POINTER(C.c_size_t), _P]),
                ("dnnl_memory_desc_destroy", C.c_int, [_P]),
                ("dnnl_memory_desc_clone", C.c_int, [_PP, _P]),
                ("dnnl_primitive_attr_create", C.c_int, [_PP]),
                ("dnnl_primitive_attr_destroy", C.c_int, [_P]),
                ("dnnl_primitive_attr_set_fpmath_mode_v2", C.c_int, [_P, C.c_int, C.c_int]),
                ("dnnl_primitive_attr_set_scales", C.c_int, [_P, C.c_int, C.c_int, C.c_int, _Dims, C.c_int]),
                ("dnnl_matmul_primitive_desc_create", C.c_int, [_PP, _P, _P, _P, _P, _P, _P]),
                ("dnnl_reorder_primitive_desc_create", C.c_int, [_PP, _P, _P, _P, _P, _P]),
                ("dnnl_primitive_desc_query", C.c_int, [_P, C.c_int, C.c_int, _P]),
                ("dnnl_primitive_desc_query_md", _P, [_P, C.c_int, C.c_int]),
                ("dnnl_primitive_desc_destroy", C.c_int, [_P]),
                ("dnnl_primitive_create", C.c_int, [_PP, _P]),
                ("dnnl_primitive_destroy", C.c_int, [_P]),
                ("dnnl_memory_create", C.c_int, [_PP, _P, _P, _P]),
                ("dnnl_memory_destroy", C.c_int, [_P]),
                ("dnnl_memory_set_data_handle", C.c_int, [_P, _P]),
                ("dnnl_memory_get_data_handle", C.c_int, [_P, _PP]),
                ("dnnl_primitive_execute", C.c_int, [_P, _P, C.c_int, C.POINTER(_Arg)]),
                ("dnnl_stream_wait", C.c_int, [_P]),
                ("dnnl_get_effective_cpu_isa", C.c_int, [])):
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = res, args
        _check_constants(lib)
        _ok(lib, lib.dnnl_engine_create(C.byref(_engine), ENGINE_CPU, 0), "dnnl_engine_create")
        _omp = C.CDLL(os.path.join(_paddle_libs(), "libiomp5.so"))
        _lib = lib
    return lib


def _check_constants(lib: C.CDLL) -> None:
    """The enum values above against the library's own names (a wrong constant would build a wrong product)."""
    got = (lib.dnnl_dt2str(F32), lib.dnnl_dt2str(BF16), lib.dnnl_dt2str(S8), lib.dnnl_fmt_tag2str(FORMAT_ANY))
    if got != (b"f32", b"bf16", b"s8", b"any"):
        raise OSError(f"libdnnl.so.3 enum values differ from oneDNN 3.x's: {got}")


def _ok(lib: C.CDLL, status: int, what: str) -> None:
    if status != 0:
        raise RuntimeError(f"oneDNN {what}: {lib.dnnl_status2str(status).decode()}")


def available() -> Tuple[bool, str]:
    """(True, "") when paddle's libdnnl.so.3 loads and has the matmul C API, else (False, the reason)."""
    global _load_error
    if _lib is None and _load_error is None:
        try:
            _load()
        except (OSError, AttributeError, ImportError, RuntimeError) as e:
            _load_error = f"{type(e).__name__}: {e}"
    return _lib is not None, _load_error or ""


class _Version(C.Structure):
    _fields_ = [("major", C.c_int), ("minor", C.c_int), ("patch", C.c_int), ("hash", C.c_char_p),
                ("cpu_runtime", C.c_uint), ("gpu_runtime", C.c_uint)]


def version() -> str:
    """oneDNN's version, e.g. '3.6.2'."""
    lib = _load()
    lib.dnnl_version.restype = C.POINTER(_Version)
    v = lib.dnnl_version().contents
    return f"{v.major}.{v.minor}.{v.patch}"


def _md(shape: Tuple[int, ...], dt: int, strides: Optional[Tuple[int, ...]] = None) -> C.c_void_p:
    """A memory descriptor: plain with `strides`, or format "any" without."""
    lib, md = _load(), _P()
    if strides is None:
        _ok(lib, lib.dnnl_memory_desc_create_with_tag(C.byref(md), len(shape), _Dims(*shape), dt, FORMAT_ANY), "md")
    else:
        _ok(lib, lib.dnnl_memory_desc_create_with_strides(C.byref(md), len(shape), _Dims(*shape), dt,
                                                          _Dims(*strides)), "md")
    return md


def _blob(md: C.c_void_p) -> bytes:
    """A memory descriptor's serialised form: equal blobs, equal layouts (a dict key)."""
    lib, size = _load(), C.c_size_t(0)
    _ok(lib, lib.dnnl_memory_desc_get_blob(None, C.byref(size), md), "md blob size")
    buf = (C.c_uint8 * size.value)()
    _ok(lib, lib.dnnl_memory_desc_get_blob(buf, C.byref(size), md), "md blob")
    return bytes(buf)


def _memory(md: C.c_void_p, handle=MEMORY_ALLOCATE) -> C.c_void_p:
    lib, mem = _load(), _P()
    _ok(lib, lib.dnnl_memory_create(C.byref(mem), md, _engine, handle), "memory")
    return mem


def _reorder(src_md: C.c_void_p, dst_md: C.c_void_p) -> Tuple[C.c_void_p, C.c_void_p]:
    """(primitive, its descriptor) that copies src_md's layout and type into dst_md's (round to nearest even)."""
    lib, pd, prim = _load(), _P(), _P()
    _ok(lib, lib.dnnl_reorder_primitive_desc_create(C.byref(pd), src_md, _engine, dst_md, _engine, None), "reorder")
    _ok(lib, lib.dnnl_primitive_create(C.byref(prim), pd), "reorder primitive")
    return prim, pd


def _stream() -> C.c_void_p:
    s = getattr(_local, "stream", None)
    if s is None:
        lib, s = _load(), _P()
        _ok(lib, lib.dnnl_stream_create(C.byref(s), _engine, STREAM_DEFAULT), "stream")
        _local.stream, _local.prims, _local.omp_threads = s, {}, None
    return s


def _run(prim: C.c_void_p, args) -> None:
    lib = _lib
    _ok(lib, lib.dnnl_primitive_execute(prim, _stream(), len(args), args), "execute")
    _ok(lib, lib.dnnl_stream_wait(_local.stream), "stream wait")


def _attr(precision: str) -> Optional[C.c_void_p]:
    if precision != "weight_only_int8":
        return None
    lib, attr = _load(), _P()
    _ok(lib, lib.dnnl_primitive_attr_create(C.byref(attr)), "attr")
    # Integer weights decompressed to bf16 inside the kernel; one f32 scale per output column (mask over dim 1 = N).
    _ok(lib, lib.dnnl_primitive_attr_set_fpmath_mode_v2(attr, FPMATH_BF16, 1), "fpmath mode")
    _ok(lib, lib.dnnl_primitive_attr_set_scales(attr, ARG_WEIGHTS, 1 << 1, 0, _Dims(), F32), "weight scales")
    return attr


def _type(precision: str) -> int:
    return {"float32": F32, "bfloat16": BF16, "weight_only_int8": S8}[precision]


class _Prim:
    """One matmul primitive for (M, K, N, precision) in one thread, with its src / dst memory objects and argument
    array (data handles set per call) and, for bf16 activations, the f32 -> bf16 reorder and its buffer."""

    def __init__(self, M: int, K: int, N: int, precision: str):
        lib = _load()
        self._own = []  # (destroy function, handle), destroyed in reverse order with the primitive
        src_dt = F32 if precision == "float32" else BF16
        src, dst, weights = _md((M, K), src_dt, (K, 1)), _md((M, N), F32, (N, 1)), _md((K, N), _type(precision))
        f32_src = _md((M, K), F32, (K, 1))
        mds = [(lib.dnnl_memory_desc_destroy, md) for md in (src, dst, weights, f32_src)]
        attr = _attr(precision)
        try:
            self.pd = self._keep(lib.dnnl_primitive_desc_destroy, _P())
            _ok(lib, lib.dnnl_matmul_primitive_desc_create(C.byref(self.pd), _engine, src, weights, None, dst, attr),
                f"matmul {precision} [{M}, {K}] x [{K}, {N}]")
            self.prim = self._keep(lib.dnnl_primitive_destroy, _P())
            _ok(lib, lib.dnnl_primitive_create(C.byref(self.prim), self.pd), "matmul primitive")
            info = C.c_char_p()
            _ok(lib, lib.dnnl_primitive_desc_query(self.pd, QUERY_IMPL_INFO_STR, 0, C.byref(info)), "impl info")
            self.impl = info.value.decode()
            self.weights_md = lib.dnnl_primitive_desc_query_md(self.pd, QUERY_WEIGHTS_MD, 0)  # owned by pd
            self.weights_key = _blob(self.weights_md)
            self.dst = self._keep(lib.dnnl_memory_destroy, _memory(dst, None))
            self.src = self._keep(lib.dnnl_memory_destroy, _memory(f32_src, None))  # x, as the caller gives it
            self.cvt = None
            matmul_src = self.src
            if src_dt == BF16:  # a reorder rounds x into a bf16 buffer that the matmul reads
                matmul_src = self._keep(lib.dnnl_memory_destroy, _memory(src))
                self.cvt, cvt_pd = _reorder(f32_src, src)
                self._keep(lib.dnnl_primitive_desc_destroy, cvt_pd)
                self._keep(lib.dnnl_primitive_destroy, self.cvt)
                self.cvt_args = (_Arg * 2)(_Arg(ARG_SRC, self.src), _Arg(ARG_DST, matmul_src))
            scales = [_Arg(ARG_ATTR_SCALES | ARG_WEIGHTS, None)] if precision == "weight_only_int8" else []
            self.args = (_Arg * (3 + len(scales)))(_Arg(ARG_SRC, matmul_src), _Arg(ARG_WEIGHTS, None),
                                                   _Arg(ARG_DST, self.dst), *scales)
        finally:  # descriptors and attributes are copied by what was made from them
            for destroy, handle in mds + ([(lib.dnnl_primitive_attr_destroy, attr)] if attr is not None else []):
                destroy(handle)

    def _keep(self, destroy, handle: C.c_void_p) -> C.c_void_p:
        self._own.append((destroy, handle))
        return handle

    def __del__(self):  # the thread that made it ended (its thread-local cache went away)
        for destroy, handle in reversed(getattr(self, "_own", ())):
            if handle:
                destroy(handle)


def _prim(M: int, K: int, N: int, precision: str) -> _Prim:
    _stream()
    key = (M, K, N, precision)
    p = _local.prims.get(key)
    if p is None:
        p = _local.prims[key] = _Prim(M, K, N, precision)
    return p


class Weights:
    """W [K, N] (or its transpose [N, K] given with transposed=True) reordered once for oneDNN's matmul in
    `precision`; `matmul(x [M, K] float32, out [M, N] float32)` writes x @ W into out."""

    def __init__(self, weight: np.ndarray, precision: str, transposed: bool = False):
        lib = _load()
        if precision not in PRECISIONS:
            raise ValueError(f"oneDNN precisions are {PRECISIONS}, not {precision!r}")
        self.precision = precision
        w = np.ascontiguousarray(weight, dtype=np.float32)
        self.K, self.N = (w.shape[1], w.shape[0]) if transposed else w.shape
        K, N = self.K, self.N
        self.scales = None
        self._mems, self.nbytes = [], 0
        src_dt, src_w = F32, w
        if precision == "weight_only_int8":
            # per output column n (a row of the transposed layout): s = max|W[:, n]| / 127, q = rint(W / s)
            amax = np.abs(w).max(axis=1 if transposed else 0)
            scale = np.where(amax > 0, amax / np.float32(127.0), np.float32(1.0)).astype(np.float32)
            q = np.rint(w / (scale[:, None] if transposed else scale[None, :]))
            src_w, src_dt = np.clip(q, -127, 127).astype(np.int8), S8
            self.scales = scale
            scale_md = _md((N,), F32, (1,))
            self._scale_mem = _memory(scale_md, None)
            lib.dnnl_memory_desc_destroy(scale_md)
            _ok(lib, lib.dnnl_memory_set_data_handle(self._scale_mem, scale.ctypes.data), "scales handle")
        ref = _prim(32, K, N, precision)  # the layout the decode's typical 32 rows prefer (the same for 1..128)
        self.impl = ref.impl
        user_md = _md((K, N), src_dt, (1, K) if transposed else (N, 1))
        user = _memory(user_md, None)
        _ok(lib, lib.dnnl_memory_set_data_handle(user, src_w.ctypes.data), "weights handle")
        self._for: Dict[bytes, C.c_void_p] = {}
        self._first = (user_md, user)  # the source of the first reorder; then the first packed copy
        try:
            self._weights_for(ref)
        finally:
            del self._first
            lib.dnnl_memory_destroy(user), lib.dnnl_memory_desc_destroy(user_md)
        first_md = _P()
        _ok(lib, lib.dnnl_memory_desc_clone(C.byref(first_md), ref.weights_md), "md clone")
        self._first = (first_md, self._for[ref.weights_key])
        self.nbytes += 0 if self.scales is None else 4 * N

    def _weights_for(self, p: _Prim) -> C.c_void_p:
        """The weights in the layout of primitive p, reordered from the first copy if p prefers another one."""
        mem = self._for.get(p.weights_key)
        if mem is None:
            mem = _memory(p.weights_md)
            cvt, pd = _reorder(self._first[0], p.weights_md)
            _run(cvt, (_Arg * 2)(_Arg(ARG_SRC, self._first[1]), _Arg(ARG_DST, mem)))
            _lib.dnnl_primitive_destroy(cvt), _lib.dnnl_primitive_desc_destroy(pd)
            self._for[p.weights_key] = mem
            self._mems.append(mem)
            self.nbytes += int(_lib.dnnl_memory_desc_get_size(p.weights_md))
        return mem

    def matmul(self, x: np.ndarray, out: np.ndarray) -> None:
        """out [M, N] = x [M, K] @ W (both float32 C-contiguous, checked by the caller)."""
        lib, local = _lib, _local
        p = _prim(x.shape[0], self.K, self.N, self.precision)
        want = mkl.max_threads()
        if want is not None and want != local.omp_threads:
            _omp.omp_set_num_threads(want)  # this thread's OpenMP count: see the module's docstring
            local.omp_threads = want
        lib.dnnl_memory_set_data_handle(p.src, mkl.address(x))
        lib.dnnl_memory_set_data_handle(p.dst, mkl.address(out))
        p.args[1].memory = self._for.get(p.weights_key) or self._weights_for(p)
        if self.scales is not None:
            p.args[3].memory = self._scale_mem
        stream = local.stream
        if p.cvt is not None:
            _ok(lib, lib.dnnl_primitive_execute(p.cvt, stream, 2, p.cvt_args), "execute reorder")
        _ok(lib, lib.dnnl_primitive_execute(p.prim, stream, len(p.args), p.args), "execute matmul")
        _ok(lib, lib.dnnl_stream_wait(stream), "stream wait")

    def __del__(self):
        if _lib is not None:
            for mem in getattr(self, "_mems", ()):
                _lib.dnnl_memory_destroy(mem)
            if getattr(self, "scales", None) is not None:
                _lib.dnnl_memory_destroy(self._scale_mem)
            if hasattr(self, "_first"):
                _lib.dnnl_memory_desc_destroy(self._first[0])


@contextlib.contextmanager
def workers_sleep_between_products() -> Iterator[Optional[int]]:
    """Within the block, the OpenMP threads of the products this thread starts sleep as soon as a product ends
    (`kmp_set_blocktime(0)` of paddle's libiomp5, this thread's setting; restored after the block). By default
    (KMP_BLOCKTIME 200 ms) they spin between products, on the cores where the decode step's attention and sampling
    split their numpy work between Python threads: measured on two Zen 4 cores, the attention of 256 decode steps
    of 100 GSM8K prompts, split in two, took 32-38 s with spinning threads, 24-25 s without, and 34-35 s unsplit
    (docs/PERFORMANCE.md, "Generation"). Yields the previous blocktime (ms), or None where oneDNN did not load
    (nothing is changed then)."""
    if _omp is None and not available()[0]:
        yield None
        return
    previous = _omp.kmp_get_blocktime()
    _omp.kmp_set_blocktime(0)
    try:
        yield previous
    finally:
        _omp.kmp_set_blocktime(previous)


def isa() -> str:
    """The instruction set oneDNN's kernels use here, e.g. 'avx512_core_bf16' (ONEDNN_MAX_CPU_ISA may lower it)."""
    lib = _load()
    return lib.dnnl_cpu_isa2str(lib.dnnl_get_effective_cpu_isa()).decode().replace("cpu_isa_", "")


def supports(precision: str) -> Tuple[bool, str]:
    """(True, "") when oneDNN has a real kernel for `precision` on this CPU, else (False, why): not its reference
    kernel (~100x slower), and for bf16 / int8 an ISA with bf16 instructions (AVX512-BF16, AMX, AVX2-VNNI-2).
    Without them oneDNN 3.6 emulates bf16 (gemm:jit:bf16): 33 GFLOP/s at 32 rows against its float32's 94 and
    numpy's bf16 emulation's 45 (one thread, ONEDNN_MAX_CPU_ISA=AVX512_CORE on the Zen 4 host)."""
    ok, why = available()
    if not ok:
        return ok, why
    try:
        impl = describe(precision)
    except RuntimeError as e:  # unimplemented on this CPU
        return False, str(e)
    if impl.split()[-1].startswith("ref"):
        return False, f"{impl}: oneDNN's reference kernel only on this CPU"
    if precision != "float32" and not any(t in isa() for t in ("bf16", "amx", "avx2_vnni_2")):
        return False, f"{impl}: no bf16 instructions on this CPU ({isa()}), oneDNN would emulate them"
    return True, ""


def describe(precision: str) -> str:
    """e.g. 'oneDNN 3.6.2 brg_matmul:avx512_core_bf16' (the kernel a [32, 576] x [576, 576] product gets)."""
    return f"oneDNN {version()} {_prim(32, 576, 576, precision).impl}"
