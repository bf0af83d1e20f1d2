"""A token with whitespace around it, from each source, on the real CLI (`python -m reward_server`): stripped on
both sides, so the server answers the token itself; a source with nothing but whitespace refuses to start."""
import os
import subprocess
import sys

import pytest
import requests

from reward_server import create_app

CALL = {"name": "calculator", "arguments": {"expression": "6*7"}}


@pytest.mark.parametrize("source", ["env", "--token", "--token-file"])
def test_a_token_with_whitespace_around_it_is_stripped(start_cli, free_port, tmp_path, source):
    port = free_port()
    padded = " \tT0k-padded \r\n"
    if source == "env":
        proc = start_cli(port, "--tool", "calculator", env={"REWARD_SERVER_TOKEN": padded})
    elif source == "--token":
        proc = start_cli(port, "--tool", "calculator", "--token", padded)
    else:
        (tmp_path / "token").write_text(padded)
        proc = start_cli(port, "--tool", "calculator", "--token-file", str(tmp_path / "token"))
    url = f"http://127.0.0.1:{port}/tool"
    ok = requests.post(url, json=CALL, headers={"Authorization": "Bearer T0k-padded"}, timeout=10)
    assert (ok.status_code, ok.json().get("content")) == (200, "42"), ok.text
    assert requests.post(url, json=CALL, timeout=10).status_code == 401  # still a token server
    assert proc.poll() is None


@pytest.mark.parametrize("argv, env, message", [
    ([], {"REWARD_SERVER_TOKEN": " \t\n"}, "$REWARD_SERVER_TOKEN is only whitespace: set it to the token, or unset it"),
    (["--token", "  "], {}, "--token is empty or only whitespace: give the token, or leave --token out"),
    (["--token", ""], {}, "--token is empty or only whitespace: give the token, or leave --token out"),
])
def test_a_token_of_only_whitespace_refuses_to_start(repo_root, argv, env, message):
    environ = {k: v for k, v in os.environ.items() if k != "REWARD_SERVER_TOKEN"}
    done = subprocess.run([sys.executable, "-m", "reward_server", "--port", "0", "--reward", "kk", *argv],
                          cwd=str(repo_root), env={**environ, **env}, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stderr.rstrip().endswith(message), done.stderr[-500:]


def test_create_app_strips_the_token_too(serve):
    url = serve(create_app("kk", token=" s3cret\n")).url
    batch = {"src": ["q"], "tgt": ["(1) Ann is a knight"],
             "response": ["<think>x</think><answer>Ann is a knight</answer>"]}
    reply = requests.post(url + "/", json=batch, headers={"Authorization": "Bearer s3cret"}, timeout=10)
    assert (reply.status_code, reply.json()["score"]) == (200, [3.0])
    with pytest.raises(ValueError, match="token is empty or only whitespace"):
        create_app("kk", token=" ")
