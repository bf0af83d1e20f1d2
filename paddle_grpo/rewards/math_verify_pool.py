"""math-verify in killable child processes, so one pathological answer cannot hang a request.

math-verify 0.9.0 enforces its time limits with signal.alarm, which only works in the main thread; under a threaded
WSGI server it must be called with `parsing_timeout=None, timeout_seconds=None`, and then nothing stops sympy
evaluating, say, `10^{10^{10}}`. A thread cannot be killed, so each check runs in a child process
(`math_verify_worker.py`) that is killed and replaced when it exceeds the limit.
"""
import atexit
import json
import os
import queue
import select
import subprocess
import sys
import threading
from typing import List, Optional, Sequence, Tuple

WORKER_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "math_verify_worker.py")


class VerifyTimeout(Exception):
    """A check took longer than its time limit; the worker was killed."""


class _Worker:
    def __init__(self, start_timeout_s, memory_mb):
        # A script path, not `-m`, so the child needs neither this package on its path nor its imports.
        self.proc = subprocess.Popen([sys.executable, WORKER_SCRIPT, str(memory_mb)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, bufsize=0)
        if self._read(start_timeout_s) != {"ready": True}:
            raise RuntimeError("math-verify worker did not start")

    def _read(self, timeout_s):
        ready, _, _ = select.select([self.proc.stdout], [], [], max(timeout_s, 0.0))
        if not ready:
            self.kill()
            raise VerifyTimeout(f"no answer within {timeout_s:g} s")
        line = self.proc.stdout.readline()
        if not line:
            code = self.proc.wait()
            raise RuntimeError(f"math-verify worker exited with code {code}")
        return json.loads(line)

    def check(self, gold, pred, timeout_s):
        self.proc.stdin.write((json.dumps({"gold": gold, "pred": pred}) + "\n").encode())
        return self._read(timeout_s)

    def alive(self):
        return self.proc.poll() is None

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


class MathVerifyPool:
    """Up to `size` worker processes shared by all threads; a batch borrows one worker for its whole run.

    `verify_many(pairs, timeout_s)` returns, per (gold, pred) pair, `(True | False | None, reason | None)`; None
    when the check timed out or the worker failed. Workers start lazily (about half a second each, for sympy)."""

    def __init__(self, size: Optional[int] = None, start_timeout_s: float = 60.0, wait_timeout_s: float = 120.0,
                 memory_mb: int = 4096) -> None:
        self.size = size or max(1, min(4, os.cpu_count() or 1))
        self.start_timeout_s = start_timeout_s
        self.wait_timeout_s = wait_timeout_s
        self.memory_mb = memory_mb
        self._idle = queue.LifoQueue()  # LIFO: a warm worker is reused before a cold one is started
        self._lock = threading.Lock()
        self._created = 0
        self._all = []

    def _acquire(self):
        try:
            return self._idle.get_nowait()
        except queue.Empty:
            pass
        with self._lock:
            start_new = self._created < self.size
            if start_new:
                self._created += 1
        if start_new:
            try:
                return self._start()
            except BaseException:
                with self._lock:
                    self._created -= 1
                raise
        try:
            return self._idle.get(timeout=self.wait_timeout_s)
        except queue.Empty:
            raise TimeoutError(f"no math-verify worker free within {self.wait_timeout_s:g} s") from None

    def _start(self):
        worker = _Worker(self.start_timeout_s, self.memory_mb)
        with self._lock:
            self._all.append(worker)
        return worker

    def _release(self, worker):
        if worker.alive():
            self._idle.put(worker)
        else:
            with self._lock:
                self._created -= 1
                if worker in self._all:
                    self._all.remove(worker)

    def verify_many(self, pairs: Sequence[Tuple[str, str]],
                    timeout_s: float) -> List[Tuple[Optional[bool], Optional[str]]]:
        results = []
        worker = self._acquire()
        try:
            for gold, pred in pairs:
                if not worker.alive():  # killed after the previous sample timed out: replace it
                    dead, worker = worker, None
                    self._release(dead)
                    worker = self._acquire()
                try:
                    reply = worker.check(gold, pred, timeout_s)
                except VerifyTimeout:
                    results.append((None, f"math-verify timed out after {timeout_s:g} s"))
                    continue
                except (RuntimeError, OSError, ValueError) as exc:
                    worker.kill()
                    results.append((None, f"math-verify worker failed: {exc}"))
                    continue
                if "error" in reply:
                    results.append((None, f"math-verify error: {reply['error']}"))
                else:
                    results.append((bool(reply["ok"]), None))
        finally:
            if worker is not None:
                self._release(worker)
        return results

    def close(self) -> None:
        with self._lock:
            workers, self._all = self._all, []
            self._created = 0
        for worker in workers:
            worker.kill()
        while True:
            try:
                self._idle.get_nowait()
            except queue.Empty:
                break


_DEFAULT_POOL = None
_DEFAULT_POOL_LOCK = threading.Lock()


def default_pool() -> MathVerifyPool:
    """The process-wide pool, created on first use and closed at exit."""
    global _DEFAULT_POOL
    with _DEFAULT_POOL_LOCK:
        if _DEFAULT_POOL is None:
            _DEFAULT_POOL = MathVerifyPool()
            atexit.register(_DEFAULT_POOL.close)
        return _DEFAULT_POOL
