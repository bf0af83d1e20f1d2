"""The asynchronous rollout worker's process machinery (docs/async.md): a child process, the versioned weights it
reads, and the messages it sends.

- `WeightStore`: the trainer writes its trainable parameters once per step as `v<version>.npz` (numpy, written
  beside and renamed into place, so a reader never sees half a file) in a private directory (under /dev/shm when
  it exists: memory, no disk); the worker waits for the version its next step needs and loads it. Under LoRA only
  the adapters are trainable, so only they travel.
- `WorkerProcess`: starts `python -m paddle_grpo.rollout.async_worker` with one end of a socket pair; the child
  receives `(entry, payload)`, imports `entry` ("module:function") and runs `entry(conn, payload)`. The entry that
  samples and scores lives in step/async_rollout.py (it calls step.collect; step/ imports rollout/, never the
  reverse, so it is named here only as a string). Batches come back through the pipe (small: token ids and
  rewards); an error in the child comes back as its traceback. The child ignores SIGINT (the trainer decides when
  to stop: Ctrl-C reaches the whole process group), ends cleanly on SIGTERM (its entry's `finally` runs: the tool
  pool closes), dies with its parent (PR_SET_PDEATHSIG on Linux, and a thread that polls the parent's pid), and
  writes its stdout/stderr to a log file whose last lines any failure quotes.

This module imports neither step/ nor the policy: what the child does is its entry's business.
"""
from __future__ import annotations

import importlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from multiprocessing.connection import Connection
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np

__all__ = ["RolloutWorkerError", "WeightStore", "WorkerProcess", "die_with_parent", "oversubscribed", "parent_gone",
           "process_cpu_s", "worker_env"]

POLL_S = 0.002  # the worker's poll for a weights file: far below a step (>= 0.1 s), negligible CPU


class RolloutWorkerError(RuntimeError):
    """The rollout worker died, hung or raised; the message names it (pid, exit code, its last log lines)."""


# ------------------------------------------------------------------------------------------------- weights

class WeightStore:
    """Versioned parameter files `v<version>.npz` in `directory` (version k: the weights after k updates)."""

    def __init__(self, directory: str):
        self.directory = directory
        os.makedirs(directory, exist_ok=True)

    @classmethod
    def private(cls, needed_bytes: int = 0, prefix: str = "paddle_grpo_weights_") -> "WeightStore":
        """A new private directory: in memory (/dev/shm) when the system has it with `needed_bytes` free (a
        container's /dev/shm is often 64 MB), else in the temporary directory."""
        shm = "/dev/shm"
        base = None
        if os.path.isdir(shm) and os.access(shm, os.W_OK):
            stat = os.statvfs(shm)
            base = shm if stat.f_bavail * stat.f_frsize >= needed_bytes else None
        return cls(tempfile.mkdtemp(prefix=prefix, dir=base))

    def path(self, version: int) -> str:
        return os.path.join(self.directory, f"v{version}.npz")

    def has(self, version: int) -> bool:
        return os.path.isfile(self.path(version))

    def versions(self) -> List[int]:
        return sorted(int(n[1:-4]) for n in os.listdir(self.directory) if n.startswith("v") and n.endswith(".npz"))

    def publish(self, version: int, arrays: Dict[str, np.ndarray]) -> None:
        """Write `arrays` as `version` atomically (write beside, then rename)."""
        tmp = os.path.join(self.directory, f".tmp-v{version}.npz")
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)
        os.replace(tmp, self.path(version))

    def load(self, version: int) -> Dict[str, np.ndarray]:
        with np.load(self.path(version)) as data:
            return {name: data[name] for name in data.files}

    def wait(self, version: int, alive: Callable[[], bool], poll_s: float = POLL_S) -> float:
        """Block until `version` exists; returns the seconds waited. `alive()` False stops the wait (SystemExit)."""
        t0 = time.perf_counter()
        while not self.has(version):
            if not alive():
                raise SystemExit(0)
            time.sleep(poll_s)
        return time.perf_counter() - t0

    def prune(self, below: int) -> None:
        """Delete the versions below `below` (a reader that has one open keeps reading it: POSIX unlink)."""
        for v in self.versions():
            if v < below:
                os.remove(self.path(v))

    def copy_out(self, versions: Sequence[int], directory: str) -> None:
        os.makedirs(directory, exist_ok=True)
        for v in versions:
            shutil.copyfile(self.path(v), os.path.join(directory, f"v{v}.npz"))

    def copy_in(self, directory: str, versions: Sequence[int]) -> None:
        for v in versions:
            tmp = os.path.join(self.directory, f".tmp-v{v}.npz")
            shutil.copyfile(os.path.join(directory, f"v{v}.npz"), tmp)
            os.replace(tmp, self.path(v))

    def remove(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)


