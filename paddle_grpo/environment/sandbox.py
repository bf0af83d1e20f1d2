"""The built-in `python` tool: runs a snippet in a fresh Python process with resource limits.

    python(code="print(123*45)") -> "5535\\n"

Each call: `sys.executable -I -c <code>` (isolated mode: no user site-packages, no PYTHON* variables, the script's
directory not on sys.path) in a new session (its own process group, killed as a whole at the end), with an empty
environment (Python adds LC_CTYPE itself when it coerces the C locale), its own temporary directory as the working
directory (removed afterwards), and these limits (module constants; `run_python` takes others):
- CPU time CPU_SECONDS (RLIMIT_CPU), address space MEMORY_MB (RLIMIT_AS), each written file FILE_MB (RLIMIT_FSIZE,
  stdout and stderr included: they go to files, so a snippet printing without end cannot fill the trainer's
  memory), no core files; wall time WALL_SECONDS (then the process group is killed);
- the policy sees at most MAX_OUTPUT_CHARS of stdout (the start) and of stderr (the end, where a traceback's
  reason is).
The limits are set by a tiny launcher inside the child, which then exec()s the snippet's interpreter (rather than
a `preexec_fn`, which is not safe in a process with threads, like the rollout's tool threads).

A limit hit is an error result: wall or CPU time -> "timeout", memory -> "exception" with a message naming the limit;
a snippet that raises -> "exception" with its output and traceback; exit 0 -> the output.

THIS IS A RESOURCE LIMIT, NOT A SECURITY BOUNDARY. The snippet runs as the trainer's user, can read every file that
user can read, open network connections, and start processes (RLIMIT_NPROC counts all of the user's processes, so
it is not set). Run untrusted policies' code on another host: `python -m reward_server --tool python --port 8732`
there (in a container or VM of its own), and `tool_server: http://HOST:8732` in the config (docs/tools.md).
"""
import os
import signal
import subprocess
import sys
import tempfile
import time
from typing import BinaryIO

from .registry import register_tool
from .tool import ToolError

CPU_SECONDS = 5
WALL_SECONDS = 8
MEMORY_MB = 1024
FILE_MB = 4
MAX_OUTPUT_CHARS = 2000

# Run by the child's first interpreter: set the limits, then become the snippet's interpreter (limits survive exec).
_LAUNCHER = """
import os, resource, sys
cpu, memory, fsize = (int(x) for x in sys.argv[1:4])
resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
os.execv(sys.executable, [sys.executable, "-I", "-c", sys.argv[4]])
"""


@register_tool("python")
def python(code: str) -> str:
    """Run a Python snippet and return what it prints (stdout; stderr too when it fails).

    Args:
        code: the program, e.g. print(123*45)
    """
    return run_python(code)


def run_python(code: str, cpu_s: int = CPU_SECONDS, wall_s: float = WALL_SECONDS, memory_mb: int = MEMORY_MB,
               file_mb: int = FILE_MB, max_output_chars: int = MAX_OUTPUT_CHARS) -> str:
    """Run `code` under the limits (see the module docstring); its stdout on success, else raise ToolError."""
    if sys.platform == "win32":  # pragma: no cover - resource limits need a POSIX system
        raise ToolError("the python tool needs Linux or macOS (resource limits)")
    with tempfile.TemporaryDirectory(prefix="python_tool_") as workdir, \
            tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        argv = [sys.executable, "-I", "-c", _LAUNCHER, str(int(cpu_s)), str(int(memory_mb) << 20),
                str(int(file_mb) << 20), code]
        start = time.monotonic()
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err, cwd=workdir, env={},
                                start_new_session=True)
        try:
            proc.wait(timeout=wall_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            _kill_group(proc.pid)  # the snippet's own children too
            proc.wait()
        elapsed = time.monotonic() - start
        stdout = _read(out, max_output_chars, head=True)
        stderr = _read(err, max_output_chars, head=False)
    status = proc.returncode
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
