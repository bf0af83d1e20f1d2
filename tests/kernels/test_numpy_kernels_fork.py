"""numpy_kernels.parallel_ranges in a forked child (review defect 5): the parent's thread pool is not inherited (a
forked child has only the thread that called fork; a pool object copied from the parent would queue the work for
threads that do not exist and wait forever). Uses a real os.fork."""
import os
import signal
import time

import numpy as np

from paddle_grpo.kernels import numpy_kernels

CHILD_LIMIT_S = 10  # the child's own alarm: a hang ends the child instead of the test run


def _fill(out: np.ndarray):
    def work(start: int, end: int) -> None:
        out[start:end] = np.arange(start, end)
    return work


def test_parallel_ranges_works_in_a_forked_child_after_the_parent_used_its_pool(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # two ranges: the pool is used, whatever the machine's cores
    parent = np.zeros(8)
    numpy_kernels.parallel_ranges(8, _fill(parent))
    np.testing.assert_array_equal(parent, np.arange(8))
    assert numpy_kernels._pool is not None  # the parent holds a pool with live threads

    pid = os.fork()
    if pid == 0:  # the child: exit status 0 only when the work ran, and SIGALRM (not a hang) if it never returns
        status = 1
        try:
            signal.alarm(CHILD_LIMIT_S)
            child = np.zeros(8)
            numpy_kernels.parallel_ranges(8, _fill(child))
            status = 0 if np.array_equal(child, np.arange(8)) else 3
        finally:
            os._exit(status)
    deadline = time.monotonic() + CHILD_LIMIT_S + 10
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:  # the alarm did not fire either: end the child we started
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise AssertionError("the forked child's parallel_ranges never returned")
        time.sleep(0.05)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, (
        f"forked child: {'signal %d' % os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)} "
        "(SIGALRM = 14: parallel_ranges hung on the pool inherited from the parent)")
    # The parent's pool still works after the fork.
    again = np.zeros(8)
    numpy_kernels.parallel_ranges(8, _fill(again))
    np.testing.assert_array_equal(again, np.arange(8))