# ------------------------------------------------------------------------------------------------- process

def worker_env(threads: int) -> Dict[str, str]:
    """The environment the rollout worker gets on top of the trainer's: its kernels' thread count
    (rollout_worker_threads; 0: none, it inherits the trainer's). paddle and MKL read both at the worker's start."""
    return {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)} if threads > 0 else {}


def oversubscribed(trainer: int, worker: int, cores: int) -> bool:
    """Whether the trainer's and the worker's kernel threads compete harmfully for `cores`: both multi-threaded
    beyond the cores (2 threads each on 2 cores: the rollout 2.6x, the update 1.4x longer at the TRL shape), or one
    alone wanting more than all of them. One multi-threaded process beside a 1-thread one is left alone: a 2-thread
    trainer beside a 1-thread worker was the fastest split for SmolLM2-135M (docs/async.md); the reverse, 1 + 2 at
    the toy TRL shape, was slower than 1 + 1 (0.52 against 0.37 s), which the step's waits show."""
    return max(trainer, worker) > cores or (trainer > 1 and worker > 1 and trainer + worker > cores)


def process_cpu_s(pid: Optional[int] = None) -> Optional[float]:
    """CPU seconds (user + system, all threads) of process `pid` (None: this one), from /proc/PID/stat; None when
    the process is gone or /proc is absent."""
    if pid is None:
        t = os.times()
        return t.user + t.system
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime (fields 14, 15)
    except (OSError, IndexError, ValueError):
        return None


def parent_gone(parent_pid: int) -> bool:
    """Whether this process's parent `parent_pid` has exited or is exiting. PR_SET_PDEATHSIG's signal comes before
    the child sees its new parent (getppid() still names the dying one), so its /proc state counts too."""
    if os.getppid() != parent_pid:
        return True
    try:
        with open(f"/proc/{parent_pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X", "x")
    except (OSError, IndexError):
        return not os.path.isdir("/proc/self")  # no /proc: only getppid() can tell


