"""Start-up before any process group exists: this process's rank on its node, and building a missing directory
(the quickstart policy) once, whatever the number of nodes sharing its file system, without a collective waiting
for it."""
from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
import socket
import time
from collections.abc import Callable

logger = logging.getLogger("paddle_grpo.parallel")


def local_rank() -> int:
    """This process's rank on its node, from the launcher's environment (`paddle.distributed.launch` sets
    PADDLE_LOCAL_RANK; 0 in a single process). Readable before `ParallelContext.from_config`."""
    return int(os.environ.get("PADDLE_LOCAL_RANK", os.environ.get("PADDLE_RANK_IN_NODE", "0")))


def _launch_id() -> str:
    """Names this launch on this node: the workers of one `paddle.distributed.launch` share its pid (their parent)
    and endpoint list; a marker left by an earlier launch carries another."""
    return f"{socket.gethostname()} {os.getppid()} {os.environ.get('PADDLE_TRAINER_ENDPOINTS', '')}"


def build_once(path: str, build: Callable[[str], object], what: str, *, poll_seconds: float = 1.0,
               log_seconds: float = 30.0) -> None:
    """Make the missing directory `path` with `build(directory)` once, before any process group exists.

    A build can take longer than a collective's timeout (gloo's is a fixed 30 s), so no rank waits for it in a
    collective. On each node local rank 0 takes an exclusive lock on `<path>.lock` (fcntl.lockf: a POSIX lock,
    which NFS and most cluster file systems honour across hosts); the first to hold it builds into a temporary
    directory beside `path` (named by host and pid) and renames it into place, so `path` is either absent or
    complete; local rank 0 of every other node sharing the file system waits for the lock, then finds `path` built
    and uses it. The other local ranks poll the file system for `path`, logging every `log_seconds`. If the build
    fails, the builder writes `<path>.failed-<host>` with the error and this launch's id before re-raising, and the
    waiting ranks of its node stop with that error instead of waiting for a directory that will not come (another
    node then takes the lock and tries itself). Temporary directories of builders that are no longer running (a
    killed run) are removed. On a file system without working locks (lockf raises) each node builds, and the first
    rename wins."""
    path = os.path.normpath(path)
    host = socket.gethostname()
    failed = f"{path}.failed-{host}"
    if local_rank() != 0:
        start = last_log = time.monotonic()
        logger.info("waiting for local rank 0 to build %s with %s", path, what)
        while not os.path.isdir(path):
            error = _failure_of_this_launch(failed)
            if error is not None:
                raise RuntimeError(f"local rank 0 failed to build {path} with {what}: {error}")
            if time.monotonic() - last_log >= log_seconds:
                last_log = time.monotonic()
                logger.info("still waiting for local rank 0 to build %s (%.0f s)", path, last_log - start)
            time.sleep(poll_seconds)
        return
    if os.path.isdir(path):
        return
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    lock_path = f"{path}.lock"
    with open(lock_path, "a+", encoding="utf-8") as lock:
        locked = _lock(lock, path, poll_seconds, log_seconds)
        try:
            if os.path.isdir(path):
                logger.info("%s was built meanwhile by another node; using it", path)
            else:
                _build(path, build, what, host, failed)
            if locked:  # `path` exists: whoever holds a lock from now on finds it and builds nothing
                with contextlib.suppress(FileNotFoundError):
                    os.remove(lock_path)
        finally:
            if locked:
                fcntl.lockf(lock, fcntl.LOCK_UN)


def _lock(lock: object, path: str, poll_seconds: float, log_seconds: float) -> bool:
    """Hold an exclusive lock on the open file `lock`, waiting (and logging) while another node builds `path`;
    False when the file system refuses locks (each node then builds; the first rename wins)."""
    start, last_log = time.monotonic(), None
    while True:
        try:
            fcntl.lockf(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except (BlockingIOError, PermissionError):  # held by another process (EAGAIN / EACCES)
            pass
        except OSError as exc:  # ENOLCK & co.: no locks on this file system
            logger.warning("cannot lock %s (%s): every node that misses %s builds it", lock.name, exc, path)
            return False
        if last_log is None or time.monotonic() - last_log >= log_seconds:
            last_log = time.monotonic()
            logger.info("another node is building %s: waiting for it (%.0f s)", path, last_log - start)
        time.sleep(poll_seconds)


def _build(path: str, build: Callable[[str], object], what: str, host: str, failed: str) -> None:
    """Build `path` beside it and rename it into place (the caller holds the lock)."""
    parent, base = os.path.split(os.path.abspath(path))
    prefix = f"{base}.tmp-{host}-"
    for name in os.listdir(parent):
        pid = name[len(prefix):].split(".")[0] if name.startswith(prefix) else ""  # "<pid>" or "<pid>.<suffix>"
        if pid.isdigit() and not _running(int(pid)):
            logger.info("removing %s, left by a build that is no longer running", os.path.join(parent, name))
            shutil.rmtree(os.path.join(parent, name), ignore_errors=True)
    if os.path.exists(failed):
        os.remove(failed)
    tmp = os.path.join(parent, f"{prefix}{os.getpid()}")
    logger.info("%s does not exist: building it with %s", path, what)
    try:
        build(tmp)
        try:
            os.rename(tmp, path)  # atomic: other ranks see no directory or a complete one
            logger.info("%s is ready", path)
        except OSError:
            if not os.path.isdir(path):
                raise
            logger.info("%s was built meanwhile by another node; using that copy", path)
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            with open(failed, "w", encoding="utf-8") as f:
                json.dump({"launch": _launch_id(), "error": f"{type(e).__name__}: {e}"}, f)
        except OSError:
            logger.warning("could not write %s; the other local ranks wait until the launcher stops them", failed)
        raise


def _failure_of_this_launch(marker: str) -> str | None:
    """The error recorded in a builder's failure marker when this launch wrote it (None otherwise)."""
    try:
        with open(marker, encoding="utf-8") as f:
            record = json.load(f)
    except (OSError, ValueError):  # absent, or being written
        return None
    return record.get("error", "unknown error") if record.get("launch") == _launch_id() else None


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True
