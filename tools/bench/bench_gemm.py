"""Skinny matrix products at the decode shapes, per GEMM backend and precision (kernels/gemm.py's table is made from
this output; docs/PERFORMANCE.md, "Skinny matrix products").

    nice -n 10 python tools/bench/bench_gemm.py [--rows 1,8,32,100,128] [--threads 1,2] [--layers 30]
        [--backends mkl,onednn,numpy,paddle] [--precisions float32,bfloat16,weight_only_int8] [--repeats 5]
        [--out results.jsonl]

What is timed: SmolLM2-135M's decoder products, x [M, K] @ W [K, N] for (K, N) = (576, 960) q/k/v, (576, 576) o,
(576, 1536) gate and up, (1536, 576) down, over `--layers` layers of distinct random N(0, 0.05^2) weights packed
once by `gemm.pack` (30 layers: 425 MB of float32 weights, far beyond the caches, so each product reads its
weight from memory as in a real decode step), outputs into preallocated arrays (`out=`). One pass multiplies all
layers' five weights; GFLOP/s = 2 * M * sum(K * N) * layers / the median pass time of `--repeats` passes after one
warm-up pass (also the best pass). Then the tied LM head x [M, 576] @ E^T, E [49152, 576] (`shape: "head"`), and a
large product [2048, 2048] @ [2048, 2048] for each backend and precision (`shape: "peak"`, the reference rate).

Threads: `paddle.base.core.set_num_threads(n)` (MKL; oneDNN follows it in every calling thread, kernels/onednn.py)
and, for the numpy backend, threadpoolctl's limit on numpy's OpenBLAS. The weights are packed under the thread
count they are timed with (MKL's packed layout depends on it).

One JSON line per (backend, precision, shape, M, threads) with "gflops" (from the median wall time),
"gflops_best", "gflops_per_cpu_s" (from the median process CPU time: at one thread, the rate with the time other
processes held the core left out), "ms_median", "load" (the 1-minute load average when it ran: a busy machine
lowers the wall rates) and "kernels" (gemm.describe's words), after one line describing the machine.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import sys
import time

DECODE_SHAPES = ((576, 960), (576, 576), (576, 1536), (576, 1536), (1536, 576))
HEAD = (576, 49152)
PEAK = 2048


def _threads_ctx(backend: str, n: int):
    """OpenBLAS's thread limit for the numpy backend (nothing for the others: paddle's setting covers them)."""
    if backend != "numpy":
        return contextlib.nullcontext()
    try:
        import threadpoolctl

        return threadpoolctl.threadpool_limits(limits=n, user_api="blas")
    except ImportError:
        return contextlib.nullcontext()


def _pack(w, precision: str, backend: str, transposed: bool = False):
    """gemm.pack; oneDNN's weight-only int8, measured but not offered by gemm.pack, through kernels/onednn.py."""
    from paddle_grpo.kernels import gemm, onednn

    if precision != "weight_only_int8":
        return gemm.pack(w, precision, backend, transposed=transposed)
    k, n = w.shape[::-1] if transposed else w.shape
    return gemm.Packed(onednn.Weights(w, precision, transposed), backend, precision, k, n, transposed)


def _available(backend: str, precision: str) -> tuple:
    from paddle_grpo.kernels import gemm, onednn

    if precision == "weight_only_int8":
        return onednn.supports(precision) if backend == "onednn" else (False, "oneDNN only")
    if precision not in gemm.SUPPORTS[backend]:
        return False, f"{backend} has no {precision}"
    return gemm.available(backend, precision)


def _time(fn, repeats: int) -> tuple:
    """(wall seconds, process CPU seconds) of `repeats` calls after one warm-up call (first touch of the outputs,
    oneDNN's primitives for this M)."""
    fn()
    wall, cpu = [], []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return wall, cpu


def _rates(flops: float, times: tuple) -> dict:
    """GFLOP/s from the median and the best wall time, and per CPU-second (median): at one thread the CPU time
    leaves out the time other processes held the core, so it is the steadier figure on a shared machine."""
    wall, cpu = times
    return dict(gflops=round(flops / statistics.median(wall) / 1e9, 1), gflops_best=round(flops / min(wall) / 1e9, 1),
                gflops_per_cpu_s=round(flops / statistics.median(cpu) / 1e9, 1),
                ms_median=round(1e3 * statistics.median(wall), 2), load=round(os.getloadavg()[0], 2))


