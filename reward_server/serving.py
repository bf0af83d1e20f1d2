"""Serving the Flask app with waitress (multi-threaded, production-grade; not Flask's development server)."""
import threading

import waitress
from waitress import wasyncore


# Connections, set on purpose: waitress' defaults (100 connections, a channel idle for 120 s closed, looked for every
# 30 s) let 100 clients that send half a request and stop lock every other caller out for up to 150 s.
# Open connections at most: a client keeps up to 10 alive (requests' pool) and opens more while it has more
# threads calling; 400 serves some 40 busy clients (trainer ranks, tool pools) and, with a temporary file each for a
# body over 512 KB (waitress' inbuf_overflow), stays under the usual limit of 1024 open files. --connection-limit.
# (waitress counts its listening socket and its wake-up trigger in it: 398 clients.)
CONNECTION_LIMIT = 400
# A channel with no byte in or out for this long, and no request being answered, is closed: a half-open request (or
# an idle keep-alive connection, which the clients reopen on their next call) frees its slot. A request being
# scored is never cut (waitress skips channels with a request in service), so slow rewards are unaffected.
CHANNEL_TIMEOUT_S = 15
# How often idle channels are looked for: a slot is free at most CHANNEL_TIMEOUT_S + this after the last byte.
CLEANUP_INTERVAL_S = 2
# Connections over the limit wait in the kernel's queue (not refused) until a slot frees; the kernel caps it at
# net.core.somaxconn. (waitress' default, stated.)
BACKLOG = 1024
# channel_request_lookahead stays 0 (waitress' default): the clients do not pipeline requests, and reading ahead only
# serves to notice a client gone while its request runs, which cannot stop a reward function anyway.


def make_server(app, host: str = "127.0.0.1", port: int = 8731, threads: int = 8, max_body_bytes=None,
                socket_map=None, connection_limit: int = CONNECTION_LIMIT, channel_timeout_s: int = CHANNEL_TIMEOUT_S,
                cleanup_interval_s: int = CLEANUP_INTERVAL_S):
    """A waitress server bound to host:port (port 0: a free one; see `.effective_port`). Not yet running.

    waitress buffers a whole request body before the app sees it and answers bodies over its own
    `max_request_body_size` with plain text. It is set to a multiple of the app's limit so that a body somewhat
    over the limit still reaches the app and gets its JSON 413, while a huge one is cut off early. Connection
    limits: CONNECTION_LIMIT, CHANNEL_TIMEOUT_S, CLEANUP_INTERVAL_S (seconds, whole: waitress takes ints)."""
    options = {}
    if max_body_bytes:
        options["max_request_body_size"] = 2 * max_body_bytes + (1 << 20)
    # asyncore_use_poll: select() cannot watch a descriptor numbered 1024 or more, which CONNECTION_LIMIT nears.
    return waitress.create_server(app, map=socket_map, host=host, port=port, threads=threads,
                                  ident="paddle-grpo-reward-server", connection_limit=connection_limit,
                                  channel_timeout=channel_timeout_s, cleanup_interval=cleanup_interval_s,
                                  backlog=BACKLOG, asyncore_use_poll=True, **options)


class BackgroundServer:
    """Serve a WSGI app in a daemon thread: `with BackgroundServer(app) as srv: requests.post(srv.url, ...)`.

    For tests, benchmarks and in-process use; `stop()` closes the listening socket and every open connection."""

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0, threads: int = 8, max_body_bytes=None,
                 **limits):
        self._map = {}  # limits: make_server's connection_limit, channel_timeout_s, cleanup_interval_s
        self.server = make_server(app, host, port, threads, max_body_bytes, socket_map=self._map, **limits)
        self.host, self.port = host, int(self.server.effective_port)
        self.url = f"http://{host}:{self.port}"
        self._thread = threading.Thread(target=self.server.run, daemon=True, name=f"reward-server-{self.port}")

    def start(self):
        self._thread.start()
        return self

    def stop(self):
        # Sockets must be closed in the loop's own thread (closing them under its select() gives EBADF): the
        # trigger runs the thunk there, and an empty socket map ends the loop.
        if self._thread.is_alive():
            try:
                self.server.trigger.pull_trigger(lambda: wasyncore.close_all(self._map))
            except OSError:  # EBADF: the trigger is already closed, so the loop is ending on its own (seen once)
                pass
            self._thread.join(5)
        if not self._thread.is_alive():
            wasyncore.close_all(self._map)  # whatever the loop left open; a no-op after the thunk ran
        self.server.task_dispatcher.shutdown()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
