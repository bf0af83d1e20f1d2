"""Tools over HTTP: a real waitress server on 127.0.0.1 answering GET /tools and POST /tool, every kind of bad
request answered 4xx with a JSON body, RemoteToolSet giving exactly the in-process ToolSet's results, retries
across a server restart (the CLI, `python -m reward_server --tool ...`), and loud transport failures."""
import json
import threading
import time

import pytest
import requests

from paddle_grpo.data import tokenize_prompts
from paddle_grpo.environment import (HermesFormat, RemoteToolSet, Tool, ToolCall, ToolEnvironment, ToolServerError,
                                     ToolSet, get_tool, load_tools)
from reward_server import create_app

CALLS = [
    ToolCall("calculator", {"expression": "123*45"}),
    ToolCall("calculator", {"expression": "1/0"}),                  # the tool's own refusal: bad_arguments
    ToolCall("calculator", {"expression": 5}),                       # wrong type: bad_arguments
    ToolCall("calculator", {"expr": "1"}),                           # unknown argument: bad_arguments
    ToolCall("calculator", {}),                                      # missing argument: bad_arguments
    ToolCall("python", {"code": "print(sum(range(10)))"}),
    ToolCall("python", {"code": "raise KeyError('k')"}),            # exception with its traceback
    ToolCall("calc", {"expression": "1"}),                           # unknown tool
    ToolCall("", None, "<tool_call>x</tool_call>", "malformed", "not JSON"),
]


@pytest.fixture
def tool_url(serve):
    return serve(create_app([], tools="calculator,python", token="T0k")).url


def get(url, path, token="T0k"):
    return requests.get(url + path, timeout=10, headers={"Authorization": f"Bearer {token}"} if token else {})


def post(url, path, body, token="T0k"):
    data = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return requests.post(url + path, data=data, timeout=10,
                         headers={"Content-Type": "application/json",
                                  **({"Authorization": f"Bearer {token}"} if token else {})})


def test_tools_and_health(tool_url):
    local = load_tools("calculator,python")
    reply = get(tool_url, "/tools")
    assert reply.status_code == 200
    assert reply.json() == {"error_code": 0, "error_msg": "Success", "tools": local.schemas()}
    health = get(tool_url, "/health", token=None).json()  # /health stays open
    assert health["tools"] == ["calculator", "python"] and health["rewards"] == []


def test_a_call(tool_url):
    body = post(tool_url, "/tool", {"name": "calculator", "arguments": {"expression": "123*45"}}).json()
    assert (body["error_code"], body["content"], body["error"]) == (0, "5535", None)
    bad = post(tool_url, "/tool", {"name": "calculator", "arguments": {"expression": "x"}})
    assert bad.status_code == 200 and bad.json()["error"] == "bad_arguments"  # the tool's answer, not the HTTP's


@pytest.mark.parametrize("path, body, token, status, message", [
    ("/tool", b"not json", "T0k", 400, "request body is not valid JSON"),
    ("/tool", b"", "T0k", 400, 'empty request body; send JSON {"name": "<tool>", "arguments": {...}}'),
    ("/tool", [1], "T0k", 400, "request body must be a JSON object"),
    ("/tool", {"arguments": {}}, "T0k", 400, "field 'name' must be the tool's name (a non-empty string), got missing"),
    ("/tool", {"name": 3}, "T0k", 400, "field 'name' must be the tool's name (a non-empty string), got a JSON number"),
    ("/tool", {"name": "calculator", "arguments": [1]}, "T0k", 400,
     "field 'arguments' must be a JSON object, got a JSON array"),
    ("/tool", {"name": "calc", "arguments": {}}, "T0k", 404, "unknown tool 'calc'; tools: calculator, python"),
    # What JSON cannot carry (Python's json reads them): refused as the trainer's own parser refuses them.
    ("/tool", b'{"name": "calculator", "arguments": {"expression": NaN}}', "T0k", 400, "NaN"),
    ("/tool", b'{"name": "calculator", "arguments": {"expression": -Infinity}}', "T0k", 400, "-Infinity"),
    ("/tool", b'{"name": "calculator", "arguments": {"expression": 1e999}}', "T0k", 400, "1e999"),
    ("/tool", b'{"name": "calculator", "arguments": {"expression": "\\ud800"}}', "T0k", 400, "lone surrogate"),
    ("/tool", {"name": "calculator", "arguments": {}}, None, 401, "missing token"),
    ("/tool", {"name": "calculator", "arguments": {}}, "wrong", 401, "wrong token in the Authorization header"),
    ("/tools", None, "wrong", 401, "wrong token in the Authorization header"),
    ("/", {"src": ["q"], "tgt": ["t"], "response": ["r"]}, "T0k", 404, "this server serves no reward functions"),
    ("/nowhere", {}, "T0k", 404, "no route /nowhere; use GET /tools and POST /tool for tools or GET /health"),
])
def test_bad_requests_get_4xx_with_json(tool_url, path, body, token, status, message):
    reply = get(tool_url, path, token) if body is None else post(tool_url, path, body, token)
    assert reply.status_code == status
    payload = reply.json()
    assert payload["error_code"] == status and message in payload["error_msg"], payload


