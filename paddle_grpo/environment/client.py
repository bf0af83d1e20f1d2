"""Tools on another host: `RemoteToolSet` calls a tool server (`python -m reward_server --tool ...`) over HTTP and
offers the same `.names` / `.schemas()` / `.call()` as a ToolSet.

    GET  {url}/tools -> {"error_code": 0, "tools": [schema, ...]}
    POST {url}/tool  {"name": str, "arguments": {...}} -> {"error_code": 0, "content": str, "error": null | ...}

What the policy wrote wrongly comes back as a result, as in-process: the server's 404 (unknown tool) is an
"unknown_tool" result, 400/422 (bad arguments) a "bad_arguments" result, both with the server's message. A reply
not in full within `timeout_s` of the request being sent (the tool ran longer, or the server or a proxy trickles
the reply: the whole reply is timed, not each wait for a byte; http_util.WholeReplyAdapter) is a "timeout" result,
not retried, unless `max_unanswered` calls in a row (across all calls, any reply resetting the count) got no reply:
then the server has stalled (frozen, overloaded, its connections held) rather than the tool run long (a tool over
the server's own --timeout-s is answered 200 with error "timeout", a reply), and that call raises ToolServerError.
What is wrong with the setup raises ToolServerError: 401/403 (the token), other 4xx, a reply that
breaks the protocol or exceeds `max_reply_bytes`, and connection failures / 5xx / 408 / 429 once the retries
(exponential backoff, for up to `max_wait_s` seconds from the request's first failure, or `retries` of them) have
failed, naming the URL and the failures. A RemoteToolSet times its own calls (`times_own_calls`):
ToolEnvironment does not cut them at its `timeout_s`, so the error reaches the rollout and a tool server that is
down stops the run (the trainer then saves as for a reward server that is down: run/faults.py) rather than
teaching the policy that tools time out.
"""
import itertools
import json
import logging
import math
import threading
import time
from typing import Any, Dict, List, Optional, Sequence

import requests

from ..http_util import (RETRYABLE_4XX, ReplyTooLarge, WholeReplyAdapter, backoff_delay, error_msg, read_body,
                         short_error)
from .tool import TOOL_ERRORS, ToolCall, ToolResult, ToolSet, error_result, precheck

logger = logging.getLogger(__name__)
_WARN_EVERY_S = 5.0  # the calls of many rows retry at once when the server is down: log a retry at most this often


class ToolServerError(RuntimeError):
    """The tool server could not be used (unreachable after retries, token refused, protocol broken)."""


