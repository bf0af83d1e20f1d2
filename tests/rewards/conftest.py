"""`serve(app)`: a real waitress server for a WSGI app on a free loopback port, stopped after the test."""
import pytest

from reward_server.serving import BackgroundServer


@pytest.fixture
def serve():
    servers = []

    def start(app, **kwargs):
        server = BackgroundServer(app, **kwargs).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()
