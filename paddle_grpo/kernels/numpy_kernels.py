"""numpy kernels on paddle's own CPU memory, for the elementwise and row-reduction work that paddle's CPU kernels make
slow: the chunked LM head (chunk_kernels.py), blockwise attention (attention.py), the decode step's
max / exp / sum at a real vocabulary (rollout/) and the squared norms of large gradients (parallel/gradients.py).

Why: paddle's CPU elementwise and reduction kernels run on one thread, and at the sizes of a real model they cost as
much as the matrix products around them. One [512, 151,936] chunk of the LM head (2 threads): its GEMM 500 ms, its
statistics (max, exp, sums) 530 ms more with paddle ops and ~120 ms more with numpy
(`python tools/bench/bench.py --ops`, "one chunk" rows). numpy's loops release the GIL, so a thread per core works
in parallel.

How: `writable_view(t)` is a numpy array over a contiguous float32 CPU tensor's memory (no copy; numpy's
`from_dlpack` gives a read-only one). The kernels write only into fresh tensors their caller owns (a GEMM's output,
a new buffer) and run where autograd records nothing: inside `PyLayer` forward / backward bodies, the no-grad decode
step, gradients after the backward.

A forked child (a DataLoader worker, a multiprocessing pool) starts without the parent's thread pool and makes its
own (`os.register_at_fork`).

`enabled(t)`: a contiguous float32 CPU tensor, and `PADDLE_GRPO_NUMPY_KERNELS` not `0`. Elsewhere (GPU, other
dtypes, or with the variable at 0) the callers use their paddle-op implementation of the same maths; the tests run
both on CPU and compare them.
"""
from __future__ import annotations

import ctypes
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import numpy as np
import paddle

__all__ = ["enabled", "parallel_ranges", "threads", "writable_view"]

_pool: ThreadPoolExecutor | None = None
_pool_size = 0


def _forget_pool() -> None:
    """In a forked child: drop the parent's pool. The child has only the thread that forked; the copied pool would
    queue work for worker threads that do not exist there, and `parallel_ranges` would wait forever. The next call
    makes a new pool (the parent's keeps working)."""
    global _pool, _pool_size
    _pool, _pool_size = None, 0


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_forget_pool)


def enabled(t: paddle.Tensor) -> bool:
    """Whether `t` gets the numpy kernels: float32, on CPU, contiguous, and not switched off."""
    if os.environ.get("PADDLE_GRPO_NUMPY_KERNELS", "1") == "0":
        return False
    return t.dtype == paddle.float32 and t.place.is_cpu_place() and t.is_contiguous()


def threads() -> int:
    """The CPU threads paddle's kernels use: OMP_NUM_THREADS when set (paddle reads it), else the usable cores."""
    env = os.environ.get("OMP_NUM_THREADS", "")
    return max(1, int(env)) if env.isdigit() else max(1, len(os.sched_getaffinity(0)))


def writable_view(t: paddle.Tensor) -> np.ndarray:
    """A writable numpy array over the memory of a contiguous float32 CPU tensor, valid while `t` lives."""
    n = int(np.prod(t.shape))
    return np.ctypeslib.as_array((ctypes.c_float * n).from_address(t.data_ptr())).reshape(t.shape)


def parallel_ranges(n: int, work: Callable[[int, int], None]) -> None:
    """Run `work(start, end)` over contiguous ranges splitting `range(n)`, one per thread, and wait for all. The
    calling thread takes the first range itself: k ranges wake k - 1 pool threads, so on k cores the caller and its
    helpers do not also compete with an idle pool thread (paddle's OpenMP threads may spin between its products)."""
    global _pool, _pool_size
    k = min(threads(), n)
    if k <= 1:
        work(0, n)
        return
    if _pool_size < k - 1:
        _pool, _pool_size = ThreadPoolExecutor(k - 1, thread_name_prefix="paddle_grpo_numpy"), k - 1
    bounds = np.linspace(0, n, k + 1).astype(int)
    futures = [_pool.submit(work, int(a), int(b)) for a, b in zip(bounds[1:-1], bounds[2:])]
    try:
        work(int(bounds[0]), int(bounds[1]))
    finally:  # the helpers write into the caller's arrays: wait for them even when the caller's range raised
        for future in futures:
            future.result()
