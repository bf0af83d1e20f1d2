"""kernels/gemm.py: every available backend x precision against float64, rows changing on one packed weight, out=,
copied weights, determinism, errors, the backend selection and the thread count in another thread.

Tolerances (elementwise, A = |x| @ |w| in float64, the sum of the absolute terms of each output):
- float32: an inner product of K float32 terms, each product and partial sum rounded once, in any order, is within
  gamma_K * A of the exact value, gamma_K = K u / (1 - K u), u = 2^-24 (Higham, "Accuracy and Stability of Numerical
  Algorithms", 2nd ed., 3.1); FMA or blocked sums only round less. The float64 reference is off by at most
  K * 2^-53 * A (the products of two float32 are exact in float64), which GAMMA_SLACK = 1.01 covers.
- bfloat16: each input is rounded to bf16 first (relative 2^-8 each, 8 significand bits), so a product is off by
  at most (2 * 2^-8 + 2^-16) relative, then float32 accumulation: (2^-7 + 2^-16 + gamma_K (1 + 2^-7 + 2^-16)) * A.
- weight_only_int8: W ~ s_n q with |W - s_n q| <= s_n / 2 (round to nearest, s_n = max |W[:, n]| / 127), which
  moves an output by at most S = (sum_k |x_k|) * s_n / 2; the rest is the bf16 bound on |x| @ |s q| <= A + S (the
  decompressed weight rounded to bf16 or not, and one more rounding if the scale is applied after the sum:
  gamma_{K+2} covers it).
"""
import ctypes
import os
import threading

import numpy as np
import pytest

from paddle_grpo.kernels import gemm, mkl, onednn

pytestmark = pytest.mark.numerics  # compares float results: CI reruns it on other CPU kernels

U32, U16 = 2.0 ** -24, 2.0 ** -8
GAMMA_SLACK = 1.01
K, N = 300, 70  # K not a multiple of the kernels' blocks (16 / 32 / 64): their tails run too
# oneDNN's weight-only int8 is measured (tools/bench/bench_gemm.py) but not offered by gemm.pack: tested here too
COMBOS = [(b, p) for b in gemm.BACKENDS for p in gemm.SUPPORTS[b]] + [("onednn", "weight_only_int8")]


def _gamma(n: int) -> float:
    return n * U32 / (1 - n * U32) * GAMMA_SLACK


def _need(backend: str, precision: str) -> None:
    if precision == "weight_only_int8":
        ok, why = onednn.supports(precision)
    else:
        ok, why = gemm.available(backend, precision)
    if not ok:
        pytest.skip(f"{backend} {precision} not on this machine: {why}")


def _pack(w: np.ndarray, precision: str, backend: str, transposed: bool = False) -> gemm.Packed:
    if precision != "weight_only_int8":
        return gemm.pack(w, precision, backend, transposed=transposed)
    k, n = w.shape[::-1] if transposed else w.shape
    return gemm.Packed(onednn.Weights(w, precision, transposed), backend, precision, k, n, transposed)


def _tolerance(x: np.ndarray, w: np.ndarray, precision: str) -> np.ndarray:
    """The bound of the module docstring for x [M, K] @ w [K, N], elementwise [M, N]."""
    k = x.shape[1]
    a = np.abs(x.astype(np.float64)) @ np.abs(w.astype(np.float64))
    if precision == "float32":
        return _gamma(k) * a
    bf16 = 2 * U16 + U16 ** 2
    if precision == "bfloat16":
        return (bf16 + _gamma(k) * (1 + bf16)) * a
    half_scale = np.abs(w).max(axis=0).astype(np.float64) / 127 / 2
    s = np.abs(x.astype(np.float64)).sum(axis=1, keepdims=True) * half_scale[None, :]
    return s + (bf16 + _gamma(k + 2) * (1 + bf16)) * (a + s)


def _weights(rng, transposed: bool) -> np.ndarray:
    return (rng.standard_normal((N, K) if transposed else (K, N)) * 0.05).astype(np.float32)


