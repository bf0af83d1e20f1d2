"""Demanding isolation at start-up: the trainer's `tool_sandbox` key and the tool server's `--sandbox` flag.
"namespaces" where they cannot be made (root without CAP_SYS_ADMIN, as in a default Docker container: setpriv takes
it away) stops the start with a message that says how to get them; where they can, the snippets run in them."""
import os
import socket
import subprocess
import sys
import time

import pytest
import requests

from paddle_grpo.config import ConfigError, config_from_dict, inert_key_messages
from paddle_grpo.environment import sandbox

from .test_sandbox_isolation import NAMESPACES, WITHOUT_SYS_ADMIN, needs_namespaces, needs_setpriv_as_root

BASE = dict(actor_model_name_or_path="unused", use_rm_server=False, reward_funcs="kk", train_datasets="unused",
            rollout_n=2, global_batch_size=2, max_dec_len=16, min_dec_len=1, max_prompt_len=16, max_length=40,
            kl_coeff=0.0, tools="calculator,python")
UNAVAILABLE = ("isolation 'namespaces' is not available here (unshare failed: Operation not permitted). Isolation "
               "'namespaces' needs Linux and root with CAP_SYS_ADMIN")


@pytest.fixture(autouse=True)
def keep_isolation(monkeypatch):
    monkeypatch.setattr(sandbox, "ISOLATION", sandbox.ISOLATION)  # set_isolation changes it: restored after


def test_tool_sandbox_is_a_documented_choice():
    assert config_from_dict(BASE).tool_sandbox == "auto"
    with pytest.raises(ConfigError, match="^<dict>: key 'tool_sandbox' = 'chroot': must be one of 'auto', "
                                          "'namespaces', 'process'"):
        config_from_dict({**BASE, "tool_sandbox": "chroot"})
    cfg = config_from_dict({**BASE, "tool_sandbox": "namespaces", "tool_server": "http://127.0.0.1:9"})
    assert inert_key_messages(cfg, {"tool_sandbox": "<dict>"}, "cpu") == [
        "<dict>: key 'tool_sandbox' has no effect here: the tools run on tool_server: its own --sandbox sets their "
        "isolation"]


@needs_namespaces
def test_tool_sandbox_namespaces_reaches_the_python_tool():
    from paddle_grpo.step.collection import build_tools

    build_tools(config_from_dict({**BASE, "tool_sandbox": "namespaces"}), tokenizer=None)
    assert sandbox.ISOLATION == "namespaces"
    build_tools(config_from_dict({**BASE, "tool_sandbox": "process"}), tokenizer=None)
    assert sandbox.ISOLATION == "process"
    assert sandbox.run_python("import os; print(os.getpid() > 2)") == "True\n"  # the host's PID namespace


@needs_setpriv_as_root
def test_a_trainer_demanding_namespaces_refuses_to_start_without_them(repo_root):
    # The run (build_tools) and its dry run (check_tools) both refuse, naming the key.
    script = ("from paddle_grpo.config import ConfigError, config_from_dict\n"
              "from paddle_grpo.dry_run import check_tools\n"
              "from paddle_grpo.step.collection import build_tools\n"
              f"cfg = config_from_dict({dict(BASE, tool_sandbox='namespaces')!r})\n"
              "print(' | '.join(check_tools(cfg)))\n"
              "try:\n    build_tools(cfg, tokenizer=None)\n"
              "except ConfigError as e:\n    print(e)\nelse:\n    print('started')\n")
    done = subprocess.run([*WITHOUT_SYS_ADMIN, sys.executable, "-c", script], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(repo_root)}, timeout=120)
    dry, run = done.stdout.splitlines()
    assert dry.startswith(f"tool_sandbox: 'namespaces': the python tool cannot run code: {UNAVAILABLE}"), dry
    assert run.startswith(f"key 'tool_sandbox' ('namespaces'): the python tool cannot run code: {UNAVAILABLE}"), run


def _server(repo_root, port, *args, wrap=()):
    env = {**os.environ, "PYTHONPATH": str(repo_root), "REWARD_SERVER_TOKEN": "t0ken"}
    return subprocess.Popen([*wrap, sys.executable, "-m", "reward_server", "--port", str(port), "--tool", "python",
                             *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@needs_setpriv_as_root
def test_a_tool_server_demanding_namespaces_refuses_to_start_without_them(repo_root):
    proc = _server(repo_root, 0, "--sandbox", "namespaces", wrap=WITHOUT_SYS_ADMIN)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 2
    assert f"reward_server: --sandbox namespaces: the python tool cannot run code: {UNAVAILABLE}" in out, out


@pytest.mark.skipif(not NAMESPACES, reason="namespaces need root with CAP_SYS_ADMIN on Linux")
def test_a_tool_server_with_namespaces_runs_snippets_in_them(repo_root):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = _server(repo_root, port, "--sandbox", "namespaces")
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, "the server did not start"
            try:
                requests.get(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except requests.ConnectionError:
                time.sleep(0.1)
        reply = requests.post(f"http://127.0.0.1:{port}/tool", headers={"Authorization": "Bearer t0ken"},
                              json={"name": "python", "arguments": {"code": "import os; print(sorted(int(p) for p "
                                                                            "in os.listdir('/proc') if p.isdigit()))"}},
                              timeout=30).json()
        assert (reply["error"], reply["content"]) == (None, "[1, 2]\n")  # its own PID namespace
    finally:
        proc.kill()
        proc.wait()
