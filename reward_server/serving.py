"""Serving the Flask app with waitress (multi-threaded, production-grade; not Flask's development server)."""
import threading

import waitress
from waitress import wasyncore


def make_server(app, host="127.0.0.1", port=8731, threads=8, max_body_bytes=None, socket_map=None):
    """A waitress server bound to host:port (port 0: a free one; see `.effective_port`). Not yet running.

    waitress buffers a whole request body before the app sees it and answers bodies over its own
    `max_request_body_size` with plain text. It is set to a multiple of the app's limit so that a body somewhat
    over the limit still reaches the app and gets its JSON 413, while a huge one is cut off early."""
    options = {}
    if max_body_bytes:
        options["max_request_body_size"] = 2 * max_body_bytes + (1 << 20)
    return waitress.create_server(app, map=socket_map, host=host, port=port, threads=threads,
                                  ident="paddle-grpo-reward-server", **options)


class BackgroundServer:
    """Serve a WSGI app in a daemon thread: `with BackgroundServer(app) as srv: requests.post(srv.url, ...)`.

    For tests, benchmarks and in-process use; `stop()` closes the listening socket and every open connection."""

    def __init__(self, app, host="127.0.0.1", port=0, threads=8, max_body_bytes=None):
        self._map = {}
        self.server = make_server(app, host, port, threads, max_body_bytes, socket_map=self._map)
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
