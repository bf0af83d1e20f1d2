"""The built-in `python` tool: runs a snippet in a fresh Python process with one budget for the whole call and,
where it can, in namespaces of its own.

    python(code="print(123*45)") -> "5535\\n"

Each call starts sandbox_launcher.py (a fresh interpreter: INTERPRETER, $PADDLE_GRPO_SANDBOX_PYTHON or this one),
which runs the code with `INTERPRETER -I -` (isolated mode: no user site-packages, no PYTHON* variables; the code
comes on standard input, so no length of it meets the kernel's argument limit) in an empty environment (Python adds
LC_CTYPE itself when it coerces the C locale) and a working directory of its own (removed afterwards). One budget
holds for the call, all the processes it starts together (the launcher sums them every 50 ms and kills them all when
a sum passes; each process is also held by its own rlimits): CPU time CPU_SECONDS, resident memory MEMORY_MB (also
each process's RLIMIT_AS), MAX_PROCESSES processes and threads (RLIMIT_NPROC of the call's own user, when root); wall
time WALL_SECONDS. Each process: FILE_MB per written file (RLIMIT_FSIZE, stdout and stderr included: they go to
files, so a snippet printing without end cannot fill the trainer's memory), MAX_FILES open descriptors (sockets
included: their kernel buffers are memory outside the resident sums), no core files. The policy sees at most
MAX_OUTPUT_CHARS of stdout (the start) and of stderr (the end, where a traceback's reason is). When the snippet exits
or a limit is hit, every process it started is killed, however it detached (new session, double fork): the launcher
is their subreaper (Linux) and kills them all.

A snippet never runs as root. As root, each call runs as a user of its own: a uid of UID_RANGE that no other call
on this host holds while it runs (an flock per uid in a directory only root may write), with no capabilities,
no_new_privs and fresh kernel keyrings; before and after the call every process of that uid is killed. So calls
cannot see, signal or trace each other, share a keyring, or use up each other's process limit.

Isolation (ISOLATION, or run_python's `isolation`; `set_isolation` checks a choice at start-up):
- "namespaces" (what "auto" picks as root with CAP_SYS_ADMIN on Linux): new PID, mount, network, IPC and UTS
  namespaces; a root file system holding only the system directories and the interpreter's (read-only), five
  devices, its own /proc and a private /tmp (TMP_MB). It cannot see or signal other processes, read their
  environments, write outside its /tmp, or open any network connection.
- "process" (what "auto" falls back to, with a warning once: root without CAP_SYS_ADMIN, as in a default Docker
  container; not root; macOS): no namespaces. As root the snippet still runs as the call's own user: it cannot read
  other users' processes (the trainer's environment and tokens) or write files it does not own, but it can read
  world-readable files and open network connections. Not root, it runs as the trainer's user and can do what that
  user can: THIS IS A RESOURCE LIMIT, NOT A SECURITY BOUNDARY. Run untrusted policies' code on another host
  (`python -m reward_server --tool python --sandbox namespaces` there, as root in a container or VM of its own,
  and `tool_server: http://HOST:PORT` in the config; docs/tools.md).
"namespaces" refuses to run (an error result; `set_isolation` raises) where they cannot be made. docs/tools.md lists
what a snippet can reach in each mode, as measured by tests/environment/test_sandbox_isolation.py.

A limit hit is an error result: wall or CPU time -> "timeout", memory or processes -> "exception" with a message
naming the limit; a snippet that raises -> "exception" with its output and traceback; exit 0 -> the output.
"""
import contextlib
import json
import logging
import math
import os
import signal
import stat
import subprocess
import sys
import tempfile
import time
from typing import Any, BinaryIO, Callable, Dict, Iterator, List, Optional, Tuple

from .registry import register_tool
from .tool import ToolError

logger = logging.getLogger(__name__)

CPU_SECONDS = 5  # per call: all its processes together
WALL_SECONDS = 8
MEMORY_MB = 1024  # per call: the resident memory of all its processes together (and each one's address space)
FILE_MB = 4
MAX_FILES = 64  # open descriptors per process (RLIMIT_NOFILE): bounds the socket buffers a process can queue
MAX_OUTPUT_CHARS = 2000
TMP_MB = 64  # the private /tmp of an isolated snippet (tmpfs: it counts as memory)
MAX_PROCESSES = 64  # per call: processes (and, as root, threads: RLIMIT_NPROC of the call's own user)
# As root, each call runs as one of these uids (those of an existing user or group are skipped). Below 65536 so
# that they exist in a container whose user namespace maps only 0-65535 (rootless Docker, Podman).
UID_RANGE = range(64000, 64064)
# "auto": namespaces when they can be made (root with CAP_SYS_ADMIN on Linux), else no namespaces; "namespaces":
# refuse to run without them; "process": never use them. set_isolation() changes it after checking.
ISOLATION = "auto"
ISOLATIONS = ("auto", "namespaces", "process")
# Runs the launcher and the snippet. As root without namespaces the call's user must be able to read it: a Python
# under /root (mode 700) is refused with that reason, and $PADDLE_GRPO_SANDBOX_PYTHON names another (the server too).
INTERPRETER = os.environ.get("PADDLE_GRPO_SANDBOX_PYTHON") or sys.executable
_LAUNCHER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sandbox_launcher.py")
_CANNOT_START = "sandbox: cannot start the snippet: "  # sandbox_launcher.CANNOT_START
_KILL_GRACE_S = 5.0  # the launcher enforces the wall limit; this is the backstop if the launcher itself hangs
_warned = []