class RemoteToolSet(ToolSet):
    """The tools a tool server at `url` serves (all, or those in `names`). token: sent as `Authorization: Bearer`.
    timeout_s: the time a request's whole reply may take after it is sent (mounted on `session` for `url`: a call
    ends within connect_timeout_s + timeout_s, more only while retrying); connect_timeout_s: of a connection; a
    reply above `max_reply_bytes` raises ToolServerError. A failed request (connection error, 5xx, 408, 429) is
    retried after backoff_s * 2**k seconds (capped at 30 s, +-20 % jitter) for as long as its first failure is
    less than `max_wait_s` seconds ago (None: no time limit; the last wait is shortened to end at it) and at most
    `retries` times (-1: no count limit): whichever ends first. The trainer uses retries -1 and max_wait_s =
    reward_server_max_wait_s, the budget of the reward client, both for GET /tools at start-up and for each
    call. max_unanswered: calls in a row without a reply within timeout_s after which a call raises
    ToolServerError instead of giving a "timeout" result (0: never; the trainer's tool_server_max_unanswered)."""

    times_own_calls = True  # each request is bounded by its timeouts and the retry budget (module docstring)
    # The largest reply read (decoded): far above any tool output the policy can read (the trainer keeps
    # max_tool_response_len tokens of it), small enough that 8 calls at once cannot exhaust memory.
    max_reply_bytes = 16 * 1024 * 1024

    def __init__(self, url: str, token: str = "", timeout_s: float = 10, retries: int = 5,
                 names: Optional[Sequence[str]] = None, connect_timeout_s: float = 5, backoff_s: float = 0.5,
                 session: Optional[requests.Session] = None, max_wait_s: Optional[float] = None,
                 max_unanswered: int = 3) -> None:
        super().__init__([])
        url = (url or "").strip().rstrip("/")
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"tool_server must be a URL starting with http:// or https://, got {url!r}")
        if retries < -1:
            raise ValueError(f"retries must be -1 (no limit: max_wait_s ends them) or >= 0, got {retries}")
        if max_wait_s is not None and max_wait_s < 0:
            raise ValueError(f"max_wait_s must be >= 0, got {max_wait_s}")
        if retries == -1 and max_wait_s is None:
            raise ValueError("retries -1 (no count limit) needs max_wait_s: the retries must end")
        if max_unanswered < 0:
            raise ValueError(f"tool_server_max_unanswered must be >= 0 (0: no limit), got {max_unanswered}")
        self.max_unanswered = max_unanswered
        self._unanswered = 0  # calls in a row without a reply; the calls of all rows run in threads at once
        self._unanswered_lock = threading.Lock()
        self.url, self.retries, self.backoff_s, self.max_wait_s = url, retries, backoff_s, max_wait_s
        self._warned = -math.inf  # when a retry was last logged
        self.timeout = (connect_timeout_s, timeout_s)
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.session = session or requests.Session()
        self.session.mount(url + "/", WholeReplyAdapter())  # the read timeout bounds the whole reply
        served = self._fetch_schemas()
        by_name = {s["function"]["name"]: s for s in served}
        wanted = list(names) if names else list(by_name)
        missing = [n for n in wanted if n not in by_name]
        if missing:
            raise ValueError(f"tool server {self.url} does not serve {', '.join(map(repr, missing))}; it serves: "
                             f"{', '.join(by_name) or '(no tools)'} (start it with --tool "
                             f"{','.join(wanted)})")
        self._schemas = {n: by_name[n] for n in wanted}

    @property
    def names(self) -> List[str]:
        return list(self._schemas)

    def schemas(self) -> List[Dict[str, Any]]:
        return list(self._schemas.values())

    def __len__(self) -> int:
        return len(self._schemas)

    def __repr__(self) -> str:
        return f"RemoteToolSet({self.url}: {', '.join(self.names)})"

    def call(self, call: ToolCall) -> ToolResult:
        """The server's result for the call; malformed calls and unknown names are answered here, without a
        request. Raises ToolServerError when the server cannot be used (see the module docstring)."""
        early = precheck(call, self.names)
        if early is not None:
            return early
        try:  # what requests would refuse to send (and retry as a transport failure): the call's own fault
            json.dumps(call.arguments, allow_nan=False)
        except (ValueError, TypeError) as exc:
            return error_result(call.name, "bad_arguments", f"the arguments of {call.name} cannot be sent as JSON "
                                f"({exc}); write finite numbers")
        start = time.perf_counter()
        try:
            reply = self._request("POST", "/tool", {"name": call.name, "arguments": call.arguments})
        except requests.ReadTimeout:
            self._count_unanswered()
            return error_result(call.name, "timeout", f"{call.name} did not answer within {self.timeout[1]:g} s",
                                time.perf_counter() - start)
        with self._unanswered_lock:
            self._unanswered = 0
        latency = time.perf_counter() - start
        if reply.status_code == 404:
            return error_result(call.name, "unknown_tool", error_msg(reply), latency)
        if reply.status_code in (400, 422):
            return error_result(call.name, "bad_arguments", error_msg(reply), latency)
        body = self._body(reply, "/tool")
        content, error = body.get("content"), body.get("error")
        if not isinstance(content, str) or (error is not None and error not in TOOL_ERRORS):
            raise ToolServerError(f"tool server {self.url}/tool answered content={type(content).__name__}, "
                                  f"error={error!r}; expected a string and null or one of {', '.join(TOOL_ERRORS)}")
        return ToolResult(call.name, content, error, latency)

    def _count_unanswered(self) -> None:
        """Count a call without a reply; raise ToolServerError when it makes max_unanswered in a row."""
        with self._unanswered_lock:
            self._unanswered += 1
            count = self._unanswered
        if self.max_unanswered and count >= self.max_unanswered:
            # Every row's calls run in threads at once: calls that time out together may each pass the bound, and
            # whichever raises first reaches the trainer, so the message names the bound, not the thread's count.
            raise ToolServerError(
                f"tool server {self.url}/tool did not answer {self.max_unanswered} calls in a row within {self.timeout[1]:g} s "
                f"(tool_timeout_s); it has stalled or is overloaded, so the run stops at tool_server_max_unanswered "
                f"= {self.max_unanswered} rather than teach the policy that its calls time out. A tool that runs "
                "long is answered by the server itself (error 'timeout') when its --timeout-s is below "
                "tool_timeout_s") from None

    def _fetch_schemas(self) -> List[Dict[str, Any]]:
        try:
            reply = self._request("GET", "/tools")
        except requests.ReadTimeout:  # (a call's timeout is the policy's "timeout" result; a start's is an error)
            raise ToolServerError(f"tool server {self.url}/tools did not answer in full within {self.timeout[1]:g} s "
                                  "(tool_timeout_s)") from None
        body = self._body(reply, "/tools")
        tools = body.get("tools")
        if not isinstance(tools, list) or not all(isinstance(t, dict) and isinstance(t.get("function"), dict)
                                                  and isinstance(t["function"].get("name"), str) for t in tools):
            raise ToolServerError(f"tool server {self.url}/tools answered without a list of function schemas")
        return tools

    def _body(self, reply: requests.Response, path: str) -> Dict[str, Any]:
        if reply.status_code in (401, 403):
            raise ToolServerError(f"tool server {self.url}{path} refused the token (HTTP {reply.status_code}: "
                                  f"{error_msg(reply)}); set tool_server_token to the server's --token")
        if reply.status_code != 200:
            raise ToolServerError(f"tool server {self.url}{path} answered HTTP {reply.status_code}: "
                                  f"{error_msg(reply)}")
        try:
            body = reply.json()
        except ValueError:
            raise ToolServerError(f"tool server {self.url}{path} answered 200 with a body that is not JSON: "
                                  f"{reply.text[:200]!r}") from None
        if not isinstance(body, dict) or body.get("error_code") != 0:
            raise ToolServerError(f"tool server {self.url}{path} answered {str(body)[:200]}")
        return body

    def _request(self, method: str, path: str, payload: Optional[Dict[str, Any]] = None) -> requests.Response:
        """The reply to a request, retrying connection failures, 5xx, 408 and 429 within the retry budget (class
        docstring; a read timeout, the whole reply not in within timeout_s, is not retried: the caller turns it
        into a "timeout" result). The reply's body is read here, within the same time limit."""
        failures: List[str] = []
        first_failure = None
        for attempt in itertools.count():
            try:
                reply = read_body(self.session.request(method, self.url + path, json=payload, timeout=self.timeout,
                                                       headers=self.headers, stream=True), self.max_reply_bytes)
            except requests.ReadTimeout:
                raise
            except ReplyTooLarge:
                raise ToolServerError(f"tool server {self.url}{path} answered more than {self.max_reply_bytes} "
                                      f"bytes; a tool's reply is at most {self.max_reply_bytes} bytes "
                                      "(RemoteToolSet.max_reply_bytes)") from None
            except requests.RequestException as exc:
                failure = short_error(exc)
            else:
                if reply.status_code < 500 and reply.status_code not in RETRYABLE_4XX:
                    return reply
                failure = f"HTTP {reply.status_code}: {error_msg(reply)}"
            failures.append(failure)
            now = time.monotonic()
            first_failure = now if first_failure is None else first_failure
            left = math.inf if self.max_wait_s is None else self.max_wait_s - (now - first_failure)
            if left <= 0 or 0 <= self.retries <= attempt:
                budget = " or ".join(([f"{self.retries} retries"] if self.retries >= 0 else []) +
                                     ([f"max_wait_s = {self.max_wait_s:g} s (the trainer's reward_server_max_wait_s)"]
                                      if self.max_wait_s is not None else []))
                raise ToolServerError(f"tool server {self.url}{path} failed {len(failures)} times over "
                                      f"{now - first_failure:.1f} s (retries end after {budget}): "
                                      + _join(failures))
            delay = min(backoff_delay(attempt, self.backoff_s, 30.0), left)
            if now - self._warned >= _WARN_EVERY_S:
                self._warned = now
                logger.warning("tool server %s%s failed (attempt %d): %s; retrying in %.1f s%s", self.url, path,
                               attempt + 1, failure, delay, "" if self.max_wait_s is None else
                               f" ({left - delay:.1f} s of the {self.max_wait_s:g} s wait budget left)")
            time.sleep(delay)
        raise AssertionError("unreachable")  # itertools.count() never ends


def _join(failures: List[str], keep: int = 6) -> str:
    """The failures of one request, all of them when few, else the first two and the last ones."""
    if len(failures) <= keep:
        return "; ".join(failures)
    return "; ".join(failures[:2]) + f"; ... ({len(failures) - keep} more) ...; " + "; ".join(failures[-(keep - 2):])
