"""`python -m reward_server` as a real subprocess: flags, token, access log, and start-up errors."""
import subprocess
import sys

import pytest
import requests

from paddle_grpo.rewards.client import RewardClient, RewardRequestError

TGT = "(1) Ann is a knight\n(2) Bob is a knave"
GOOD = "x</think><answer>Ann is a knight; Bob is a knave</answer>"


def test_cli_serves_with_flags(start_cli, free_port):
    port = free_port()
    proc = start_cli(port, "--reward", "kk,tag_format_strict", "--weights", "1,2", "--token", "T0k",
                     "--threads", "4", "--max-body-mb", "1")
    url = f"http://127.0.0.1:{port}"
    assert requests.get(url + "/health", timeout=5).json()["rewards"] == ["kk", "tag_format_strict"]
    client = RewardClient(url, token="T0k", max_retries=0)
    result = client.score_detailed(["q", "q"], [TGT, TGT], [GOOD, "<answer>Ann is a knight</answer>"])
    # sample 1: kk gets "<think>" prepended, so no "</think>" -> format fails: -3; strict tag format holds: +2.
    assert result.scores_by_function == {"kk": [3.0, -3.0], "tag_format_strict": [0.0, 1.0]}
    assert result.scores == [3.0, -1.0]
    with pytest.raises(RewardRequestError, match="HTTP 401: missing token"):
        RewardClient(url, max_retries=0).score(["q"], [TGT], [GOOD])
    big = requests.post(url + "/", json={"src": ["q"], "tgt": ["t"], "response": ["x" * (2 << 20)]},
                        headers={"Authorization": "Bearer T0k"}, timeout=10)
    assert big.status_code == 413 and "exceeds the limit of 1048576 bytes" in big.json()["error_msg"]
    proc.terminate()
    proc.wait(10)
    log = proc.log_path.read_text()
    assert f"reward server listening on http://127.0.0.1:{port} rewards=kk,tag_format_strict" in log
    assert "status=200 batch=2 latency_ms=" in log and "status=401" in log and "status=413" in log


def test_cli_rejects_unknown_reward(repo_root):
    done = subprocess.run([sys.executable, "-m", "reward_server", "--port", "0", "--reward", "kk,nope"],
                          cwd=str(repo_root), capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "cannot load rewards" in done.stderr and "unknown reward 'nope'" in done.stderr and "gsm8k" in done.stderr


def test_cli_rejects_weight_count(repo_root):
    done = subprocess.run([sys.executable, "-m", "reward_server", "--reward", "kk,gsm8k", "--weights", "1"],
                          cwd=str(repo_root), capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "got 1 reward weights for 2 reward functions" in done.stderr


def test_server_imports_stay_light(repo_root):
    # The server must start fast and without paddle; sympy (math-verify) and nltk (rouge) load on first use.
    code = ("import sys, reward_server, reward_server.__main__; "
            "print(sorted(m for m in ('paddle', 'sympy', 'math_verify', 'nltk', 'rouge_score') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], cwd=str(repo_root), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
