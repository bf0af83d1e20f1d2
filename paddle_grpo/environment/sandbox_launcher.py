"""The `python` tool's launcher: run as `python -I sandbox_launcher.py SETTINGS_JSON STATUS_FD` by sandbox.run_python.

Self-contained on purpose (standard library only, no package imports): it runs in a fresh interpreter in isolated
mode, where the package may not be importable, and it must be small enough to read in one sitting. It

1. becomes a child subreaper (Linux): every process the snippet starts and orphans is re-parented to it, however
   it detaches (fork, setsid, double fork), so it can kill them all at the end;
2. with isolation "namespaces" (root on Linux; "auto" picks it when it can): new PID, mount, network, IPC and UTS
   namespaces. A first child is PID 1 of the new PID namespace (when it exits the kernel kills every process left
   in it; it dies with the launcher through PR_SET_PDEATHSIG) and builds a root of its own: an empty tmpfs with
   read-only bind mounts of the system directories (/usr, /bin, /lib*, /etc) and of the Python interpreter's
   directories, /dev with null, zero, full, random, urandom only, a /proc of the new PID namespace, and a private
   tmpfs /tmp; it chroots there, and the snippet runs as `nobody` (no capabilities, no_new_privs);
3. starts the snippet (`python -I -c CODE`) with the resource limits, waits at most the wall time, kills every
   process that is left, and writes one JSON line to STATUS_FD: {"mode", "status" (a wait status), "timed_out",
   "error" (why the snippet could not start, or null)}.
"""
import ctypes
import json
import os
import resource
import select
import signal
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWPID, CLONE_NEWNET = \
    0x00020000, 0x04000000, 0x08000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = \
    1, 2, 4, 8, 32, 4096, 16384, 1 << 18
PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 1, 36, 38
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
DEVICES = ("null", "zero", "full", "random", "urandom")

_libc = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def prctl(option: int, value: int) -> None:
    _check(_libc.prctl(option, ctypes.c_ulong(value), 0, 0, 0), f"prctl({option})")


def mount(source: Optional[str], target: str, fstype: Optional[str], flags: int,
          data: Optional[str] = None) -> None:
    enc = (lambda s: s.encode() if s is not None else None)
    _check(_libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)),
           f"mount {source or ''} on {target}")


def bind_read_only(source: str, target: str) -> None:
    """`source` at `target`, read-only (a bind mount is made first, then remounted read-only)."""
    mount(source, target, None, MS_BIND | MS_REC)
    mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)


def python_dirs() -> List[str]:
    """The directories the interpreter needs (its prefixes, real paths), outermost only."""
    dirs = {os.path.realpath(d) for d in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix)}
    dirs.add(os.path.dirname(os.path.realpath(sys.executable)))
    dirs.add(os.path.dirname(os.path.abspath(sys.executable)))
    return sorted(d for d in dirs if not any(d != o and d.startswith(o.rstrip("/") + "/") for o in dirs))


