"""RemoteToolSet against a tool server that has stalled: a real HTTP server (waitress) on 127.0.0.1 that lists its
tools and then holds every call unanswered. A call without a reply is a "timeout" result until
max_unanswered calls in a row have had none; that call raises ToolServerError naming the URL. A reply, a 200 whose
error is "timeout" (the server's own time limit: the tool ran long) included, resets the count."""
import json
import threading
import time

import pytest

from paddle_grpo.environment import RemoteToolSet, ToolCall, ToolServerError, get_tool

TIMEOUT_S = 0.3
SERVER_TIMEOUT = "error: calculator did not finish within the tool server's time limit of 0.2 s"


@pytest.fixture
def stalled(serve):
    """A server whose GET /tools answers the calculator's schema and whose POST /tool holds the call (until the
    test ends) unless its expression is "answer" (200: "2") or "tool timeout" (200 with error "timeout", as the
    server answers a tool over its --timeout-s). Released before `serve` stops it."""
    release = threading.Event()
    held = []

    def app(environ, start_response):
        if environ["REQUEST_METHOD"] == "GET" and environ["PATH_INFO"] == "/tools":
            body = {"error_code": 0, "tools": [get_tool("calculator").schema]}
        else:
            request = json.loads(environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0)))
            expression = request["arguments"]["expression"]
            if expression == "answer":
                body = {"error_code": 0, "content": "2", "error": None}
            elif expression == "tool timeout":
                body = {"error_code": 0, "content": SERVER_TIMEOUT, "error": "timeout"}
            else:
                held.append(expression)
                release.wait(30)
                body = {"error_code": 0, "content": "too late", "error": None}
        data = json.dumps(body).encode()
        start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(data)))])
        return [data]

    server = serve(app)
    server.held = held
    yield server
    release.set()


def call(remote, expression):
    return remote.call(ToolCall("calculator", {"expression": expression}))


def test_a_stalled_server_stops_the_calls_at_the_third_unanswered_one(stalled):
    remote = RemoteToolSet(stalled.url, timeout_s=TIMEOUT_S, retries=0)  # max_unanswered: 3 by default
    assert remote.names == ["calculator"]  # it listed its tools
    first, second = call(remote, "1"), call(remote, "2")
    assert [(r.error, r.content) for r in (first, second)] == \
        [("timeout", f"error: calculator did not answer within {TIMEOUT_S:g} s")] * 2
    with pytest.raises(ToolServerError) as info:
        call(remote, "3")
    assert str(info.value) == (
        f"tool server {stalled.url}/tool did not answer 3 calls in a row within {TIMEOUT_S:g} s (tool_timeout_s); "
        "it has stalled or is overloaded, so the run stops at tool_server_max_unanswered = 3 rather than teach the "
        "policy that its calls time out. A tool that runs long is answered by the server itself (error "
        "'timeout') when its --timeout-s is below tool_timeout_s")
    assert stalled.held == ["1", "2", "3"]  # each call did reach the server
    with pytest.raises(ToolServerError):  # and it stays stopped: the next unanswered call raises too
        call(remote, "4")


def test_any_reply_resets_the_count_a_servers_timeout_result_included(stalled):
    remote = RemoteToolSet(stalled.url, timeout_s=TIMEOUT_S, retries=0, max_unanswered=2)
    results = [call(remote, e) for e in ("1", "tool timeout", "2", "answer", "3", "tool timeout", "4")]
    unanswered, server_timeout = ("timeout", f"error: calculator did not answer within {TIMEOUT_S:g} s"), \
        ("timeout", SERVER_TIMEOUT)
    assert [(r.error, r.content) for r in results] == [unanswered, server_timeout, unanswered, (None, "2"),
                                                       unanswered, server_timeout, unanswered]
    with pytest.raises(ToolServerError, match=r"did not answer 2 calls in a row .* tool_server_max_unanswered = 2 "):
        call(remote, "5")  # the second in a row


def test_concurrent_calls_count_together(stalled):
    # The calls of all rows run at once (ToolEnvironment's threads): five held together are five in a row, and the
    # three that reach the limit raise; none waits longer than its read timeout.
    remote = RemoteToolSet(stalled.url, timeout_s=TIMEOUT_S, retries=0)
    outcomes = [None] * 5

    def run(i):
        try:
            outcomes[i] = call(remote, str(i)).error
        except ToolServerError:
            outcomes[i] = "raised"

    start = time.perf_counter()
    threads = [threading.Thread(target=run, args=(i,)) for i in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert sorted(outcomes) == ["raised", "raised", "raised", "timeout", "timeout"]
    assert time.perf_counter() - start < TIMEOUT_S + 2  # 2 s of margin on a loaded machine


def test_zero_never_stops_and_a_negative_limit_is_refused(stalled):
    remote = RemoteToolSet(stalled.url, timeout_s=TIMEOUT_S, retries=0, max_unanswered=0)
    assert [call(remote, str(i)).error for i in range(4)] == ["timeout"] * 4
    with pytest.raises(ValueError, match=r"^tool_server_max_unanswered must be >= 0 \(0: no limit\), got -1$"):
        RemoteToolSet(stalled.url, timeout_s=TIMEOUT_S, retries=0, max_unanswered=-1)