def _line(out: str | None, **fields) -> None:
    text = json.dumps(fields)
    print(text, flush=True)
    if out:
        with open(out, "a") as f:
            f.write(text + "\n")


def measure(backend: str, precision: str, rows: list, threads: int, layers: int, repeats: int, out: str | None) -> None:
    """All rows for one backend, precision and thread count: decoder layers, head, peak."""
    import numpy as np
    import paddle

    from paddle_grpo.kernels import gemm, onednn

    paddle.base.core.set_num_threads(threads)
    rng = np.random.default_rng(0)
    if precision == "weight_only_int8":
        kernels = f"GEMM: onednn weight_only_int8 ({onednn.describe(precision)}, not offered by gemm.pack)"
    else:
        kernels = gemm.describe(precision, backend)
    common = dict(backend=backend, precision=precision, threads=threads, kernels=kernels)
    with _threads_ctx(backend, threads):
        packed = [[_pack((rng.standard_normal(s) * 0.05).astype(np.float32), precision, backend)
                   for s in DECODE_SHAPES] for _ in range(layers)]
        flops_layer = 2 * sum(k * n for k, n in DECODE_SHAPES) * layers
        for M in rows:
            xs = {k: rng.standard_normal((M, k)).astype(np.float32) for k in (576, 1536)}
            outs = {n: np.empty((M, n), np.float32) for n in (576, 960, 1536)}

            def step():
                for layer in packed:
                    for p in layer:
                        p(xs[p.K], out=outs[p.N])

            _line(out, shape="layers", M=M, **_rates(M * flops_layer, _time(step, repeats)), **common)
        packed.clear()  # free this backend's 30 layers before the head's weight
        embed = (rng.standard_normal(HEAD[::-1]) * 0.05).astype(np.float32)
        head = _pack(embed, precision, backend, transposed=True)
        del embed
        for M in rows:
            x, y = rng.standard_normal((M, HEAD[0])).astype(np.float32), np.empty((M, HEAD[1]), np.float32)
            t = _time(lambda: head(x, out=y), repeats)
            _line(out, shape="head", M=M, **_rates(2 * M * HEAD[0] * HEAD[1], t), **common)
        head = None
        big = _pack((rng.standard_normal((PEAK, PEAK)) * 0.05).astype(np.float32), precision, backend)
        x, y = rng.standard_normal((PEAK, PEAK)).astype(np.float32), np.empty((PEAK, PEAK), np.float32)
        _line(out, shape="peak", M=PEAK, **_rates(2 * PEAK ** 3, _time(lambda: big(x, out=y), 3)), **common)


def main(argv: list | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default="1,8,32,100,128")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--backends", default="mkl,onednn,numpy,paddle")
    ap.add_argument("--precisions", default="float32,bfloat16,weight_only_int8")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default=None, help="also append the JSON lines to this file")
    args = ap.parse_args(argv)
    import paddle

    from paddle_grpo import cpu_tuning
    from paddle_grpo.kernels import gemm, onednn

    paddle.set_device("cpu")
    cpu_tuning.apply()  # before the first MKL call (MKL_DEBUG_CPU_TYPE on AMD)
    rows = [int(r) for r in args.rows.split(",")]
    info = cpu_tuning.kernel_report()["cpu"]
    _line(args.out, machine=dict(info, family_key=gemm.cpu_family(), python=platform.python_version(),
                                 paddle=paddle.__version__, onednn=onednn.version() if onednn.available()[0] else None,
                                 omp_num_threads=os.environ.get("OMP_NUM_THREADS"), argv=sys.argv[1:]))
    for threads in (int(t) for t in args.threads.split(",")):
        for precision in args.precisions.split(","):
            for backend in args.backends.split(","):
                ok, why = _available(backend, precision)
                if ok:
                    measure(backend, precision, rows, threads, args.layers, args.repeats, args.out)
                elif not why.startswith(backend + " has no") and why != "oneDNN only":
                    _line(args.out, backend=backend, precision=precision, threads=threads, skipped=why)


if __name__ == "__main__":
    main()
