"""A server (or a proxy) that trickles its reply cannot hold a client: the tool client's `timeout_s` and the reward
client's `read_timeout` bound the whole reply, not each gap between its bytes. A real threaded http.server on
127.0.0.1 sends the status line and headers (or the status line only, then the headers too) one byte per second;
RemoteToolSet's call becomes the "timeout" result a slow tool gets, RewardClient's request a timeout it retries and
then reports. A reply over the tool client's size cap stops it with the cap named."""
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from paddle_grpo.environment import RemoteToolSet, ToolCall, ToolServerError
from paddle_grpo.rewards.client import RewardClient, RewardServerError

SCHEMAS = {"error_code": 0, "error_msg": "Success", "tools": [
    {"type": "function", "function": {"name": "drip", "description": "Answer slowly.",
                                      "parameters": {"type": "object", "properties": {}, "required": []}}}]}
TOOL_REPLY = {"error_code": 0, "error_msg": "Success", "content": "late", "error": None}
SCORES = {"error_code": 0, "error_msg": "Success", "score": [1.0]}
GIVE_UP_S = 12.0  # the server closes a trickle after this long, so a client that does not stop ends the test anyway
# How long after its limit a call may end: the limit is checked before every read from the socket, which waits at
# most the time left, so only thread scheduling and closing the connection come on top (milliseconds) and the time
# from the call's start to the request being sent (a loopback connect); 1 s covers a loaded 2-core machine.
MARGIN_S = 1.0


class DripServer(ThreadingHTTPServer):
    """GET /tools answers at once (`mode` "schemas": its body trickles); any POST trickles its reply one byte every
    `interval_s` seconds: the body (`mode` "body": status line and headers at once), or everything from the
    headers on ("headers"); or sends it at once after `big_bytes` spaces ("big"). `stop` ends every trickle."""

    daemon_threads = False  # server_close() joins the handler threads: none is left behind

    def __init__(self, mode: str = "body", interval_s: float = 1.0, big_bytes: int = 0) -> None:
        super().__init__(("127.0.0.1", 0), DripHandler)
        self.mode, self.interval_s, self.big_bytes = mode, interval_s, big_bytes
        self.stop = threading.Event()
        self.url = f"http://127.0.0.1:{self.server_address[1]}"


class DripHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 5  # a connection the client keeps open idle ends its handler thread after this long

    def log_message(self, *args) -> None:  # quiet
        pass

    def do_GET(self) -> None:
        if self.server.mode == "schemas":
            self._trickle(json.dumps(SCHEMAS).encode())
            return
        self._send_at_once(json.dumps(SCHEMAS).encode())

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        server = self.server
        body = json.dumps(TOOL_REPLY if self.path == "/tool" else SCORES).encode()
        if server.mode == "big":
            self._send_at_once(b" " * server.big_bytes + body)
            return
        self._trickle(body)

    def _trickle(self, body: bytes) -> None:
        server = self.server
        head = (f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                "Connection: close\r\n\r\n").encode()
        if server.mode in ("body", "schemas"):
            self.wfile.write(head)
            slow = body
        else:
            self.wfile.write(head[:17])  # "HTTP/1.1 200 OK\r\n": then the headers trickle too
            slow = head[17:] + body
        self.wfile.flush()
        given_up = time.monotonic() + GIVE_UP_S
        for i in range(len(slow)):
            if server.stop.wait(server.interval_s) or time.monotonic() > given_up:
                break
            try:
                self.wfile.write(slow[i:i + 1])
                self.wfile.flush()
            except OSError:  # the client hung up: what a client with a deadline does
                break
        self.close_connection = True

    def _send_at_once(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")  # one request per connection: no handler waits for a next one
        self.end_headers()
        self.wfile.write(body)
        self.close_connection = True


@pytest.fixture
def drip():
    """drip(mode, interval_s, big_bytes) -> a started DripServer; all are stopped and joined after the test."""
    servers = []

    def start(mode: str = "body", interval_s: float = 1.0, big_bytes: int = 0) -> DripServer:
        server = DripServer(mode, interval_s, big_bytes)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        servers.append((server, thread))
        return server

    yield start
    for server, thread in servers:
        server.stop.set()
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.mark.parametrize("mode", ["body", "headers"])
def test_a_tool_reply_trickled_a_byte_a_second_is_a_timeout(drip, mode):
    # Each byte comes within the read timeout (1 s apart, the limit 2 s), so before, the call waited for the
    # whole reply: 75 bytes, 75 s (here until the server gives up after 12 s, then failed as a broken connection).
    server = drip(mode)
    remote = RemoteToolSet(server.url, timeout_s=2, retries=0)
    start = time.perf_counter()
    result = remote.call(ToolCall("drip", {}))
    elapsed = time.perf_counter() - start
    assert (result.error, result.content) == ("timeout", "error: drip did not answer within 2 s")
    # Not before 2 s: the limit counts from the request being sent, after the call began.
    assert 2.0 <= elapsed < 2.0 + MARGIN_S, elapsed
    assert 2.0 <= result.latency_s <= elapsed


def test_schemas_trickled_at_start_up_are_a_tool_server_error_not_a_traceback(drip):
    # A call's timeout is the policy's "timeout" result; at start-up there is no call: the run stops with the URL.
    server = drip("schemas")
    start = time.perf_counter()
    with pytest.raises(ToolServerError, match=rf"^tool server {server.url}/tools did not answer in full within 2 s "
                                              r"\(tool_timeout_s\)$"):
        RemoteToolSet(server.url, timeout_s=2, retries=0)
    assert time.perf_counter() - start < 2.0 + MARGIN_S


def test_a_reply_trickled_within_the_limit_arrives_whole(drip):
    server = drip("body", interval_s=0.01)
    remote = RemoteToolSet(server.url, timeout_s=5, retries=0)
    for _ in range(2):
        result = remote.call(ToolCall("drip", {}))
        assert (result.error, result.content) == (None, "late")


def test_a_tool_reply_over_the_size_cap_stops_the_client(drip):
    server = drip("big", big_bytes=5000)
    remote = RemoteToolSet(server.url, timeout_s=5, retries=0)
    remote.max_reply_bytes = 4096
    with pytest.raises(ToolServerError, match=rf"^tool server {server.url}/tool answered more than 4096 bytes; a "
                                              r"tool's reply is at most 4096 bytes \(RemoteToolSet.max_reply_bytes\)"):
        remote.call(ToolCall("drip", {}))
    remote.max_reply_bytes = 8192
    assert remote.call(ToolCall("drip", {})).content == "late"


@pytest.mark.parametrize("mode", ["body", "headers"])
def test_a_reward_reply_trickled_a_byte_a_second_is_a_timeout(drip, mode):
    # The reward client's read_timeout (reward_server_timeout) bounds the whole reply the same way: a timeout,
    # retried like any (max_retries 1: two requests) and then reported.
    server = drip(mode)
    client = RewardClient(server.url, read_timeout=2, max_retries=1, backoff=0.01)
    start = time.perf_counter()
    with pytest.raises(RewardServerError) as info:
        client.score(["q"], ["t"], ["r"])
    elapsed = time.perf_counter() - start
    assert 4.0 <= elapsed < 4.0 + 2 * MARGIN_S, elapsed  # two requests of 2 s each (+ a 0.01 s backoff)
    message = str(info.value)
    assert message.count(f"{server.url} -> ") == 2 and message.count("Read timed out") == 2, message

