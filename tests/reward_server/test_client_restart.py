"""The client against a real `python -m reward_server` that is stopped and restarted on the same port mid-run,
and one that never comes back."""
import threading
import time

import pytest

from paddle_grpo.rewards.client import RewardClient, RewardServerError

TGT = "(1) Ann is a knight\n(2) Bob is a knave"
BATCH = (["q"] * 3, [TGT] * 3, ["x</think><answer>Ann is a knight, Bob is a knave</answer>",
                                "x</think><answer>Ann is a knave, Bob is a knave</answer>", "no answer"])
EXPECTED = [3.0, -0.5, -3.0]


def test_survives_restart_then_fails_loudly(start_cli, free_port, caplog):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = start_cli(port, "--reward", "kk")
    client = RewardClient(url, connect_timeout=1, read_timeout=10, max_retries=8, backoff=0.1, max_backoff=0.5)
    restarted = []

    def restart():
        time.sleep(0.3)
        restarted.append(start_cli(port, "--reward", "kk", wait=False))

    results = []
    for step in range(12):
        if step == 4:  # the server dies between two training steps and comes back a moment later
            server.kill()
            server.wait()
            threading.Thread(target=restart).start()
        results.append(client.score(*BATCH))
    assert results == [EXPECTED] * 12
    assert restarted and restarted[0].poll() is None
    assert any("Connection refused" in r.getMessage() for r in caplog.records), "the outage was never seen"

    # Now it dies for good: a few quick retries, then an error naming the server and the failure.
    restarted[0].kill()
    restarted[0].wait()
    quick = RewardClient(url, connect_timeout=1, read_timeout=5, max_retries=2, backoff=0.05)
    with pytest.raises(RewardServerError) as info:
        quick.score(*BATCH)
    message = str(info.value)
    assert message.count(f"{url} -> ConnectionError") == 3 and "Connection refused" in message
