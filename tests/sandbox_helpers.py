"""An interpreter the python tool's per-call users can run, for the tests: as root without namespaces a snippet
runs as a user of its own, which cannot run a Python under /root (mode 700), as a checkout's venv often links to.
tests/conftest.py names it in $PADDLE_GRPO_SANDBOX_PYTHON for the whole session (servers started as subprocesses
included); the snippets of the tests use the standard library only, so any Python 3 of the system does."""
import os
import stat
import sys


def readable_by_others(path: str) -> bool:
    """Whether a user other than the owner (and not in its group) can reach and read `path`: every directory
    above it searchable (o+x) and the file itself readable (o+r) and, for an interpreter, executable."""
    path = os.path.realpath(path)
    parts = path.split(os.sep)
    for i in range(2, len(parts)):
        if not os.stat(os.sep.join(parts[:i]) or os.sep).st_mode & stat.S_IXOTH:
            return False
    return bool(os.stat(path).st_mode & stat.S_IROTH)


def interpreter_for_call_users() -> str:
    """This interpreter when the call users (not root) can run it and read its standard library, else the
    system's python3 (a checkout's venv often links to a Python under /root, mode 700), else this one."""
    if readable_by_others(sys.executable) and readable_by_others(os.path.dirname(os.__file__)):
        return sys.executable
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if os.path.exists(candidate) and readable_by_others(candidate):
            return candidate
    return sys.executable