class SandboxUnavailable(RuntimeError):
    """The isolation asked for (`--sandbox namespaces`, `python_tool_isolation: namespaces`) cannot be had here."""


@register_tool("python")
def python(code: str) -> str:
    """Run a Python snippet and return what it prints (stdout; stderr too when it fails).

    Args:
        code: the program, e.g. print(123*45)
    """
    return run_python(code)


def set_isolation(isolation: str) -> None:
    """Make `isolation` the python tool's (module ISOLATION), checked now: "namespaces" runs a snippet first and
    raises SandboxUnavailable, saying why and how to get them, when it cannot have them."""
    if isolation not in ISOLATIONS:
        raise ValueError(f"isolation must be 'auto', 'namespaces' or 'process', got {isolation!r}")
    if isolation == "namespaces":
        try:
            run_python("print(1)", isolation="namespaces")
        except ToolError as exc:
            raise SandboxUnavailable(
                f"{exc}. Isolation 'namespaces' needs Linux and root with CAP_SYS_ADMIN: in Docker, "
                "`docker run --cap-add SYS_ADMIN ...` (with `--security-opt apparmor=unconfined` where AppArmor "
                "refuses mount), or a VM of its own; "
                "'auto' runs without them (docs/tools.md, \"What a snippet can reach\")") from None
    global ISOLATION
    ISOLATION = isolation


def _lease_dir() -> str:
    """The directory of the uid leases: root's alone (mode 700), or refused: whoever could write there could hold
    or free leases."""
    base = "/run" if os.access("/run", os.W_OK) else tempfile.gettempdir()
    path = os.path.join(base, "paddle_grpo_sandbox")
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o077:
        raise ToolError(f"the python tool cannot run code: {path} is not root's own directory (mode 700); "
                        "remove it")
    return path


def _free_ids() -> List[int]:
    import grp
    import pwd

    def unused(n: int, lookup: Callable[[int], Any]) -> bool:
        try:
            lookup(n)
            return False
        except KeyError:
            return True

    return [n for n in UID_RANGE if unused(n, pwd.getpwuid) and unused(n, grp.getgrgid)]


