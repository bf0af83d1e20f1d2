"""A real `python -m reward_server` killed in the middle of a training run and started again 30 s later on the same
port: the run waits (the client retries within reward_server_max_wait_s, logging every wait), completes, logs every
step once, and trains exactly what an uninterrupted run trains."""
import logging
import re
import threading
import time

from fault_helpers import assert_same_history, assert_same_weights, make_cfg, read_rows, write_data
from paddle_grpo.trainer import Trainer

OUTAGE_S = 30.0


def test_a_reward_server_restarted_30_s_later_costs_time_not_the_run(tmp_path, tiny_policy_dir, start_cli,
                                                                     free_port, caplog):
    data = write_data(tmp_path)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    reward = f"{data / 'rewards.py'}:name_reward"
    servers = [start_cli(port, "--reward", reward)]
    server = dict(use_rm_server=True, reward_funcs="", reward_server=url, max_steps=5)
    Trainer(make_cfg(data, tiny_policy_dir, tmp_path / "ref", **server)).train()

    out = tmp_path / "out"
    events = {}

    def outage():  # kill the server once step 2 is logged; start it again 30 s later
        metrics = out / "metrics.jsonl"
        while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 2):
            time.sleep(0.05)
        servers[0].kill()
        servers[0].wait()
        events["killed"] = time.monotonic()
        time.sleep(OUTAGE_S)
        servers.append(start_cli(port, "--reward", reward))
        events["back"] = time.monotonic()

    thread = threading.Thread(target=outage, daemon=True)
    thread.start()
    with caplog.at_level(logging.WARNING, logger="paddle_grpo.rewards.client"):
        Trainer(make_cfg(data, tiny_policy_dir, out, **server)).train()
    thread.join(timeout=120)
    assert events["back"] - events["killed"] >= OUTAGE_S

    assert [r["step"] for r in read_rows(out / "metrics.jsonl")] == [1, 2, 3, 4, 5]
    assert_same_history(out, tmp_path / "ref")
    assert_same_weights(out / "checkpoint-5", tmp_path / "ref" / "checkpoint-5")
    waits = [r.getMessage() for r in caplog.records if "retrying in" in r.getMessage()]
    pattern = (rf"reward server {re.escape(url)} failed \(attempt (\d+), request \w+\): (.+); retrying in "
               r"([\d.]+) s \(([\d.]+) s of the 600 s wait budget left, reward_server_max_wait_s\)")
    parsed = [re.fullmatch(pattern, w) for w in waits]
    assert parsed and all(parsed), waits
    # one request retried with growing waits (0.5 s doubling up to 30 s, +-20 % jitter; logged to 0.1 s) until the
    # server was back
    assert [int(m.group(1)) for m in parsed] == list(range(1, len(parsed) + 1))
    delays = [float(m.group(3)) for m in parsed]
    nominal = [min(0.5 * 2 ** k, 30.0) for k in range(len(delays))]
    assert all(0.8 * n - 0.05 <= d <= 1.2 * n + 0.05 for n, d in zip(nominal, delays)), delays
    assert sum(delays) >= OUTAGE_S - 5  # ~30 s of waiting, less the time the failed attempts themselves took
    # The kill may land while a request is in flight ("Connection aborted": the server closed it unanswered); every
    # attempt during the outage itself is refused.
    reasons = [m.group(2) for m in parsed]
    assert all(r.startswith("ConnectionError: ") for r in reasons), reasons
    assert all("Connection refused" in r for r in reasons[1:]), reasons
    assert "Connection refused" in reasons[0] or "Connection aborted" in reasons[0], reasons
