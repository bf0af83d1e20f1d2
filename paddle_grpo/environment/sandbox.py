"""The built-in `python` tool: runs a snippet in a fresh Python process with resource limits and, where it can,
in namespaces of its own.

    python(code="print(123*45)") -> "5535\\n"

Each call starts sandbox_launcher.py (a fresh interpreter), which starts `sys.executable -I -c <code>` (isolated
mode: no user site-packages, no PYTHON* variables) with an empty environment (Python adds LC_CTYPE itself when it
coerces the C locale), a working directory of its own (removed afterwards), and these limits (module constants;
`run_python` takes others):
- CPU time CPU_SECONDS (RLIMIT_CPU), address space MEMORY_MB (RLIMIT_AS), each written file FILE_MB (RLIMIT_FSIZE,
  stdout and stderr included: they go to files, so a snippet printing without end cannot fill the trainer's
  memory), no core files; wall time WALL_SECONDS;
- the policy sees at most MAX_OUTPUT_CHARS of stdout (the start) and of stderr (the end, where a traceback's
  reason is).
When the snippet exits or its wall time is up, every process it started is killed, however it detached (new
session, double fork): the launcher is their subreaper (Linux) and kills them all.

Isolation (ISOLATION, or run_python's `isolation`):
- "namespaces" (what "auto" picks as root on Linux): new PID, mount, network, IPC and UTS namespaces; a root file
  system holding only the system directories and the interpreter's (read-only), five devices, its own /proc and a
  private /tmp (TMP_MB); the snippet runs as `nobody` with RLIMIT_NPROC MAX_PROCESSES. It cannot see or signal
  other processes, read their environments, write outside its /tmp, or open any network connection.
- "process" (what "auto" falls back to otherwise, with a warning once): the snippet runs as the trainer's user:
  it can read and write what that user can, read the environment of that user's processes (the trainer's
  tokens included), and open network connections. THIS IS A RESOURCE LIMIT, NOT A SECURITY BOUNDARY: run untrusted
  policies' code on another host (`python -m reward_server --tool python` there, as root in a container or VM of
  its own, and `tool_server: http://HOST:PORT` in the config; docs/tools.md).
"namespaces" refuses to run (an error result) where they cannot be made. docs/tools.md lists what a snippet can
reach in each mode, as measured by tests/environment/test_sandbox_isolation.py.

A limit hit is an error result: wall or CPU time -> "timeout", memory -> "exception" with a message naming the limit;
a snippet that raises -> "exception" with its output and traceback; exit 0 -> the output.
"""
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from typing import BinaryIO, Optional, Tuple

from .registry import register_tool
from .tool import ToolError

logger = logging.getLogger(__name__)

CPU_SECONDS = 5
WALL_SECONDS = 8
MEMORY_MB = 1024
FILE_MB = 4
MAX_OUTPUT_CHARS = 2000
TMP_MB = 64  # the private /tmp of an isolated snippet (tmpfs: it counts as memory)
MAX_PROCESSES = 256  # RLIMIT_NPROC of `nobody` (processes and threads of all snippets running at once)
# "auto": namespaces when they can be made (root on Linux), else the snippet runs as this user; "namespaces":
# refuse to run without them; "process": never use them (the fallback, forced; for tests).
ISOLATION = "auto"
_LAUNCHER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sandbox_launcher.py")
_KILL_GRACE_S = 5.0  # the launcher enforces the wall limit; this is the backstop if the launcher itself hangs
_warned = []


@register_tool("python")
def python(code: str) -> str:
    """Run a Python snippet and return what it prints (stdout; stderr too when it fails).

    Args:
        code: the program, e.g. print(123*45)
    """
    return run_python(code)


def _nobody() -> Tuple[int, int]:
    import pwd  # POSIX only

    try:
        entry = pwd.getpwnam("nobody")
        return entry.pw_uid, entry.pw_gid
    except KeyError:
        return 65534, 65534


def run_python(code: str, cpu_s: int = CPU_SECONDS, wall_s: float = WALL_SECONDS, memory_mb: int = MEMORY_MB,
               file_mb: int = FILE_MB, max_output_chars: int = MAX_OUTPUT_CHARS, isolation: Optional[str] = None
               ) -> str:
    """Run `code` under the limits (see the module docstring); its stdout on success, else raise ToolError.
    isolation: "auto", "namespaces" or "process" (default: the module's ISOLATION)."""
    if sys.platform == "win32":  # pragma: no cover - resource limits need a POSIX system
        raise ToolError("the python tool needs Linux or macOS (resource limits)")
    isolation = ISOLATION if isolation is None else isolation
    if isolation not in ("auto", "namespaces", "process"):
        raise ValueError(f"isolation must be 'auto', 'namespaces' or 'process', got {isolation!r}")
    with tempfile.TemporaryDirectory(prefix="python_tool_") as workdir, \
            tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        settings = {"code": code, "cpu_s": int(cpu_s), "memory": int(memory_mb) << 20, "fsize": int(file_mb) << 20,
                    "wall_s": float(wall_s), "workdir": workdir, "isolation": isolation, "tmp_mb": TMP_MB,
                    "nproc": MAX_PROCESSES, "nobody": _nobody()}
        read_end, write_end = os.pipe()
        start = time.monotonic()
        try:
            proc = subprocess.Popen([sys.executable, "-I", _LAUNCHER, json.dumps(settings), str(write_end)],
                                    stdin=subprocess.DEVNULL, stdout=out, stderr=err, cwd=workdir, env={},
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
            with os.fdopen(read_end, "rb") as f:
                report = f.read()
        elapsed = time.monotonic() - start
        stdout = _read(out, max_output_chars, head=True)
        stderr = _read(err, max_output_chars, head=False)
    try:
        report = json.loads(report)
    except ValueError:  # the launcher was killed by the backstop: it never reported
        report = {"mode": None, "status": None, "timed_out": True, "error": None}
    if report.get("error"):
        raise ToolError(f"the python tool cannot run code: {report['error']}")
    if report["mode"] == "process" and isolation == "auto" and not _warned:
        _warned.append(True)
        logger.warning("python tool: snippets run as this user without namespaces (%s): a snippet can read what "
                       "this user can read, other processes' environments included (docs/tools.md, the python tool)",
                       "not root" if hasattr(os, "geteuid") and os.geteuid() != 0 else "namespaces unavailable")
    timed_out = report["timed_out"]
    status = report["status"]
    if status is not None:
        status = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    if not timed_out and status == 0:
        return stdout + (f"\n[stderr]\n{stderr}" if stderr else "")
    output = "\n".join(p for p in (stdout.rstrip("\n"), stderr and "[stderr]\n" + stderr) if p) or "(no output)"
    if timed_out:
        raise ToolError(f"the code did not finish within the wall-time limit of {wall_s:g} s; output so far:\n"
                        f"{output}", "timeout")
    if status == -signal.SIGXCPU or (status == -signal.SIGKILL and elapsed >= cpu_s):
        raise ToolError(f"the code used up its CPU-time limit of {cpu_s} s; output so far:\n{output}", "timeout")
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