@contextlib.contextmanager
def _call_user(deadline: float) -> Iterator[Optional[Tuple[int, int]]]:
    """(uid, gid) for one call, held until the call ends: the first id of UID_RANGE no other call of any process on
    this host holds (an exclusive flock on its file, freed by the kernel if the holder dies). None when not root
    (the snippet runs as this user). Waits for a free id until `deadline` (monotonic)."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        yield None
        return
    import fcntl  # POSIX only (the package imports this module on any system)

    directory, ids = _lease_dir(), _free_ids()
    if not ids:
        raise ToolError(f"the python tool cannot run code: every uid of {UID_RANGE} belongs to a user or group")
    while True:
        for n in ids:
            fd = os.open(os.path.join(directory, f"uid-{n}"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            try:
                yield n, n
            finally:
                os.close(fd)  # (closing frees the lock)
            return
        if time.monotonic() > deadline:
            raise ToolError(f"the python tool cannot run code: all {len(ids)} sandbox users are busy", "timeout")
        time.sleep(0.05)


def run_python(code: str, cpu_s: int = CPU_SECONDS, wall_s: float = WALL_SECONDS, memory_mb: int = MEMORY_MB,
               file_mb: int = FILE_MB, max_output_chars: int = MAX_OUTPUT_CHARS, isolation: Optional[str] = None
               ) -> str:
    """Run `code` under the limits (see the module docstring); its stdout on success, else raise ToolError.
    isolation: "auto", "namespaces" or "process" (default: the module's ISOLATION)."""
    if sys.platform == "win32":  # pragma: no cover - resource limits need a POSIX system
        raise ToolError("the python tool needs Linux or macOS (resource limits)")
    isolation = ISOLATION if isolation is None else isolation
    if isolation not in ISOLATIONS:
        raise ValueError(f"isolation must be 'auto', 'namespaces' or 'process', got {isolation!r}")
    start = time.monotonic()
    with _call_user(start + wall_s) as user, tempfile.TemporaryDirectory(prefix="python_tool_") as workdir, \
            tempfile.TemporaryFile() as source, tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        source.write(code.encode("utf-8", errors="surrogatepass"))  # (a lone surrogate: the snippet's SyntaxError)
        source.seek(0)
        settings = {"cpu_s": int(cpu_s), "memory": int(memory_mb) << 20, "fsize": int(file_mb) << 20,
                    "wall_s": float(wall_s), "workdir": workdir, "isolation": isolation, "tmp_mb": TMP_MB,
                    "nproc": MAX_PROCESSES, "nofile": MAX_FILES, "uid": user}
        report = _launch(settings, source, out, err, wall_s)
        elapsed = time.monotonic() - start
        stdout = _read(out, max_output_chars, head=True)
        stderr = _read(err, max_output_chars, head=False)
    try:
        report = json.loads(report)
    except ValueError:  # the launcher was killed by the backstop: it never reported
        report = {"mode": None, "status": None, "timed_out": True, "limit": "wall", "error": None}
    if report.get("error"):
        raise ToolError(f"the python tool cannot run code: {report['error']}")
    if report["mode"] == "process" and isolation == "auto" and not _warned:
        _warned.append(True)
        logger.warning("python tool: snippets run without namespaces (%s): %s (docs/tools.md, the python tool)",
                       "namespaces unavailable" if user else "not root",
                       f"as users of their own (uid {UID_RANGE.start}-{UID_RANGE.stop - 1}), with network access and "
                       "read access to world-readable files" if user else "as this user: a snippet can read what this "
                       "user can read, other processes' environments included")
    return _result(report, stdout, stderr, elapsed, cpu_s, memory_mb, file_mb, wall_s)


def _launch(settings: Dict[str, Any], source: BinaryIO, out: BinaryIO, err: BinaryIO, wall_s: float) -> bytes:
    """Run the launcher (code on its standard input, its report on a pipe); the report's bytes. Every descriptor
    opened here is closed on every path (a launcher that cannot start included)."""
    read_end, write_end = os.pipe()
    try:
        try:
            proc = subprocess.Popen([INTERPRETER, "-I", _LAUNCHER, json.dumps(settings), str(write_end)],
                                    stdin=source, stdout=out, stderr=err, cwd=settings["workdir"], env={},
                                    start_new_session=True, pass_fds=(write_end,))
        finally:
            os.close(write_end)
        try:
            proc.wait(timeout=wall_s + _KILL_GRACE_S)
        except subprocess.TimeoutExpired:
            pass
        finally:
            _kill_group(proc.pid)  # a launcher past its own deadline, and whatever shares its process group
            proc.wait()
        chunks = []
        while True:
            chunk = os.read(read_end, 65536)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
    finally:
        os.close(read_end)


def _result(report: Dict[str, Any], stdout: str, stderr: str, elapsed: float, cpu_s: int, memory_mb: int,
            file_mb: int, wall_s: float) -> str:
    """The snippet's output, or the ToolError its report and output call for."""
    limit, used = report.get("limit"), report.get("used")
    status = report["status"]
    if status is not None:
        status = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    if status == 126 and stderr.startswith(_CANNOT_START):
        raise ToolError(f"the python tool cannot run code: {stderr[len(_CANNOT_START):].strip()}")
    if limit is None and status == 0:
        return stdout + (f"\n[stderr]\n{stderr}" if stderr else "")
    output = "\n".join(p for p in (stdout.rstrip("\n"), stderr and "[stderr]\n" + stderr) if p) or "(no output)"
    if limit == "wall" or report.get("timed_out"):
        raise ToolError(f"the code did not finish within the wall-time limit of {wall_s:g} s; output so far:\n"
                        f"{output}", "timeout")
    if limit == "cpu" or status == -signal.SIGXCPU or (status == -signal.SIGKILL and elapsed >= cpu_s):
        raise ToolError(f"the code used up its CPU-time limit of {cpu_s} s (all its processes together); output "
                        f"so far:\n{output}", "timeout")
    if limit == "memory":
        # rounded up: the sum passed the limit by as little as a page, and "1024 MB" would read as within it
        raise ToolError(f"the code hit the memory limit of {memory_mb} MB (all its processes together: "
                        f"{math.ceil(used / (1 << 20))} MB resident); output:\n{output}")
    if limit == "processes":
        raise ToolError(f"the code started more than {MAX_PROCESSES} processes; output:\n{output}")
    if "MemoryError" in stderr[-300:] or status in (-signal.SIGSEGV, -signal.SIGABRT):
        raise ToolError(f"the code hit the memory limit of {memory_mb} MB (exit status {status}); output:\n{output}")
    if status == -signal.SIGXFSZ or "File too large" in stderr[-300:]:
        raise ToolError(f"the code wrote more than the file-size limit of {file_mb} MB; output:\n{output}")
    raise ToolError(f"the code exited with status {status}:\n{output}")


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _read(f: BinaryIO, limit: int, head: bool) -> str:
    """At most `limit` characters of the file: its start (stdout) or its end (stderr), with a note of the cut."""
    size = f.seek(0, os.SEEK_END)
    window = 4 * limit  # a character is at most 4 bytes of UTF-8
    f.seek(0 if head else max(size - window, 0))
    text = f.read(window).decode("utf-8", errors="replace")
    if size <= window and len(text) <= limit:
        return text
    shown = text[:limit] if head else text[-limit:]
    cut = size - len(shown.encode("utf-8", errors="replace"))
    return shown + f"\n[... {cut} more bytes not shown]" if head else f"[... {cut} bytes not shown ...]\n" + shown