@pytest.mark.parametrize("transposed", [False, True], ids=["w", "head"])
@pytest.mark.parametrize("backend,precision", COMBOS)
def test_against_float64_at_several_rows(backend, precision, transposed):
    """x @ W within the derived bound at M = 1, 7, 32, 100, on ONE packed weight (the rows change between calls),
    for W [K, N] and the head's layout W^T given as [N, K]."""
    _need(backend, precision)
    rng = np.random.default_rng(2 * COMBOS.index((backend, precision)) + transposed)
    w = _weights(rng, transposed)
    wk = w.T if transposed else w
    p = _pack(w, precision, backend, transposed)
    assert (p.backend, p.precision, p.K, p.N, p.transposed) == (backend, precision, K, N, transposed)
    for m in (1, 7, 32, 100):
        x = rng.standard_normal((m, K)).astype(np.float32)
        y = p(x)
        assert y.shape == (m, N) and y.dtype == np.float32
        err = np.abs(y - x.astype(np.float64) @ wk.astype(np.float64))
        tol = _tolerance(x, wk, precision)
        assert (err <= tol).all(), f"M={m}: worst error {err.max():.3g}, its bound {tol.flat[np.argmax(err - tol)]:.3g}"


@pytest.mark.parametrize("backend,precision", COMBOS)
def test_deterministic_out_and_copied_weights(backend, precision):
    """Same inputs, same bits (also after other row counts ran); out= written in place and returned; the source
    weight overwritten after pack changes nothing (its values were copied)."""
    _need(backend, precision)
    rng = np.random.default_rng(1)
    w = _weights(rng, False)
    p = _pack(w, precision, backend)
    x32, x5 = rng.standard_normal((32, K)).astype(np.float32), rng.standard_normal((5, K)).astype(np.float32)
    first = p(x32)
    p(x5)
    out = np.full((32, N), np.nan, dtype=np.float32)
    assert p(x32, out=out) is out
    np.testing.assert_array_equal(out, first)
    w[...] = rng.standard_normal(w.shape).astype(np.float32)
    np.testing.assert_array_equal(p(x32), first)
    assert p(np.empty((0, K), np.float32)).shape == (0, N)


def test_errors_name_the_shapes():
    p = gemm.pack(np.ones((K, N), np.float32), backend="numpy")
    with pytest.raises(ValueError, match=rf"\[M, {K}\].*float32 \[4, 299\]"):
        p(np.ones((4, K - 1), np.float32))
    with pytest.raises(ValueError, match="not C-contiguous"):
        p(np.ones((K, 4), np.float32).T)
    with pytest.raises(ValueError, match="float64"):
        p(np.ones((4, K)))
    with pytest.raises(ValueError, match=rf"out must be .*\[4, {N}\].*\[4, {N + 1}\]"):
        p(np.ones((4, K), np.float32), out=np.empty((4, N + 1), np.float32))
    with pytest.raises(ValueError, match="2-D float32"):
        gemm.pack(np.ones((K, N)))


def test_selection_env_override_and_unknown_names(monkeypatch):
    monkeypatch.delenv(gemm.ENV, raising=False)
    chosen = gemm.best_backend("float32")
    assert chosen == gemm.best_backend("float32")  # deterministic: a table, no timing
    assert gemm.choose("float32") == chosen
    monkeypatch.setenv(gemm.ENV, "numpy")
    assert gemm.choose("float32") == "numpy"
    assert gemm.pack(np.ones((3, 2), np.float32)).backend == "numpy"
    assert gemm.describe().startswith("GEMM: numpy float32 (") and "PADDLE_GRPO_GEMM=numpy" in gemm.describe()
    monkeypatch.setenv(gemm.ENV, "blas")
    with pytest.raises(ValueError, match="unknown GEMM backend 'blas'.*mkl, onednn, numpy, paddle"):
        gemm.pack(np.ones((3, 2), np.float32))
    monkeypatch.setenv(gemm.ENV, "mkl")
    with pytest.raises(ValueError, match="mkl has no bfloat16"):
        gemm.choose("bfloat16")
    with pytest.raises(ValueError, match="unknown GEMM precision 'int4'"):
        gemm.best_backend("int4")


