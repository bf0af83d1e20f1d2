"""A tool server that is down stops the run like a reward server that is down, and calls that JSON cannot carry
never reach it; real tool / reward servers (waitress) on 127.0.0.1, the real ToolEnvironment, a real Trainer on
tool_helpers' tiny policy.

- A call whose arguments hold NaN / Infinity is malformed in the trainer (no request, no 10 s wait), and its turns
  serialize for the reward server.
- The tool server gone (its port closed): the client retries for reward_server_max_wait_s (the reward client's
  budget), longer than tool_timeout_s, and then the rollout raises ToolServerError naming the server; the Trainer
  saves the last completed step through its fault path (run/faults.py), as for RewardServerError, and the error says
  so. No "timeout" tool message is ever made of it.
- The tool server stalled (it lists its tools, then answers no call): tool_server_max_unanswered calls in a row
  without a reply stop the run the same way.
"""
import json
import threading
import time

import pytest
from tool_helpers import REWARD_FILE, build_tool_policy, write_tool_data

from paddle_grpo.config import config_from_dict
from paddle_grpo.data import tokenize_prompts
from paddle_grpo.environment import HermesFormat, RemoteToolSet, ToolCall, ToolEnvironment, ToolServerError
from paddle_grpo.rewards.client import RewardClient
from paddle_grpo.trainer import Trainer
from reward_server import create_app

FMT = HermesFormat()


def turn_ids(tok, body):
    return tokenize_prompts(tok, [f"<tool_call>{body}</tool_call>"])[0]


def test_nan_arguments_are_malformed_before_any_request_and_the_turns_serialize(serve, tool_tokenizer):
    url = serve(create_app([], tools="calculator")).url
    remote = RemoteToolSet(url)
    with ToolEnvironment(remote, FMT, tool_tokenizer, timeout_s=1) as env:
        start = time.perf_counter()
        pending = env.begin(turn_ids(tool_tokenizer, '{"name": "calculator", "arguments": {"expression": NaN}}'),
                            True)
        turn = pending.result()
        # Answered here, without a request: milliseconds (0.5 s of margin for a loaded machine); before, the client
        # retried requests' refusal to serialize NaN until the environment's time limit made it a "timeout".
        assert time.perf_counter() - start < 0.5
    assert turn.results[0].error == "malformed" and "NaN is not a JSON number" in turn.results[0].content
    assert pending.assistant["tool_calls"][0]["arguments"] is None
    # The row's turns go to the reward server as JSON (use_rm_server): they serialize, and the server reads them.
    reward = serve(create_app([lambda prompts, completions, turns=None, **kw: [float(len(turns[0]))]]))
    scored = RewardClient(reward.url, max_wait_s=1).score_detailed(["q"], [""], ["a"],
                                                                   turns=[[pending.assistant, *turn.messages]])
    assert scored.scores == [2.0]
    # The client itself refuses such arguments as the call's fault (bad_arguments), never as a transport failure.
    direct = remote.call(ToolCall("calculator", {"expression": float("inf")}))
    assert direct.error == "bad_arguments" and "cannot be sent as JSON" in direct.content


def test_a_dead_tool_server_raises_after_the_wait_budget_never_a_timeout(serve, tool_tokenizer):
    server = serve(create_app([], tools="calculator"))
    remote = RemoteToolSet(server.url, retries=-1, max_wait_s=1.5, backoff_s=0.1)
    server.stop()  # the port is closed: every request is refused
    with ToolEnvironment(remote, FMT, tool_tokenizer, timeout_s=0.3) as env:
        start = time.perf_counter()
        pending = env.begin(turn_ids(tool_tokenizer, '{"name": "calculator", "arguments": {"expression": "1"}}'),
                            True)
        assert not pending.done()
        time.sleep(0.6)  # twice the environment's time limit: still waiting for the client, not a timeout
        assert not pending.done()
        while not pending.done():
            time.sleep(0.01)
        waited = time.perf_counter() - start
        with pytest.raises(ToolServerError) as info:
            pending.result()
    # The budget counts from the first failure (at once: connection refused); the last wait ends at it. 1.0 s of
    # margin above for thread scheduling and the refused connections on a loaded machine.
    assert 1.5 <= waited < 2.5, waited
    message = str(info.value)
    assert message.startswith(f"tool server {server.url}/tool failed ") and "Connection refused" in message
    assert "max_wait_s = 1.5 s (the trainer's reward_server_max_wait_s)" in message


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    d = tmp_path_factory.mktemp("tool_faults")
    build_tool_policy(str(d / "policy"))
    write_tool_data(str(d))
    (d / "rewards.py").write_text(REWARD_FILE)
    return d


