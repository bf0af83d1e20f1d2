"""What a `python` tool snippet can reach, measured with real snippets in real subprocesses, for both isolation
modes: "namespaces" (root on Linux: what tests and CI run here) and "process" (the fallback, forced here; what a
user who is not root gets). docs/tools.md's "What a snippet can reach" states these results."""
import json
import os
import pathlib
import shutil
import socket
import subprocess
import sys
import tempfile
import uuid

import pytest
from sandbox_helpers import interpreter_for_call_users

from paddle_grpo.environment import sandbox
from paddle_grpo.environment.sandbox import run_python
from paddle_grpo.environment.tool import ToolError

from .test_sandbox import running_with


def _namespaces_available():
    try:
        return run_python("print(1)", isolation="namespaces") == "1\n"
    except ToolError:
        return False


NAMESPACES = _namespaces_available()
needs_namespaces = pytest.mark.skipif(not NAMESPACES, reason="namespaces need root on Linux (unshare)")
BOTH = [pytest.param("namespaces", marks=needs_namespaces), "process"]


def run(code, isolation, **limits):
    try:
        return run_python(code, isolation=isolation, **limits)
    except ToolError as exc:
        return f"ToolError: {exc}"


@pytest.mark.parametrize("isolation", BOTH)
def test_detached_processes_die_with_the_call(isolation):
    # A snippet that starts a process in a new session and a double-forked daemon (setsid between the forks), waits
    # until both run, and returns at once. Before the launcher was a subreaper / PID 1, both outlived the call.
    marker = f"detached-{uuid.uuid4().hex}"
    code = f"""
import os, subprocess, sys, time
sleeper = "import os, sys, time; open(sys.argv[1], 'w').close(); time.sleep(60)"
subprocess.Popen([sys.executable, '-c', sleeper, '{marker}-setsid'], start_new_session=True)
pid = os.fork()
if pid == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv(sys.executable, [sys.executable, '-c', sleeper, '{marker}-daemon'])
    os._exit(0)
os.waitpid(pid, 0)
deadline = time.monotonic() + 20
while not all(os.path.exists(f'{marker}-' + kind) for kind in ('setsid', 'daemon')):
    assert time.monotonic() < deadline, 'the detached processes did not start'
    time.sleep(0.01)
print('both running')
"""
    assert run(code, isolation) == "both running\n"
    assert running_with(marker) == []


@pytest.mark.parametrize("isolation", BOTH)
def test_wall_limit_kills_detached_processes(isolation):
    marker = f"timeout-{uuid.uuid4().hex}"
    code = f"""
import os, subprocess, sys, time
subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)', '{marker}'], start_new_session=True)
print('started', flush=True)
time.sleep(60)
"""
    assert run(code, isolation, wall_s=1.5).startswith("ToolError: the code did not finish within the wall-time")
    assert running_with(marker) == []


SCAN_ENVIRONS = """
import os
found = []
for pid in [os.getppid()] + [p for p in os.listdir('/proc') if p.isdigit()]:
    try:
        data = open(f'/proc/{pid}/environ', 'rb').read() + open(f'/proc/{pid}/cmdline', 'rb').read()
    except OSError:
        continue
    if bytes.fromhex('SECRET_HEX') in data:  # (hex: the snippet's own command line must not hold the needle)
        found.append(pid)
print(os.getuid(), 'found' if found else 'not found')
"""