def die_with_parent(parent_pid: int) -> None:
    """Make this process end when `parent_pid` does: PR_SET_PDEATHSIG (Linux: SIGTERM when the parent thread
    exits, so that the entry's `finally` can clean up: _child_main's handler) and a daemon thread that polls the
    parent's pid (other systems, and a parent gone before the prctl): SIGTERM too, then a hard exit 10 s later."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM), 0, 0, 0)  # PR_SET_PDEATHSIG = 1
        except (OSError, AttributeError):
            pass

    def watch() -> None:
        while True:
            if parent_gone(parent_pid):
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(10)
                os._exit(0)
            time.sleep(0.5)

    if os.getppid() != parent_pid:
        os._exit(0)
    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


class WorkerProcess:
    """A rollout worker child process running `entry(conn, payload)` (entry: "module:function"), its stdout and
    stderr appended to `log_path`."""

    def __init__(self, entry: str, payload: Any, log_path: str, *, name: str = "rollout worker",
                 env: Optional[Dict[str, str]] = None):
        import socket

        self.name, self.log_path = name, log_path
        parent_sock, child_sock = socket.socketpair()
        env = {**os.environ, **(env or {})}  # `env`: variables set for the child only (e.g. its thread count)
        # The child imports this package as the parent does (a checkout on sys.path, not only an installed copy).
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
        os.makedirs(os.path.dirname(os.path.abspath(log_path)), exist_ok=True)
        self._log = open(log_path, "ab")
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "paddle_grpo.rollout.async_worker", str(child_sock.fileno()), str(os.getpid())],
                pass_fds=[child_sock.fileno()], stdin=subprocess.DEVNULL, stdout=self._log, stderr=self._log,
                env=env)
        finally:
            child_sock.close()
        self.conn = Connection(os.dup(parent_sock.fileno()))
        parent_sock.close()
        self.pid = self.proc.pid
        self.conn.send((entry, payload))

    def describe(self) -> str:
        return f"{self.name} (pid {self.pid})"

    def log_tail(self, lines: int = 12) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(max(0, os.path.getsize(self.log_path) - 16384))
                text = f.read().decode("utf-8", "replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def _dead(self, code: int) -> RolloutWorkerError:
        how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
        tail = self.log_tail()
        return RolloutWorkerError(f"the {self.describe()} {how}; its last log lines ({self.log_path}):\n"
                                  f"{tail or '(none)'}")

    def recv(self, timeout_s: float = 0.0) -> Any:
        """The worker's next message. Raises RolloutWorkerError when it died, sent an error (its traceback), or
        sent nothing for `timeout_s` seconds (0: no limit; the worker is then stopped)."""
        t0 = time.perf_counter()
        while True:
            if self.conn.poll(0.2):
                try:
                    message = self.conn.recv()
                except (EOFError, OSError):
                    message = None
                if message is None:  # the pipe closed: the process is gone or going
                    code = self.proc.wait(timeout=10)
                    raise self._dead(code)
                if message[0] == "error":
                    raise RolloutWorkerError(f"the {self.describe()} failed:\n{message[1]}")
                return message
            code = self.proc.poll()
            if code is not None:
                raise self._dead(code)
            if timeout_s and time.perf_counter() - t0 > timeout_s:
                self.close()
                raise RolloutWorkerError(
                    f"the {self.describe()} sent no samples for {timeout_s:g} s (rollout_worker_timeout_s): it hangs "
                    f"and was stopped; its last log lines ({self.log_path}):\n{self.log_tail() or '(none)'}")

    def cpu_s(self) -> Optional[float]:
        return process_cpu_s(self.pid)

    def close(self, grace_s: float = 5.0) -> Optional[int]:
        """Stop the worker (SIGTERM: it ends between two paddle ops, closing its tools; SIGKILL after `grace_s`);
        returns its exit code. Its pending samples are not needed: a checkpoint holds the weights to redo them."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.conn.close()
        self._log.close()
        return self.proc.returncode


def stop_requested(conn: Connection) -> bool:
    """In the worker: whether the trainer asked it to stop (or went away)."""
    try:
        return conn.poll() and conn.recv()[0] == "stop"
    except (EOFError, OSError):
        return True


def _child_main(fd: int, parent_pid: int) -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # a clean end: the entry's `finally` closes its tools
    die_with_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the trainer stops this worker
    conn = Connection(fd)
    try:
        entry, payload = conn.recv()
    except (EOFError, OSError):
        return
    try:
        module, function = entry.split(":")
        target = getattr(importlib.import_module(module), function)
        # Again: importing paddle installs its own C-level SIGTERM handler, which exits without the `finally`s.
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        target(conn, payload)
    except (SystemExit, KeyboardInterrupt):
        pass
    except BaseException:  # noqa: BLE001 - every failure goes back to the trainer, which raises it named
        text = traceback.format_exc()
        sys.stderr.write(text)
        sys.stderr.flush()
        try:
            conn.send(("error", text))
        except OSError:
            pass
        sys.exit(1)
    finally:
        # The trainer died (even by SIGKILL, which left it no time to clean up): its weight files go with it.
        if parent_gone(parent_pid) and isinstance(payload, dict) and payload.get("weights_dir"):
            shutil.rmtree(payload["weights_dir"], ignore_errors=True)


if __name__ == "__main__":
    _child_main(int(sys.argv[1]), int(sys.argv[2]))
