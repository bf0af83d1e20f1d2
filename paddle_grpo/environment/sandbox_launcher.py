"""The `python` tool's launcher: run as `python -I sandbox_launcher.py SETTINGS_JSON STATUS_FD < CODE_FILE` by
sandbox.run_python, with the interpreter the snippet is to run with.

Self-contained on purpose (standard library only, no package imports): it runs in a fresh interpreter in isolated
mode, where the package may not be importable, and it must be small enough to read in one sitting. It

1. becomes a child subreaper (Linux): every process the snippet starts and orphans is re-parented to it, however
   it detaches (fork, setsid, double fork), so it can kill them all at the end;
2. as root, ends every process left of the call's user (SETTINGS "uid": one of a range, leased to this call alone
   by sandbox.py) before and after the call, so that nothing of an earlier call shares its user;
3. with isolation "namespaces" (root with CAP_SYS_ADMIN on Linux; "auto" picks it when it can): new PID, mount,
   network, IPC and UTS namespaces. A first child is PID 1 of the new PID namespace (when it exits the kernel kills
   every process left in it; it dies with the launcher through PR_SET_PDEATHSIG) and builds a root of its own: an
   empty tmpfs with read-only bind mounts of the system directories (/usr, /bin, /lib*, /etc) and of the Python
   interpreter's directories, /dev with null, zero, full, random, urandom only, a /proc of the new PID namespace,
   and a private tmpfs /tmp; it chroots there;
4. starts the snippet (`python -I -`: the code is read from standard input, the CODE_FILE, so that no length of
   code meets the kernel's limit on arguments) with the resource limits, as the call's user when root (no
   capabilities, no_new_privs, fresh kernel keyrings), and watches the budget of the whole call: every
   CHECK_EVERY_S it sums the CPU time (live processes and those already gone) and the resident memory of all the
   call's processes, counts them, and kills them all when a sum passes its budget or the wall time is up;
5. writes one JSON line to STATUS_FD: {"mode", "status" (the snippet's wait status), "timed_out", "limit" (null,
   "wall", "cpu", "memory" or "processes": what ended the call early), "used" (the sum that passed it: CPU seconds,
   bytes or processes), "error" (why the snippet could not start, or null)}.
"""
import ctypes
import json
import os
import resource
import select
import signal
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWPID, CLONE_NEWNET = \
    0x00020000, 0x04000000, 0x08000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = \
    1, 2, 4, 8, 32, 4096, 16384, 1 << 18
PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 1, 36, 38
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
DEVICES = ("null", "zero", "full", "random", "urandom")
CHECK_EVERY_S = 0.05  # how often the call's budget is summed (each process is also held by its own rlimits)
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
# Where a user without namespaces can leave files for later (on the host, not in a namespace's private /tmp)
WORLD_WRITABLE_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock", "/var/lock", "/dev/mqueue")
IPC_RMID = 0
CANNOT_START = "sandbox: cannot start the snippet: "  # sandbox.py reads a failure to start by this prefix
# keyctl(2): not in glibc (libkeyutils has it), so called by number; architectures not listed keep their keyrings
KEYCTL_SYSCALL = {"x86_64": 250, "aarch64": 219, "i686": 288, "riscv64": 219, "ppc64le": 311, "s390x": 280}
KEYCTL_JOIN_SESSION_KEYRING, KEYCTL_CLEAR, KEYCTL_GET_PERSISTENT = 1, 7, 22
KEY_SPEC_SESSION_KEYRING, KEY_SPEC_USER_KEYRING, KEY_SPEC_USER_SESSION_KEYRING = -3, -4, -5

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


def fresh_keyrings() -> None:
    """Give this process (already the call's user) a new session keyring and empty the user's own keyrings.

    Kernel keyrings outlive processes: a key one call adds to its user keyring (`@u`, kept for the life of the
    user namespace since Linux 5.3) would be there for the next call of the same user, a channel between calls.
    Where keyctl is refused (a container's seccomp profile) or unknown there is no keyring to clear."""
    nr = KEYCTL_SYSCALL.get(os.uname().machine)
    if _libc is None or nr is None:
        return
    keyctl = (lambda *args: _libc.syscall(nr, *(ctypes.c_long(a) for a in args)))
    keyctl(KEYCTL_JOIN_SESSION_KEYRING, 0)  # an anonymous session keyring, gone with the call's processes
    for ring in (KEY_SPEC_USER_KEYRING, KEY_SPEC_USER_SESSION_KEYRING):
        keyctl(KEYCTL_CLEAR, ring)
    persistent = keyctl(KEYCTL_GET_PERSISTENT, -1, KEY_SPEC_SESSION_KEYRING)
    if persistent > 0:
        keyctl(KEYCTL_CLEAR, persistent)


