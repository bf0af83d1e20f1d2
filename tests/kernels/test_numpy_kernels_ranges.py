"""numpy_kernels.parallel_ranges: contiguous ranges covering range(n) once each, the first on the calling thread and
the others on pool threads at the same time, and the helpers waited for when the caller's own range raises (they
write into the caller's arrays)."""
import threading
import time

import numpy as np
import pytest

from paddle_grpo.kernels import numpy_kernels


def test_ranges_cover_once_the_first_on_the_caller(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    hits = np.zeros(10, dtype=int)
    ranges, lock = [], threading.Lock()
    both_running = threading.Barrier(3, timeout=10)   # fails unless the three ranges run at the same time

    def work(a, b):
        both_running.wait()
        with lock:
            ranges.append((a, b, threading.get_ident()))
        hits[a:b] += 1

    numpy_kernels.parallel_ranges(10, work)
    np.testing.assert_array_equal(hits, np.ones(10, dtype=int))
    ranges.sort()
    assert [(a, b) for a, b, _ in ranges] == [(0, 3), (3, 6), (6, 10)]
    assert ranges[0][2] == threading.get_ident()
    assert len({t for _, _, t in ranges}) == 3


def test_helpers_finish_before_the_callers_error_propagates(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    out = np.zeros(4)

    def work(a, b):
        if a == 0:
            raise ValueError("the caller's range failed")
        time.sleep(0.2)
        out[a:b] = 1.0

    with pytest.raises(ValueError, match="caller's range"):
        numpy_kernels.parallel_ranges(4, work)
    np.testing.assert_array_equal(out, [0, 0, 1, 1])


def test_one_thread_runs_inline(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    seen = []
    numpy_kernels.parallel_ranges(5, lambda a, b: seen.append((a, b, threading.get_ident())))
    assert seen == [(0, 5, threading.get_ident())]
