"""Connection limits on real servers (reward_server/serving.py): half-open requests beyond waitress' default 100
connections lock no caller out, connections over the limit wait until idle ones are closed (CHANNEL_TIMEOUT_S,
shortened here), a request being scored is never cut by that timeout, and a client that trickles a byte at a time
keeps its connection (the limit docs/tools.md states). Bounded: loopback, well under 20 s together."""
import socket
import time

import requests

from reward_server import create_app
from reward_server.__main__ import parse_args
from reward_server.serving import (BACKLOG, CHANNEL_TIMEOUT_S, CLEANUP_INTERVAL_S, CONNECTION_LIMIT,
                                   BackgroundServer)

BATCH = {"src": ["q"], "tgt": ["(1) Ann is a knight"],
         "response": ["<think>x</think><answer>Ann is a knight</answer>"]}
HALF_REQUEST = b"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"  # no blank line: unfinished


def half_open(port, n):
    """n connections that each send the start of a request and stop (a slowloris that never sends more)."""
    sockets = []
    for _ in range(n):
        sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        sock.sendall(HALF_REQUEST)
        sockets.append(sock)
    time.sleep(0.5)  # the server's loop accepts them (up to its limit)
    return sockets


def timed_score(url, timeout_s):
    started = time.monotonic()
    reply = requests.post(url + "/", json=BATCH, timeout=timeout_s)
    return reply, time.monotonic() - started


def test_the_limits_reach_waitress():
    server = BackgroundServer(create_app("kk"))
    try:
        adj = server.server.adj
        assert (adj.connection_limit, adj.channel_timeout, adj.cleanup_interval, adj.backlog,
                adj.asyncore_use_poll) == (CONNECTION_LIMIT, CHANNEL_TIMEOUT_S, CLEANUP_INTERVAL_S, BACKLOG, True)
        assert (CONNECTION_LIMIT, CHANNEL_TIMEOUT_S, CLEANUP_INTERVAL_S, BACKLOG) == (400, 15, 2, 1024)
    finally:
        server.stop()
    assert parse_args(["--connection-limit", "50"]).connection_limit == 50


def test_half_open_connections_beyond_waitress_default_lock_no_caller_out(start_cli, free_port):
    # The issue: 110 such connections made every new call wait (waitress' 100); 150 here, the CLI's defaults.
    port = free_port()
    start_cli(port, "--reward", "kk", "--log-level", "WARNING")
    sockets = half_open(port, 150)
    try:
        reply, took = timed_score(f"http://127.0.0.1:{port}", timeout_s=5)
        print(f"\na call beside 150 half-open connections: {took * 1000:.0f} ms")
        assert reply.status_code == 200 and reply.json()["score"] == [3.0]
        assert took < 2, took
    finally:
        for sock in sockets:
            sock.close()


def test_connections_over_the_limit_wait_until_idle_ones_are_closed(serve):
    server = serve(create_app("kk"), connection_limit=10, channel_timeout_s=2, cleanup_interval_s=1)
    # 8 accepted (waitress counts its listening socket and its trigger in the limit), 4 queued in the backlog.
    sockets = half_open(server.port, 12)
    try:
        reply, took = timed_score(server.url, timeout_s=10)
        print(f"\na call behind 12 half-open connections (limit 10, idle timeout 2 s): {took:.1f} s")
        assert reply.status_code == 200 and reply.json()["score"] == [3.0]
        assert 1 < took < 2 + 1 + 1.5, took  # it did wait, and no longer than the timeout, a sweep and some slack
        for sock in sockets:  # every one is closed by the server (EOF, no reply), the queued ones once accepted
            sock.settimeout(4)
            assert sock.recv(100) == b""
    finally:
        for sock in sockets:
            sock.close()


def slow_reward(prompts, completions, **kwargs):
    time.sleep(3.5)
    return [1.0] * len(completions)


def test_a_request_being_scored_is_not_cut_by_the_idle_timeout(serve):
    server = serve(create_app([slow_reward], timeout_s=None), channel_timeout_s=1, cleanup_interval_s=1)
    reply, took = timed_score(server.url, timeout_s=10)
    assert reply.status_code == 200 and reply.json()["score"] == [1.0] and took > 3.5


def test_a_trickling_client_keeps_its_connection(serve):
    # What the idle timeout cannot do: a byte every 0.5 s is activity, so this channel outlives a 1 s timeout.
    server = serve(create_app("kk"), channel_timeout_s=1, cleanup_interval_s=1)
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        sock.sendall(b"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        for _ in range(8):  # 4 s: four times the timeout
            time.sleep(0.5)
            sock.sendall(b"X")
        sock.sendall(b"-A: b\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}")
        reply = b"".join(iter(lambda: sock.recv(4096), b""))  # to the server's close after its reply
    assert reply.startswith(b"HTTP/1.1 400 ") and b"missing fields" in reply, reply[:300]


def test_the_docs_state_the_limits(repo_root):
    text = " ".join((repo_root / "docs" / "tools.md").read_text(encoding="utf-8").split())
    for stated in (f"At most {CONNECTION_LIMIT} are open at once (`--connection-limit N`",
                   f"no byte in or out for {CHANNEL_TIMEOUT_S} s", f"(looked for every {CLEANUP_INTERVAL_S} s)",
                   f"at most {CHANNEL_TIMEOUT_S + CLEANUP_INTERVAL_S} s", "a client that sends a byte every few "
                   "seconds is never idle"):
        assert stated in text, stated
