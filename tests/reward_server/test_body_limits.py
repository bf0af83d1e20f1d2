"""Body limits on real servers: POST /tool takes at most TOOL_MAX_BODY_BYTES (1 MiB), refused by its Content-Length
or, chunked, by reading one byte past it, before any parsing (a JSON 413); a request without the token is refused
before its body is looked at; and the memory a large body costs a server without a token (the CLI, measured in
/proc)."""
import json

import requests

from reward_server import TOOL_MAX_BODY_BYTES, create_app

JSON = {"Content-Type": "application/json"}
AUTH = {**JSON, "Authorization": "Bearer T0k"}
TOOL_LIMIT_MSG = f"exceeds the limit of {TOOL_MAX_BODY_BYTES} bytes (a tool call is a name and its arguments)"


def call_of_size(size):
    """A valid calculator call of exactly `size` bytes (padded with spaces, which JSON ignores)."""
    body = json.dumps({"name": "calculator", "arguments": {"expression": "6*7"}}).encode()
    return body[:-1] + b" " * (size - len(body)) + b"}"


def test_a_tool_call_over_one_mib_is_a_json_413_before_parsing(serve):
    url = serve(create_app([], tools="calculator", token="T0k")).url + "/tool"
    assert TOOL_MAX_BODY_BYTES == 1 << 20
    at_limit = requests.post(url, data=call_of_size(TOOL_MAX_BODY_BYTES), headers=AUTH, timeout=30)
    assert (at_limit.status_code, at_limit.json()["content"]) == (200, "42")
    over = requests.post(url, data=call_of_size(TOOL_MAX_BODY_BYTES + 1), headers=AUTH, timeout=30)
    assert over.status_code == 413
    assert over.json() == {"error_code": 413, "error_msg": f"request body of {TOOL_MAX_BODY_BYTES + 1} bytes "
                                                           f"{TOOL_LIMIT_MSG}"}
    # Chunked (no Content-Length from the client): refused all the same.
    body = call_of_size(TOOL_MAX_BODY_BYTES + 1)
    chunked = requests.post(url, data=(body[i:i + 65536] for i in range(0, len(body), 65536)), headers=AUTH,
                            timeout=30)
    assert chunked.status_code == 413 and TOOL_LIMIT_MSG in chunked.json()["error_msg"]


def test_the_tool_limit_is_the_reward_limit_when_that_is_smaller(serve):
    url = serve(create_app("kk", tools="calculator", max_content_length=100)).url + "/tool"
    reply = requests.post(url, data=call_of_size(101), headers=JSON, timeout=10)
    assert reply.status_code == 413 and "exceeds the limit of 100 bytes" in reply.json()["error_msg"]


def test_without_the_token_nothing_else_is_looked_at(serve):
    # The token is checked first: no Content-Type check, no size check, no parsing for a caller without it.
    url = serve(create_app("kk", tools="calculator,python", token="T0k")).url
    junk = b"[" * (3 << 20)  # over both limits, and not JSON (deep nesting if it were parsed)
    for path in ("/", "/tool"):
        for headers in ({"Content-Type": "text/plain"}, JSON, {**JSON, "Authorization": "Bearer wrong"}):
            reply = requests.post(url + path, data=junk, headers=headers, timeout=30)
            assert reply.status_code == 401, (path, headers, reply.text[:200])
            assert reply.json()["error_code"] == 401


def peak_rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))


def test_a_large_tool_body_costs_no_memory_on_a_server_without_a_token(start_cli, free_port):
    # The case: a tokenless server (the calculator needs none) parsed a 5 MB `[[],[],...]` (+140 MB peak).
    port = free_port()
    proc = start_cli(port, "--tool", "calculator", "--log-level", "WARNING")
    url = f"http://127.0.0.1:{port}/tool"
    requests.post(url, json={"name": "calculator", "arguments": {"expression": "1"}}, timeout=10)  # warm
    before = peak_rss_kb(proc.pid)
    body = b"[" + b",".join([b"[]"] * ((5 << 20) // 3)) + b"]"
    reply = requests.post(url, data=body, headers=JSON, timeout=60)
    grown_mb = (peak_rss_kb(proc.pid) - before) / 1024
    print(f"\npeak RSS grew by {grown_mb:.1f} MB for a {len(body) / 1e6:.1f} MB body")
    assert reply.status_code == 413 and TOOL_LIMIT_MSG in reply.json()["error_msg"]
    assert grown_mb < 20, grown_mb


def test_the_docs_state_the_tool_limit(repo_root):
    text = (repo_root / "docs" / "tools.md").read_text(encoding="utf-8")
    assert TOOL_MAX_BODY_BYTES == 1 << 20 and "A `POST /tool` body over 1 MiB (`TOOL_MAX_BODY_BYTES`" in text