def run_snippet(settings: Dict[str, Any], workdir: str, drop_to: Optional[Tuple[int, int]]) -> None:
    """In the forked child: the limits, the user, then exec the snippet's interpreter on the code in fd 0. Never
    returns."""
    try:
        for name, value in (("RLIMIT_CPU", (settings["cpu_s"], settings["cpu_s"] + 1)),
                            ("RLIMIT_AS", (settings["memory"],) * 2), ("RLIMIT_FSIZE", (settings["fsize"],) * 2),
                            ("RLIMIT_NOFILE", (settings["nofile"],) * 2), ("RLIMIT_CORE", (0, 0))):
            resource.setrlimit(getattr(resource, name), value)
        if drop_to is not None:
            uid, gid = drop_to
            os.chown(workdir, uid, gid)
            # RLIMIT_NPROC counts the real user's processes: the call's user is this call's alone (leased by
            # sandbox.py), so it bounds this call's processes and threads, and no other call's.
            resource.setrlimit(resource.RLIMIT_NPROC, (settings["nproc"],) * 2)
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            fresh_keyrings()
            for path in (sys.executable, os.path.dirname(os.__file__)):
                if not os.access(path, os.R_OK | os.X_OK):
                    raise PermissionError(
                        f"the call's user (uid {uid}) cannot read {path}: a directory above the interpreter is "
                        "closed to other users; name one they can run in $PADDLE_GRPO_SANDBOX_PYTHON (e.g. "
                        "/usr/bin/python3) or give the process CAP_SYS_ADMIN for isolation 'namespaces' "
                        "(docs/tools.md)")
        if _libc is not None:
            prctl(PR_SET_NO_NEW_PRIVS, 1)
        os.chdir(workdir)
        os.execve(sys.executable, [sys.executable, "-I", "-"], {})
    except BaseException as exc:  # noqa: B902 - report any failure to start, never run on as the launcher
        os.write(2, f"{CANNOT_START}{type(exc).__name__}: {exc}\n".encode())
    os._exit(126)


def as_user(uid: int, work: Callable[[], None]) -> None:
    """Run `work` in a child that has become user `uid` (as root) and wait for it: for what only the owner may do
    without CAP_SYS_ADMIN, which a container's root often lacks (signal every process of the user, remove its System
    V IPC objects)."""
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            work()
            status = 0
        finally:
            os._exit(status)
    os.waitpid(pid, 0)


def kill_user(uid: int) -> None:
    """SIGKILL every process of user `uid` (as root): a child becomes that user and signals all it may, i.e. the
    user's processes, until none is left (kill(-1) skips the caller itself)."""
    def kill_all() -> None:
        try:
            for _ in range(100):  # a fork bomb forks while it is killed: again until nothing answers
                os.kill(-1, signal.SIGKILL)
        except OSError:  # ESRCH: no process of the user is left
            pass

    as_user(uid, kill_all)


def remove_leftovers(uid: int) -> None:
    """Remove what user `uid` left outside its processes (no namespaces): its entries in the host's world-writable
    directories and its System V shared memory, queues and semaphores. Both outlive the call: memory outside its
    budget, and a channel to the next call of the same user."""
    import shutil

    for directory in WORLD_WRITABLE_DIRS:
        try:
            entries = list(os.scandir(directory))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.stat(follow_symlinks=False).st_uid != uid:
                    continue
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path, ignore_errors=True)
                else:
                    os.unlink(entry.path)
            except OSError:
                pass
    # IPC_RMID takes the object's owner or CAP_SYS_ADMIN: removed by the user itself, so that a container's root
    # without that capability removes them too (it left a 1 MB segment there: test_sandbox_budget under setpriv)
    as_user(uid, lambda: _remove_ipc(uid))


def _remove_ipc(uid: int) -> None:
    """Remove the System V shared memory segments, message queues and semaphore sets user `uid` owns or created."""
    for kind, remove in (("shm", lambda i: _libc.shmctl(i, IPC_RMID, None)),
                         ("msg", lambda i: _libc.msgctl(i, IPC_RMID, None)),
                         ("sem", lambda i: _libc.semctl(i, 0, IPC_RMID))):
        try:
            with open(f"/proc/sysvipc/{kind}") as f:
                header, *rows = [line.split() for line in f]
        except (OSError, ValueError):
            continue
        for row in rows:
            fields = dict(zip(header, row))
            if uid in (int(fields.get("uid", -1)), int(fields.get("cuid", -1))):
                remove(int(row[1]))


def children(pid: int) -> List[int]:
    """PIDs whose parent is `pid`: from /proc/PID/task/*/children where the kernel has it, else a scan of /proc."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    found: List[int] = []
    if os.path.exists(f"/proc/{pid}/task/{tasks[0]}/children"):
        for tid in tasks:
            try:
                with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                    found.extend(int(p) for p in f.read().split())
            except OSError:
                pass
        return found
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


def usage(baseline_cpu_s: float) -> Tuple[float, int, int]:
    """(CPU seconds, resident bytes, processes) of everything below this process. CPU: the reaped children's
    (getrusage, which includes what they reaped) minus `baseline_cpu_s`, plus each live process's own and its
    reaped children's (/proc/PID/stat: utime, stime, cutime, cstime); a process is counted once, alive or gone.
    Resident memory sums each process's RSS, so pages shared after a fork count in each (an over-estimate)."""
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s, rss_pages, count = reaped.ru_utime + reaped.ru_stime - baseline_cpu_s, 0, 0
    todo = children(os.getpid())
    while todo:
        pid = todo.pop()
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:  # gone since it was listed
            continue
        count += 1
        cpu_s += sum(int(x) for x in fields[11:15]) / CLOCK_TICKS
        rss_pages += int(fields[21])
        todo.extend(children(pid))
    return cpu_s, rss_pages * PAGE_BYTES, count