def assert_saved_step_1(error, out):
    """The run stopped by `error` in step 2 saved step 1 (and said so), logged step 1 only, and rewound step 2's
    draw of prompts."""
    assert error.__notes__ == [f"ToolServerError at step 1: saved a checkpoint of the last completed step, "
                               f"{out}/checkpoint-1: re-running the same command resumes from it with nothing lost"]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1] and rows[0]["rollout/tool_timeout_rate"] == 0.0
    state = json.loads((out / "checkpoint-1" / "trainer_state.json").read_text())
    assert state["step"] == 1 and state["sampler"]["position"] == 4  # step 2's draw rewound


def remote_tools_config(workdir, url, out, **extra):
    """A 3-step run of the tiny tool policy whose calculator is served at `url` (tool calls time out at 0.5 s, a
    server down is waited for 2 s), writing to `out`; `extra` keys on top."""
    return config_from_dict(dict(
        actor_model_name_or_path=str(workdir / "policy"), tools="calculator", tool_server=url, max_turns=3,
        tool_timeout_s=0.5, reward_server_max_wait_s=2, use_rm_server=False,
        reward_funcs=f"{workdir / 'rewards.py'}:used_calculator", train_datasets=str(workdir / "train.jsonl"),
        output_dir=str(out), max_prompt_len=256, max_dec_len=128, min_dec_len=1, max_length=384,
        max_tool_response_len=32, global_batch_size=4, rollout_n=4, per_device_train_batch_size=8,
        per_device_logprob_batch_size=16, learning_rate=2e-3, max_steps=3, kl_coeff=0.0, save_strategy="steps",
        save_steps=100, disable_tqdm=True, seed=3, temperature=1.0, report_to="none", **extra))


def test_a_tool_server_gone_mid_run_stops_the_run_and_saves_the_last_step(workdir, tmp_path, serve):
    server = serve(create_app([], tools="calculator"))
    out = tmp_path / "out"
    cfg = remote_tools_config(workdir, server.url, out)
    trainer = Trainer(cfg)
    logged = trainer.guard.logged

    def logged_then_stop():  # the server goes away for good once step 1 is logged
        logged()
        if trainer.step == 1:
            server.stop()

    trainer.guard.logged = logged_then_stop
    start = time.perf_counter()
    with pytest.raises(ToolServerError) as info:
        trainer.train()
    assert time.perf_counter() - start >= 2  # it waited the budget (longer than tool_timeout_s) before stopping
    assert str(info.value).startswith(f"tool server {server.url}/tool failed ")
    assert_saved_step_1(info.value, out)


def test_retries_of_many_waiting_calls_are_logged_at_most_every_5_s(serve, tool_tokenizer, caplog):
    """8 rows' calls retry at once against a closed port for 1.5 s (about 5 retries each at 0.1 s doubling): one
    warning line, not one per retry per row (a 600 s budget and 64 rows would otherwise log ~1,600 lines)."""
    server = serve(create_app([], tools="calculator"))
    remote = RemoteToolSet(server.url, retries=-1, max_wait_s=1.5, backoff_s=0.1)
    server.stop()
    with ToolEnvironment(remote, FMT, tool_tokenizer, max_workers=8) as env:
        pending = [env.begin(turn_ids(tool_tokenizer, '{"name": "calculator", "arguments": {"expression": "1"}}'),
                             True) for _ in range(8)]
        for p in pending:
            with pytest.raises(ToolServerError):
                p.result()
    retries = [r for r in caplog.records if "retrying in" in r.getMessage()]
    assert len(retries) == 1 and "Connection refused" in retries[0].getMessage()


def test_a_tool_server_stalled_mid_run_stops_the_run_and_saves_the_last_step(workdir, tmp_path, serve):
    """The server lists its tools and answers step 1's calls, then holds every call unanswered (frozen,
    overloaded): the calls of step 2 time out at tool_timeout_s, and the third in a row (tool_server_max_unanswered)
    raises ToolServerError naming the server; the trainer saves step 1 as for a dead server. Before, each such call
    was a 'timeout' result the policy trained on, step after step."""
    app, stalled, release = create_app([], tools="calculator"), threading.Event(), threading.Event()

    def stalling(environ, start_response):
        if stalled.is_set() and environ["PATH_INFO"] == "/tool":
            release.wait(60)
        return app(environ, start_response)

    server = serve(stalling)
    out = tmp_path / "out"
    cfg = remote_tools_config(workdir, server.url, out, tool_server_max_unanswered=3)
    trainer = Trainer(cfg)
    logged = trainer.guard.logged

    def logged_then_stall():
        logged()
        if trainer.step == 1:
            stalled.set()

    trainer.guard.logged = logged_then_stall
    try:
        with pytest.raises(ToolServerError) as info:
            trainer.train()
    finally:
        release.set()
    assert str(info.value).startswith(f"tool server {server.url}/tool did not answer 3 calls in a row within 0.5 s "
                                      "(tool_timeout_s); it has stalled or is overloaded")
    assert_saved_step_1(info.value, out)