def test_table_rows_and_defaults():
    """A CPU family with a measured row gets that row's backend where it is available here; any other family the
    first available backend of DEFAULT_ORDER; the family key from vendor and flags."""
    assert set(gemm.MEASURED) <= set(gemm.TABLE)
    for precision in gemm.PRECISIONS:
        default = next((b for b in gemm.DEFAULT_ORDER[precision] if gemm.available(b, precision)[0]), None)
        if default is None:
            continue
        assert gemm.best_backend(precision, cpu="other") == default
        for family, row in gemm.TABLE.items():
            want = row[precision] if gemm.available(row[precision], precision)[0] else default
            assert gemm.best_backend(precision, cpu=family) == want
    zen4 = {"avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16"}
    assert gemm.cpu_family("AuthenticAMD", zen4) == "amd-avx512"
    assert gemm.cpu_family("GenuineIntel", zen4 | {"amx_tile", "amx_bf16"}) == "intel-amx"
    assert gemm.cpu_family("GenuineIntel", {"avx2", "fma"}) == "intel-avx2"
    assert gemm.cpu_family("ARM", set()) == gemm.cpu_family("GenuineIntel", {"sse4_2"}) == "other"


def test_onednn_follows_paddle_threads_in_another_thread():
    """paddle.base.core.set_num_threads(2) sets MKL's count for the process but OpenMP's for the calling thread only;
    the oneDNN backend sets the count of the thread it runs in to MKL's."""
    _need("onednn", "float32")
    import paddle

    p = gemm.pack(np.ones((K, N), np.float32), backend="onednn")
    omp = ctypes.CDLL(os.path.join(os.path.dirname(paddle.__file__), "libs", "libiomp5.so"))
    before, seen = mkl.max_threads(), []

    def worker():
        p(np.ones((2, K), np.float32))
        seen.append(omp.omp_get_max_threads())

    try:
        for n in (2, 1):
            paddle.base.core.set_num_threads(n)
            t = threading.Thread(target=worker)
            t.start()
            t.join()
    finally:
        paddle.base.core.set_num_threads(before)
    assert seen == [2, 1]


def test_mkl_requires_the_cpu_tuning_on_amd(monkeypatch):
    """On an AMD CPU with AVX2 and the tuning on, no MKL call before cpu_tuning.apply() set MKL_DEBUG_CPU_TYPE."""
    monkeypatch.setattr(mkl, "_checked", False)
    monkeypatch.setattr(mkl, "cpu_vendor_flags", lambda: ("AuthenticAMD", {"avx2", "fma"}))
    monkeypatch.setattr(mkl.platform, "machine", lambda: "x86_64")
    monkeypatch.delenv("MKL_DEBUG_CPU_TYPE", raising=False)
    monkeypatch.delenv("PADDLE_GRPO_CPU_TUNING", raising=False)
    with pytest.raises(RuntimeError, match=r"cpu_tuning.apply\(\)"):
        mkl.require_tuning()
    monkeypatch.setenv("PADDLE_GRPO_CPU_TUNING", "0")
    mkl.require_tuning()


def test_onednn_reports_its_kernel():
    _need("onednn", "float32")
    assert onednn.describe("float32").startswith(f"oneDNN {onednn.version()} ")


@pytest.mark.parametrize("backend,precision", COMBOS)
def test_one_packed_from_two_threads_at_once(backend, precision):
    """Two threads calling one Packed at once with different rows get the bits one thread gets (oneDNN keeps its
    primitives and their buffers per thread; MKL's and numpy's calls only read the packed weight)."""
    _need(backend, precision)
    rng = np.random.default_rng(3)
    p = _pack(_weights(rng, False), precision, backend)
    xs = [rng.standard_normal((m, K)).astype(np.float32) for m in (3, 17)]
    alone = [p(x) for x in xs]
    got = [[], []]

    def run(i):
        for _ in range(20):
            got[i].append(p(xs[i]))

    threads = [threading.Thread(target=run, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in (0, 1):
        assert len(got[i]) == 20 and all(np.array_equal(y, alone[i]) for y in got[i])


@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_onednn_reorders_again_for_another_layout(precision):
    """Where a row count's primitive prefers another weights layout (none does on the measured CPU, so the cached
    copy is hidden here), the weights are reordered from the first copy once: same values, same bits."""
    _need("onednn", precision)
    rng = np.random.default_rng(4)
    p = gemm.pack(_weights(rng, False), precision, "onednn")
    x = rng.standard_normal((9, K)).astype(np.float32)
    first, size = p(x), p._impl.nbytes
    p._impl._for = {b"another layout": p._impl._first[1]}
    np.testing.assert_array_equal(p(x), first)
    assert p._impl.nbytes == 2 * size and len(p._impl._for) == 2
