"""Fixtures for real reward servers on free loopback ports: in-process (waitress in a thread) or as a subprocess
started through the CLI (`python -m reward_server`)."""
import os
import socket
import subprocess
import sys
import time

import pytest
import requests



def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def free_port():
    """free_port() -> a loopback port nobody listens on right now."""
    return _free_port


def wait_healthy(url, proc=None, timeout_s=30.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"reward server exited with {proc.returncode}: {proc.log_path.read_text()[-2000:]}")
        try:
            if requests.get(url + "/health", timeout=1).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"reward server at {url} not healthy within {timeout_s} s")


@pytest.fixture
def start_cli(repo_root, tmp_path):
    """start_cli(port, *args, wait=True, env=None) -> Popen of `python -m reward_server --port PORT ARGS` (`env`:
    variables added to its environment), its stderr in `proc.log_path` (a file, so a chatty server never blocks on
    a full pipe); killed after the test."""
    procs = []

    def start(port, *args, wait=True, env=None):
        extra = env or {}
        env = {**os.environ, "PYTHONPATH": str(repo_root) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        env.pop("REWARD_SERVER_TOKEN", None)
        env.update(extra)
        log_path = tmp_path / f"server-{port}-{len(procs)}.log"
        with open(log_path, "wb") as log:
            proc = subprocess.Popen([sys.executable, "-m", "reward_server", "--port", str(port), *args],
                                    cwd=str(repo_root), env=env, stdout=log, stderr=subprocess.STDOUT)
        proc.log_path = log_path
        procs.append(proc)
        if wait:
            wait_healthy(f"http://127.0.0.1:{port}", proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