def scan_from_a_trainer(isolation, repo_root, code=SCAN_ENVIRONS, wrap=()):
    """`code`'s output when run_python runs in a "trainer": a process started with a token in its environment
    (what /proc/<pid>/environ shows is the environment a process started with, so the token must be there from the
    start, not set later with os.environ); `wrap`: a command the trainer runs under (setpriv)."""
    secret = f"s3cret-{uuid.uuid4().hex}"
    trainer = ("import sys; from paddle_grpo.environment import sandbox; sandbox.INTERPRETER = sys.argv[3]; "
               "print(sandbox.run_python(sys.argv[1], isolation=sys.argv[2]), end='')")
    env = {**os.environ, "REWARD_SERVER_TOKEN": secret, "PYTHONPATH": str(repo_root)}
    done = subprocess.run([*wrap, sys.executable, "-c", trainer, code.replace("SECRET_HEX", secret.encode().hex()),
                           isolation, interpreter_for_call_users()], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


# Root without CAP_SYS_ADMIN, as in a default Docker container: the capability leaves the bounding set, so the
# trainer started under it has it in none of its sets and cannot make namespaces.
WITHOUT_SYS_ADMIN = ("setpriv", "--bounding-set", "-sys_admin", "--inh-caps", "-sys_admin")
needs_setpriv_as_root = pytest.mark.skipif(
    not (hasattr(os, "geteuid") and os.geteuid() == 0 and shutil.which("setpriv")),
    reason="taking CAP_SYS_ADMIN away needs root and setpriv (util-linux)")


@needs_setpriv_as_root
def test_root_without_cap_sys_admin_never_runs_a_snippet_as_root(repo_root, tmp_path):
    # Measured before: "auto" fell back to uid 0, the snippet read the token from its parent's environ and could
    # write into the checkout. Now it runs as a user of its own: no token, no write; what stays open in this mode
    # (docs/tools.md) is the network, shown here by a connection to a listener on 127.0.0.1.
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        target = repo_root / f"escape-{uuid.uuid4().hex}"
        code = SCAN_ENVIRONS + f"""
try:
    open({str(target)!r}, 'w').write('x')
    print('wrote')
except OSError as exc:
    print(type(exc).__name__)
import socket
socket.create_connection(('127.0.0.1', {listener.getsockname()[1]}), timeout=5).close()
print('connected')
"""
        out = scan_from_a_trainer("auto", repo_root, code, WITHOUT_SYS_ADMIN).splitlines()
    uid, found = out[0].split(maxsplit=1)
    assert int(uid) in sandbox.UID_RANGE and found == "not found", out
    assert out[1:] == ["PermissionError", "connected"], out
    assert not target.exists()


@needs_setpriv_as_root
def test_root_without_cap_sys_admin_removes_the_calls_ipc(repo_root):
    # IPC_RMID takes the object's owner or CAP_SYS_ADMIN: as a container's root (no CAP_SYS_ADMIN) the launcher
    # removed the call's files but left its 1 MB shared memory segment, memory outside every budget.
    key = int(uuid.uuid4().hex[:7], 16)
    snippet = f"import ctypes; print(ctypes.CDLL(None).shmget({key}, 1 << 20, 0o1000 | 0o666) >= 0)"
    done = subprocess.run([*WITHOUT_SYS_ADMIN, sys.executable, "-c",
                           f"from paddle_grpo.environment import sandbox; print(sandbox.run_python({snippet!r}))"],
                          env={**os.environ, "PYTHONPATH": str(repo_root)}, capture_output=True, text=True,
                          timeout=120)
    assert done.stdout.strip() == "True", (done.stdout, done.stderr)
    with open("/proc/sysvipc/shm") as f:
        keys = [int(line.split()[0]) for line in list(f)[1:]]
    assert key not in keys


@needs_setpriv_as_root
def test_demanding_namespaces_fails_at_start_up_without_cap_sys_admin(repo_root):
    done = subprocess.run([*WITHOUT_SYS_ADMIN, sys.executable, "-c",
                           "from paddle_grpo.environment import sandbox; sandbox.set_isolation('namespaces')"],
                          env={**os.environ, "PYTHONPATH": str(repo_root)}, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 1
    assert ("SandboxUnavailable: the python tool cannot run code: isolation 'namespaces' is not available here "
            "(unshare failed: Operation not permitted). Isolation 'namespaces' needs Linux and root with "
            "CAP_SYS_ADMIN") in done.stderr, done.stderr


@needs_namespaces
def test_namespaces_hide_the_parents_environment(repo_root):
    # The trainer's environment holds a token. The snippet's own environment is empty; it reads /proc/<ppid>/environ
    # and every other /proc/<pid>/environ and cmdline it can see: no token.
    uid, found = scan_from_a_trainer("namespaces", repo_root).split(maxsplit=1)
    assert int(uid) in sandbox.UID_RANGE and found == "not found\n"
    # It sees the processes of its own namespace only: the launcher's first process (1) and itself.
    listed = run("import os; print(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))", "namespaces")
    assert listed == "[1, 2]\n"


def test_process_isolation_hides_the_parents_environment_from_root_too(repo_root):
    # Without namespaces a trainer that is root still never runs a snippet as root: it runs as a user of its own,
    # which may not read root's /proc/<pid>/environ. (Before, "process" kept uid 0 and found the token; a trainer
    # that is not root runs it as its own user, which finds it: test_a_user_who_is_not_root_gets_the_process_...)
    uid, found = scan_from_a_trainer("process", repo_root).split(maxsplit=1)
    if os.geteuid() == 0:
        assert int(uid) in sandbox.UID_RANGE and found == "not found\n"
    else:
        assert (int(uid), found) == (os.getuid(), "found\n")


@needs_namespaces
def test_namespaces_keep_writes_inside(tmp_path, repo_root):
    # A world-writable directory, the repository, the interpreter's directory and /tmp: nothing the snippet writes
    # reaches the host, and a world-readable data file of the run is not there to read.
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    os.chmod(tmp_path, 0o755)
    data = tmp_path / "train.jsonl"
    data.write_text('{"src": "q", "tgt": "the answer"}\n')
    os.chmod(data, 0o644)
    name = f"escape-{uuid.uuid4().hex}"
    targets = [str(shared / name), str(repo_root / name), os.path.join(os.path.dirname(sandbox.INTERPRETER), name),
               f"/usr/{name}", f"/tmp/{name}", f"/dev/shm/{name}"]
    code = f"""
for path in {targets!r}:
    try:
        open(path, 'w').write('x')
        print('wrote', path)
    except OSError as exc:
        print(type(exc).__name__, path)
try:
    print(open({str(data)!r}).read())
except OSError as exc:
    print(type(exc).__name__, 'data')
"""
    out = run(code, "namespaces").splitlines()
    read_only = ("OSError", "PermissionError")  # EROFS (the bind mounts are read-only), or the directory's mode
    assert out[0] == f"FileNotFoundError {targets[0]}"  # the test's directories are not in the snippet's root
    # Nor the repository, unless the interpreter's environment lives inside it (the README's `.venv` in the clone,
    # as in CI): then the directories above the venv exist in the snippet's root, root-owned and not writable.
    assert out[1] in (f"FileNotFoundError {targets[1]}", f"PermissionError {targets[1]}"), out
    assert out[2].split()[0] in read_only and out[3].split()[0] in read_only, out
    assert out[4] == f"wrote /tmp/{name}"  # its own /tmp
    assert out[5] == f"FileNotFoundError /dev/shm/{name}"  # its /dev holds five devices only
    assert out[6] == "FileNotFoundError data"
    assert not any(os.path.exists(t) for t in targets)  # /tmp's write went to the snippet's own tmpfs


@needs_namespaces
def test_namespaces_have_no_network():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.settimeout(0.5)
        port = listener.getsockname()[1]
        code = f"""
import socket
try:
    socket.create_connection(('127.0.0.1', {port}), timeout=2)
    print('connected')
except OSError as exc:
    print(type(exc).__name__)
"""
        assert run(code, "namespaces") in ("ConnectionRefusedError\n", "OSError\n")  # no interface is up
        with pytest.raises(socket.timeout):
            listener.accept()


@needs_namespaces
def test_namespaces_bound_the_number_of_processes(monkeypatch):
    # RLIMIT_NPROC of `nobody`: a fork bomb stops at the limit, and the call ends with everything killed.
    monkeypatch.setattr(sandbox, "MAX_PROCESSES", 20)
    marker = f"bomb-{uuid.uuid4().hex}"
    code = """
import os, sys, time
started = 0
try:
    while started < 100:
        if os.fork() == 0:
            time.sleep(60)
            os._exit(0)
        started += 1
except OSError as exc:
    print(started, type(exc).__name__)
"""
    out = run(code + f"# {marker}", "namespaces")
    started = int(out.split()[0])
    assert 0 < started < 20 and out.split()[1] == "BlockingIOError", out  # EAGAIN
    assert running_with(marker) == []


def test_an_unknown_isolation_is_refused():
    with pytest.raises(ValueError, match="isolation must be 'auto', 'namespaces' or 'process', got 'chroot'"):
        run_python("print(1)", isolation="chroot")


def _python_for(uid, gid):
    """An interpreter the user `uid` can run (this one, or the system's), or None."""
    for exe in (sys.executable, "/usr/bin/python3"):
        try:
            done = subprocess.run([exe, "-I", "-c", "print(1)"], user=uid, group=gid, extra_groups=[],
                                  capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.SubprocessError):
            continue
        if done.stdout == "1\n":
            return exe
    return None


def _readable_by(uid, gid, python, path):
    """Whether the user `uid` can read the file `path` (every directory above it enterable)."""
    done = subprocess.run([python, "-I", "-c", "import sys; open(sys.argv[1]).read(1); print(1)", path], user=uid,
                          group=gid, extra_groups=[], capture_output=True, text=True, timeout=60)
    return done.stdout == "1\n"


def run_launcher_as(uid, gid, python, isolation, code, base):
    """The launcher run as user `uid` (what a trainer that is not root runs), in a directory of `base`: (its JSON
    report, the snippet's stdout)."""
    workdir = base / f"work-{isolation}"
    workdir.mkdir()
    os.chown(workdir, uid, gid)
    settings = {"cpu_s": 5, "memory": 1 << 30, "fsize": 4 << 20, "wall_s": 10.0, "workdir": str(workdir),
                "isolation": isolation, "tmp_mb": 16, "nproc": 64, "nofile": 64, "uid": None}
    read_end, write_end = os.pipe()
    try:
        done = subprocess.run([python, "-I", sandbox._LAUNCHER, json.dumps(settings), str(write_end)], input=code,
                              user=uid, group=gid, extra_groups=[], cwd=str(workdir), env={}, pass_fds=(write_end,),
                              capture_output=True, text=True, timeout=60)
    finally:
        os.close(write_end)
    with os.fdopen(read_end, "rb") as f:
        report = json.loads(f.read())
    assert "cannot start" not in done.stderr, done.stderr
    return report, done.stdout


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="switching to another user needs root")
def test_a_user_who_is_not_root_gets_the_process_fallback(tmp_path):
    # The launcher itself, run as `nobody` as a user's trainer would run as that user: "auto" falls back to
    # "process" (the snippet runs as that user), detached processes still die (a subreaper needs no privilege),
    # and "namespaces" is refused with its reason rather than run without them.
    import pwd

    entry = pwd.getpwnam("nobody")
    uid, gid = entry.pw_uid, entry.pw_gid
    python = _python_for(uid, gid)
    if python is None:
        pytest.skip("no interpreter that `nobody` can run")
    if not _readable_by(uid, gid, python, sandbox._LAUNCHER):
        # (The product runs the launcher as the trainer's own user; only this simulation runs it as `nobody`.)
        pytest.skip(f"`nobody` cannot read the launcher {sandbox._LAUNCHER} (the checkout is inside a directory "
                    "only its owner may enter, e.g. one made by mktemp -d): this test runs it as that user")
    marker = f"nonroot-{uuid.uuid4().hex}"
    code = f"""
import os, subprocess, sys, time
subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)', '{marker}'], start_new_session=True)
time.sleep(0.5)
print(os.getuid())
"""
    base = pathlib.Path(tempfile.mkdtemp(prefix="sandbox_nonroot_"))  # (pytest's tmp_path is root's, mode 700)
    try:
        os.chmod(base, 0o755)
        report, stdout = run_launcher_as(uid, gid, python, "auto", code, base)
        assert (report["mode"], report["error"], report["timed_out"], report["status"]) == ("process", None, False, 0)
        assert stdout == f"{uid}\n"
        assert running_with(marker) == []
        report, _ = run_launcher_as(uid, gid, python, "namespaces", "print(1)", base)
        assert report["error"] == "isolation 'namespaces' is not available here (needs root)"
    finally:
        shutil.rmtree(base)


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="users of their own per call need root")
def test_an_interpreter_the_calls_user_cannot_run_is_refused_with_the_reason(tmp_path, monkeypatch):
    # As root without namespaces the snippet runs as the call's user: a Python in a directory closed to others (a
    # venv linking to /root/.pyenv, mode 700) cannot start there, and the result says why and what to do, instead
    # of a bare exit status 1 from an interpreter that could not read its standard library.
    private = tmp_path / "private"
    private.mkdir()
    os.chmod(private, 0o700)
    (private / "python3").symlink_to(interpreter_for_call_users())
    monkeypatch.setattr(sandbox, "INTERPRETER", str(private / "python3"))
    with pytest.raises(ToolError) as info:
        run_python("print(1)", isolation="process")
    prefix = "the python tool cannot run code: PermissionError: the call's user (uid "
    assert str(info.value).startswith(prefix), str(info.value)
    assert int(str(info.value)[len(prefix):].split(")")[0]) in sandbox.UID_RANGE
    assert f"cannot read {private / 'python3'}: a directory above the interpreter is closed to other users; name " \
           "one they can run in $PADDLE_GRPO_SANDBOX_PYTHON" in str(info.value)
