"""A reward model served over HTTP: in-process (create_app on a real waitress server) and through the CLI
(`python -m reward_server --reward-model DIR`); the scores equal an independent forward pass of the model."""
import subprocess
import sys

import numpy as np
import pytest
import requests

from paddle_grpo.rewards import RewardModel
from reward_server import create_app
from reward_model_helpers import COMPLETIONS, PROMPTS, REWARD_MODEL_TOL, reference_scores

TGT = ["47", "1", "1", "9"]
# Batched, padded scoring against one text at a time: other kernels (reward_model_helpers.REWARD_MODEL_TOL).
TOL = dict(rtol=0, atol=REWARD_MODEL_TOL)


@pytest.mark.numerics
def test_create_app_serves_a_reward_model(serve, tiny_reward_model_dir):
    expected = reference_scores(tiny_reward_model_dir, PROMPTS, COMPLETIONS)
    server = serve(create_app([RewardModel(tiny_reward_model_dir, batch_size=3).load()]))
    reply = requests.post(server.url + "/", json={"src": PROMPTS, "tgt": TGT, "response": COMPLETIONS}, timeout=60)
    body = reply.json()
    assert reply.status_code == 200 and body["error_code"] == 0 and body["errors"] == [None] * 4
    np.testing.assert_allclose(body["score"], expected, **TOL)
    assert body["scores_by_function"]["reward_model"] == body["score"]
    health = requests.get(server.url + "/health", timeout=10).json()
    assert health == {"status": "ok", "rewards": ["reward_model"], "weights": [1.0], "max_score": None,
                      "reward_model": tiny_reward_model_dir}


def test_cli_serves_the_model_with_rule_rewards_and_weights(start_cli, free_port, tiny_reward_model_dir):
    expected = reference_scores(tiny_reward_model_dir, PROMPTS, COMPLETIONS)
    port = free_port()
    start_cli(port, "--reward", "gsm8k", "--reward-model", tiny_reward_model_dir, "--weights", "1,0.5",
              "--reward-batch-size", "2")
    url = f"http://127.0.0.1:{port}"
    health = requests.get(url + "/health", timeout=10).json()
    assert health["rewards"] == ["gsm8k", "reward_model"] and health["reward_model"] == tiny_reward_model_dir
    body = requests.post(url + "/", json={"src": PROMPTS, "tgt": TGT, "response": COMPLETIONS}, timeout=60).json()
    np.testing.assert_allclose(body["scores_by_function"]["reward_model"], expected, **TOL)
    np.testing.assert_allclose(body["score"], [g + 0.5 * e for g, e in zip([1, 0, 0, 1], expected)],
                               **TOL)


def test_cli_refuses_a_missing_model_naming_it(tmp_path, repo_root):
    done = subprocess.run([sys.executable, "-m", "reward_server", "--port", "0", "--reward-model",
                           str(tmp_path / "nope")], capture_output=True, text=True, timeout=120, cwd=str(repo_root))
    assert done.returncode == 2
    assert f"reward model '{tmp_path / 'nope'}': directory {tmp_path / 'nope'} does not exist" in done.stderr