def test_remote_results_equal_in_process_results(tool_url):
    local = load_tools("calculator,python")
    remote = load_tools("calculator,python", server=tool_url, token="T0k")
    assert isinstance(remote, RemoteToolSet)
    assert remote.names == local.names and remote.schemas() == local.schemas()
    for call in CALLS:
        mine, theirs = local.call(call), remote.call(call)
        assert (theirs.name, theirs.content, theirs.error) == (mine.name, mine.content, mine.error), call
    assert load_tools(["python"], server=tool_url, token="T0k").names == ["python"]
    with pytest.raises(ValueError, match=r"does not serve 'search'; it serves: calculator, python"):
        load_tools("calculator,search", server=tool_url, token="T0k")
    with pytest.raises(ToolServerError, match="refused the token .*HTTP 401.*tool_server_token"):
        load_tools("calculator", server=tool_url, token="nope")


def test_a_slow_remote_tool_is_a_timeout_result(serve):
    def nap(seconds: float) -> str:
        """Sleep."""
        time.sleep(seconds)
        return "awake"

    # (insecure_no_token: a tool of the test's own; what is checked here is the time limit, not access)
    url = serve(create_app([], tools=ToolSet([Tool.from_function(nap)]), insecure_no_token=True)).url
    remote = RemoteToolSet(url, timeout_s=0.5)
    assert remote.call(ToolCall("nap", {"seconds": 0.01})).content == "awake"
    slow = remote.call(ToolCall("nap", {"seconds": 2}))
    assert (slow.error, slow.content) == ("timeout", "error: nap did not answer within 0.5 s")


def test_the_servers_time_limit_answers_a_hung_tool(serve):
    # The server's timeout_s (--timeout-s) bounds a tool call as it bounds a reward function: a 200 "timeout"
    # result well before the client's own read timeout (10 s), and the server still answers the next call.
    release = threading.Event()

    def hang(x: str) -> str:
        """Block until released."""
        release.wait(30)
        return x

    url = serve(create_app([], tools=ToolSet([Tool.from_function(hang), get_tool("calculator")]),
                           timeout_s=0.3, insecure_no_token=True)).url
    try:
        start = time.perf_counter()
        reply = RemoteToolSet(url, timeout_s=10).call(ToolCall("hang", {"x": "hi"}))
        assert time.perf_counter() - start < 5
        assert (reply.error, reply.content) == ("timeout", "error: hang did not finish within the tool server's "
                                                           "time limit of 0.3 s")
        assert RemoteToolSet(url).call(ToolCall("calculator", {"expression": "6*7"})).content == "42"
    finally:
        release.set()


def test_transport_failure_raises_through_the_environment(serve, tool_tokenizer):
    server = serve(create_app([], tools="calculator"))
    remote = RemoteToolSet(server.url, retries=2, backoff_s=0.05)
    server.stop()
    with pytest.raises(ToolServerError) as info:
        remote.call(ToolCall("calculator", {"expression": "1"}))
    message = str(info.value)
    assert f"tool server {server.url}/tool failed 3 times" in message and "Connection refused" in message
    # Through the rollout's runner: raised by PendingTurn.result, never turned into a tool message.
    env = ToolEnvironment(remote, HermesFormat(), tool_tokenizer)
    turn = tokenize_prompts(tool_tokenizer, ['<tool_call>{"name": "calculator", "arguments": {"expression": "1"}}'
                                             '</tool_call>'])[0]
    pending = env.begin(turn, ended_by_call_end=True)
    with pytest.raises(ToolServerError):
        pending.result()


def test_cli_serves_only_tools_and_the_client_survives_a_restart(start_cli, free_port, caplog):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = start_cli(port, "--tool", "calculator")
    assert requests.get(url + "/health", timeout=5).json()["tools"] == ["calculator"]
    remote = RemoteToolSet(url, retries=8, backoff_s=0.2, connect_timeout_s=1)
    assert remote.call(ToolCall("calculator", {"expression": "6*7"})).content == "42"
    server.kill()
    server.wait()
    restarted = []
    threading.Thread(target=lambda: (time.sleep(0.3), restarted.append(start_cli(port, "--tool", "calculator",
                                                                                  wait=False)))).start()
    # Retries (0.2 s doubling, up to ~50 s in all) outlast the restart; the call then succeeds.
    assert remote.call(ToolCall("calculator", {"expression": "6*7"})).content == "42"
    assert restarted and any("Connection refused" in r.getMessage() for r in caplog.records)
    restarted[0].terminate()
    restarted[0].wait(10)
    assert f"reward server listening on http://127.0.0.1:{port} tools=calculator threads=8" in \
        restarted[0].log_path.read_text()


def test_cli_without_rewards_or_tools_still_serves_kk(repo_root):
    # Unchanged: no --reward and no --tool means the default reward kk (DESIGN's reward protocol).
    from reward_server.__main__ import parse_args

    assert parse_args([]).reward == "kk" and parse_args(["--tool", "calculator"]).reward == ""
    with pytest.raises(ValueError, match="at least one reward function or tool"):
        create_app([], tools="")
