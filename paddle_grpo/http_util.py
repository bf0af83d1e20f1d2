"""What the project's HTTP clients share (rewards/client.py, environment/client.py): a failure in one line, the
server's error_msg of a rejected request, the backoff between retries, and a read timeout that bounds a whole reply
(WholeReplyAdapter, read_body). Imports nothing of the package."""
import contextlib
import http.client
import io
import random
import re
import socket
import time
from typing import Any, List, Optional

import requests
from requests.adapters import HTTPAdapter
from urllib3 import HTTPConnectionPool, HTTPSConnectionPool, ProxyManager
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.exceptions import ReadTimeoutError

# 408 and 429 are 4xx but mean "try again later"; other 4xx mean the request itself is wrong.
RETRYABLE_4XX = (408, 429)


def short_error(exc: BaseException) -> str:
    """`Type: message` of a transport failure, at most 200 characters of the message."""
    text = str(exc)
    # requests buries the useful part ("[Errno 111] Connection refused") at the end of a long message.
    errno = re.search(r"\[Errno -?\d+\][^'\")]*", text)
    if errno:
        text = errno.group(0).strip()
    return f"{type(exc).__name__}: {text[:200]}"


def error_msg(reply: Any) -> str:
    """The `error_msg` of a JSON error body (the reward server's protocol), else the start of the body's text."""
    try:
        body = reply.json()
        if isinstance(body, dict) and "error_msg" in body:
            return str(body["error_msg"])[:500]
    except ValueError:
        pass
    return reply.text[:200].strip() or reply.reason or "(empty body)"


def backoff_delay(attempt: int, backoff: float, max_backoff: float) -> float:
    """Seconds before retry `attempt` (0-based): backoff * 2**attempt capped at max_backoff, with +-20 % jitter so
    many trainer ranks do not retry in lockstep."""
    return min(backoff * 2 ** attempt, max_backoff) * random.uniform(0.8, 1.2)


class _DeadlineReader(io.RawIOBase):
    """A socket's reader (its SocketIO) whose reads all end `limit_s` seconds after it is made: each read from the
    socket may wait only the time left, so a reply trickled a byte at a time ends there too (a socket timeout
    alone restarts with every byte). Past it: socket.timeout, which urllib3 reports as its read timeout."""

    def __init__(self, raw: io.RawIOBase, sock: socket.socket, limit_s: float) -> None:
        super().__init__()
        self._raw, self._sock, self._limit = raw, sock, limit_s
        self._deadline = time.monotonic() + limit_s

    def readable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._raw.fileno()

    def readinto(self, buffer: Any) -> Optional[int]:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise socket.timeout(f"the reply did not arrive in full within {self._limit:g} s")
        self._sock.settimeout(left)
        try:
            return self._raw.readinto(buffer)
        finally:  # the connection's own timeout again, for its next request (keep-alive)
            with contextlib.suppress(OSError):  # (closed meanwhile: nothing to restore)
                self._sock.settimeout(self._limit)

    def close(self) -> None:
        if not self.closed:
            self._raw.close()
        super().close()


class _WholeReplyResponse(http.client.HTTPResponse):
    """http.client's response, made right after the request is sent, whose status line, headers and body must all
    arrive within the socket's timeout at that moment: urllib3's read timeout."""

    def __init__(self, sock: socket.socket, *args: Any, **kwargs: Any) -> None:
        super().__init__(sock, *args, **kwargs)
        limit = sock.gettimeout()
        if limit is not None:  # detach: the SocketIO keeps the socket open while the reply is read
            self.fp = io.BufferedReader(_DeadlineReader(self.fp.detach(), sock, limit))


class _HTTPConnection(HTTPConnection):
    response_class = _WholeReplyResponse


class _HTTPSConnection(HTTPSConnection):
    response_class = _WholeReplyResponse


class _HTTPPool(HTTPConnectionPool):
    ConnectionCls = _HTTPConnection


class _HTTPSPool(HTTPSConnectionPool):
    ConnectionCls = _HTTPSConnection


# urllib3's messages name the pool ("HTTPConnectionPool(host=..., port=...): Read timed out."): as without the adapter.
_HTTPPool.__name__, _HTTPSPool.__name__ = HTTPConnectionPool.__name__, HTTPSConnectionPool.__name__
_POOLS = {"http": _HTTPPool, "https": _HTTPSPool}


class WholeReplyAdapter(HTTPAdapter):
    """requests' HTTPAdapter whose read timeout (`timeout=(connect, read)`) bounds the whole reply: its status line,
    headers and body must all arrive within it after the request is sent. (requests' own read timeout bounds each
    wait for a byte: a server or proxy trickling its reply holds the caller forever.) Past it: requests.ReadTimeout
    while the headers come, requests' ConnectionError around urllib3's ReadTimeoutError while the body does (as
    requests reports any read timeout of a body; read_body makes it a ReadTimeout). Through an HTTP(S) proxy too;
    not through a SOCKS proxy, whose connections are its own. Use: `session.mount(url + "/", WholeReplyAdapter())`."""

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = _POOLS

    def proxy_manager_for(self, proxy: str, **proxy_kwargs: Any) -> Any:
        manager = super().proxy_manager_for(proxy, **proxy_kwargs)
        if isinstance(manager, ProxyManager):  # (a SOCKSProxyManager is not one)
            manager.pool_classes_by_scheme = _POOLS
        return manager


class ReplyTooLarge(Exception):
    """A reply's body exceeded read_body's max_bytes."""


def read_body(reply: requests.Response, max_bytes: int) -> requests.Response:
    """`reply` (from a `stream=True` request) with its body read, so that `.content`, `.text` and `.json()` work as
    without stream. More than `max_bytes` (decoded): the reply is closed and ReplyTooLarge raised. A read timeout
    while reading raises requests.ReadTimeout (requests itself raises ConnectionError for it)."""
    chunks: List[bytes] = []
    size = 0
    try:
        for chunk in reply.iter_content(64 * 1024):
            size += len(chunk)
            if size > max_bytes:
                reply.close()
                raise ReplyTooLarge(f"the reply's body exceeds {max_bytes} bytes")
            chunks.append(chunk)
    except requests.ConnectionError as exc:
        if exc.args and isinstance(exc.args[0], ReadTimeoutError):
            reply.close()
            raise requests.ReadTimeout(exc.args[0], request=reply.request, response=reply) from exc
        raise
    reply._content = b"".join(chunks)  # where requests keeps a body it has read (`.content` reads it from there)
    return reply