def build_root(root: str, tmp_mb: int, workdir_name: str) -> str:
    """Make `root` (an empty directory) the snippet's whole file system (see the module docstring); chroot there.
    Runs in the new mount namespace, as PID 1 of the new PID namespace. Returns the working directory to use."""
    mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing below propagates to the host's mounts
    mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=755")
    for path in SYSTEM_DIRS:
        if os.path.islink(path):
            os.symlink(os.readlink(path), root + path)
        elif os.path.isdir(path):
            os.makedirs(root + path, mode=0o755)
            bind_read_only(path, root + path)
    # The private /tmp first: an interpreter that lives under /tmp (a virtual environment in a clone there) is then
    # bind-mounted inside it, instead of its directories making /tmp exist before the tmpfs is mounted.
    os.makedirs(root + "/tmp", mode=0o1777)
    mount("tmpfs", root + "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, f"size={tmp_mb}m,mode=1777")
    for path in python_dirs():
        if any(path == d or path.startswith(d + "/") for d in SYSTEM_DIRS):
            continue  # already there (a system Python)
        os.makedirs(root + path, mode=0o755, exist_ok=True)
        bind_read_only(path, root + path)
    os.makedirs(root + "/dev", mode=0o755)
    mount("tmpfs", root + "/dev", "tmpfs", MS_NOSUID | MS_NOEXEC, "size=64k,mode=755")
    for name in DEVICES:
        open(f"{root}/dev/{name}", "w").close()
        mount(f"/dev/{name}", f"{root}/dev/{name}", None, MS_BIND)
    os.makedirs(root + "/proc", mode=0o555)
    mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    workdir = "/tmp/" + workdir_name
    os.mkdir(root + workdir, 0o700)
    os.chroot(root)
    return workdir


def run_snippet(settings: Dict[str, Any], workdir: str, drop_to: Optional[Tuple[int, int]]) -> None:
    """In the forked child: the limits, the user, then exec the snippet's interpreter. Never returns."""
    try:
        for name, value in (("RLIMIT_CPU", (settings["cpu_s"], settings["cpu_s"] + 1)),
                            ("RLIMIT_AS", (settings["memory"],) * 2), ("RLIMIT_FSIZE", (settings["fsize"],) * 2),
                            ("RLIMIT_CORE", (0, 0))):
            resource.setrlimit(getattr(resource, name), value)
        if drop_to is not None:
            uid, gid = drop_to
            os.chown(workdir, uid, gid)
            # RLIMIT_NPROC counts the real user's processes: `nobody`'s are only snippets, so it bounds a fork bomb.
            resource.setrlimit(resource.RLIMIT_NPROC, (settings["nproc"],) * 2)
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
        if _libc is not None:
            prctl(PR_SET_NO_NEW_PRIVS, 1)
        os.chdir(workdir)
        os.execve(sys.executable, [sys.executable, "-I", "-c", settings["code"]], {})
    except BaseException as exc:  # noqa: B902 - report any failure to start, never run on as the launcher
        os.write(2, f"sandbox: cannot start the snippet: {type(exc).__name__}: {exc}\n".encode())
    os._exit(126)


def children(pid: int) -> List[int]:
    """PIDs whose parent is `pid` (from /proc)."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    stat = f.read()
            except OSError:
                continue
            if int(stat[stat.rindex(b")") + 2:].split()[1]) == pid:
                found.append(int(name))
    return found


def kill_descendants() -> None:
    """SIGKILL every process below this one, round after round: killing a process re-parents its children to
    this subreaper, so the next round sees them. Ends when none is left."""
    me = os.getpid()
    while True:
        kids = children(me)
        if not kids:
            return
        for pid in kids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for pid in kids:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass


def wait_at_most(pid: int, seconds: float) -> Optional[int]:
    """The wait status of child `pid`, or None when it is still running after `seconds`. Without signals (an alarm
    could fire after the child was reaped): a pidfd polled with select where there is one (Linux 5.3+), else a
    short sleep between non-blocking waits."""
    deadline = time.monotonic() + seconds
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        pidfd = None
    try:
        delay = 0.001
        while True:
            waited, status = os.waitpid(pid, os.WNOHANG)
            if waited:
                return status
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            if pidfd is not None:
                select.select([pidfd], [], [], left)
            else:
                time.sleep(min(delay, left))
                delay = min(delay * 2, 0.01)
    finally:
        if pidfd is not None:
            os.close(pidfd)


def supervise(settings: Dict[str, Any], workdir: str, drop_to: Optional[Tuple[int, int]],
              in_namespace: bool) -> Dict[str, Any]:
    """Start the snippet, wait at most the wall time, kill everything left. Returns the status dict."""
    pid = os.fork()
    if pid == 0:
        run_snippet(settings, workdir, drop_to)
    status = wait_at_most(pid, settings["wall_s"])
    timed_out = status is None
    if timed_out:
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
    if in_namespace:
        try:
            os.kill(-1, signal.SIGKILL)  # as PID 1: every other process of the namespace (then reaped below)
        except ProcessLookupError:  # none is left
            pass
    if _libc is not None:
        kill_descendants()
    # (macOS: no subreaper; what stayed in the launcher's process group dies when sandbox.run_python kills it.)
    return {"status": status, "timed_out": timed_out}


def main(argv: List[str]) -> int:
    settings, status_fd = json.loads(argv[1]), int(argv[2])
    os.set_inheritable(status_fd, False)  # the snippet never gets it
    isolation = settings["isolation"]
    report = {"mode": "process", "status": None, "timed_out": False, "error": None}
    if _libc is not None:
        prctl(PR_SET_CHILD_SUBREAPER, 1)
    namespaces = False
    if isolation in ("auto", "namespaces"):
        why = "needs Linux" if _libc is None else "needs root" if os.geteuid() != 0 else None
        if why is None:
            flags = CLONE_NEWPID | CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS
            if _libc.unshare(flags) == 0:
                namespaces = True
            else:
                why = f"unshare failed: {os.strerror(ctypes.get_errno())}"
        if why is not None and isolation == "namespaces":
            report["error"] = f"isolation 'namespaces' is not available here ({why})"
            os.write(status_fd, json.dumps(report).encode())
            return 0
    if not namespaces:
        report.update(supervise(settings, settings["workdir"], None, False))
        os.write(status_fd, json.dumps(report).encode())
        return 0
    report["mode"] = "namespaces"
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # PID 1 of the new namespaces
        os.close(read_end)
        try:
            # (getppid() is 0 here: the launcher is outside the namespace. Were it killed before this line, the
            # runner's kill of its process group, which this process is in, ends this one too.)
            prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
            workdir = build_root(settings["workdir"], settings["tmp_mb"], os.path.basename(settings["workdir"]))
            result = supervise(settings, workdir, tuple(settings["nobody"]), True)
        except Exception as exc:  # the namespace could not be set up: said plainly, not run without it
            result = {"error": f"the sandbox could not be set up: {type(exc).__name__}: {exc}"}
        os.write(write_end, json.dumps(result).encode())
        os._exit(0)
    os.close(write_end)
    chunks = []
    while True:
        chunk = os.read(read_end, 65536)
        if not chunk:
            break
        chunks.append(chunk)
    os.waitpid(pid, 0)
    report.update(json.loads(b"".join(chunks) or b'{"error": "the sandbox\'s first process died"}'))
    os.write(status_fd, json.dumps(report).encode())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