def watch(pid: int, settings: Dict[str, Any]) -> Tuple[Optional[int], Optional[str], Optional[float]]:
    """Wait for the snippet `pid` while the call keeps to its budget: (its wait status or None, the limit that
    ended it early or None, the sum that passed it). Orphans re-parented here are reaped as they exit, so that
    their CPU time is counted (getrusage). Without signals (an alarm could fire after the child was reaped): a
    pidfd polled with select where there is one (Linux 5.3+), else short sleeps."""
    deadline = time.monotonic() + settings["wall_s"]
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    baseline = reaped.ru_utime + reaped.ru_stime
    budgets = (("cpu", settings["cpu_s"]), ("memory", settings["memory"]), ("processes", settings["nproc"]))
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        pidfd = None
    try:
        while True:
            while True:
                try:
                    waited, status = os.waitpid(-1, os.WNOHANG)
                except ChildProcessError:
                    waited = 0
                if waited == pid:
                    return status, None, None
                if not waited:
                    break
            left = deadline - time.monotonic()
            if left <= 0:
                return None, "wall", settings["wall_s"]
            for (limit, budget), used in zip(budgets, usage(baseline)):
                if used > budget:
                    return None, limit, used
            if pidfd is not None:
                select.select([pidfd], [], [], min(left, CHECK_EVERY_S))
            else:
                time.sleep(min(left, CHECK_EVERY_S / 10))
    finally:
        if pidfd is not None:
            os.close(pidfd)


def supervise(settings: Dict[str, Any], workdir: str, drop_to: Optional[Tuple[int, int]],
              in_namespace: bool) -> Dict[str, Any]:
    """Start the snippet, watch it (`watch`), kill everything left. Returns the status dict."""
    pid = os.fork()
    if pid == 0:
        run_snippet(settings, workdir, drop_to)
    status, limit, used = watch(pid, settings)
    if status is None:
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
    return {"status": status, "timed_out": limit == "wall", "limit": limit, "used": used}


def report_to(status_fd: int, report: Dict[str, Any]) -> int:
    os.write(status_fd, json.dumps(report).encode())
    return 0


def main(argv: List[str]) -> int:
    settings, status_fd = json.loads(argv[1]), int(argv[2])
    os.set_inheritable(status_fd, False)  # the snippet never gets it
    isolation = settings["isolation"]
    user = tuple(settings["uid"]) if settings.get("uid") is not None else None
    report = {"mode": "process", "status": None, "timed_out": False, "limit": None, "used": None, "error": None}
    if os.geteuid() == 0 and user is None:  # sandbox.run_python always leases one: never run a snippet as root
        return report_to(status_fd, {**report, "error": "running as root without a user to run the snippet as"})
    if _libc is not None:
        prctl(PR_SET_CHILD_SUBREAPER, 1)
    if user is not None:
        kill_user(user[0])  # (before unshare: a process forked after it would be PID 1 of the new namespace)
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
            return report_to(status_fd, {**report, "error": f"isolation 'namespaces' is not available here ({why})"})
    if namespaces:  # (the kernel kills what is left in them when their PID 1 exits)
        report["mode"] = "namespaces"
        report.update(in_namespaces(settings, user))
    else:
        try:
            report.update(supervise(settings, settings["workdir"], user, False))
        finally:
            if user is not None:
                kill_user(user[0])  # (nothing should be left; this makes sure before the user is leased again)
                remove_leftovers(user[0])
    return report_to(status_fd, report)


def in_namespaces(settings: Dict[str, Any], user: Optional[Tuple[int, int]]) -> Dict[str, Any]:
    """supervise() in PID 1 of the new namespaces, after it has built the snippet's root."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # PID 1 of the new namespaces
        os.close(read_end)
        try:
            # (getppid() is 0 here: the launcher is outside the namespace. Were it killed before this line, the
            # runner's kill of its process group, which this process is in, ends this one too.)
            prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
            workdir = build_root(settings["workdir"], settings["tmp_mb"], os.path.basename(settings["workdir"]))
            result = supervise(settings, workdir, user, True)
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
    os.close(read_end)
    os.waitpid(pid, 0)
    return json.loads(b"".join(chunks) or b'{"error": "the sandbox\'s first process died"}')


if __name__ == "__main__":
    sys.exit(main(sys.argv))
