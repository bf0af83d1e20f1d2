"""Reward server: a thin Flask shell around `paddle_grpo.rewards`, wire-compatible with PaddleNLP's.

    POST /        {"src": [str], "tgt": [str], "response": [str]}
               -> {"error_code": 0, "error_msg": "Success", "score": [float | null],
                   "scores_by_function": {name: [...]}, "errors": [reason | null], "request_id": "..."}
    GET /health -> {"status": "ok", "rewards": [...], "weights": [...], "max_score": float or null}
                   (+ "reward_model": its directory or hub ID, when one is served; + "tools": [...] when tools are)

Tools (paddle_grpo.environment; `--tool`), for rollouts whose tools run on this host (RemoteToolSet):

    GET /tools    -> {"error_code": 0, "error_msg": "Success", "tools": [function schema, ...]}
                     (each schema's keys in their own order: the trainer lists them in the prompt as they come)
    POST /tool    {"name": str, "arguments": {...}}
               -> {"error_code": 0, "error_msg": "Success", "content": str, "error": null | "bad_arguments" | ...,
                   "request_id": "..."}

A call the tool answers (its result, or its own error: bad arguments, an exception, a limit; a call over the
server's --timeout-s is a "timeout") is a 200 with `error` set as in-process; a request that is not a call (not
JSON, no "name", "arguments" not an object) is a 400, a tool this server does not serve a 404 (error_msg: "unknown
tool 'x'; tools: ..."). A server may serve rewards, tools or both; POST / on a server without rewards is a 404.

Who may call (safe by default; docs/tools.md, "Security"): every route answers only requests whose Host header
names this server (its bind address, localhost, or --allowed-hosts; DNS rebinding sends another name: 421), whose
Origin, when there is one, is same-origin with the Host (the same host and the same port, 80 / 443 by the Origin's
scheme when either omits it; "null" never is: a web page's request, 403) and whose Sec-Fetch-Site, when there is
one, is same-origin or none (a browser's mark on a page's request that has no Origin, such as an <img>'s GET: 403);
POST / and POST /tool accept only `Content-Type: application/json` (415; a page cannot send JSON without a CORS
preflight, which is never granted). Serving a tool other than the built-in calculator (`python` runs code; a tool of
your own may do anything) needs a token unless `insecure_no_token` is set.

Rejected requests get a 4xx status and `{"error_code": <the status>, "error_msg": "<what was wrong>"}`. A sample
on which a reward function failed (raised, timed out) gets `score` null with the reason in `errors`; the batch
still succeeds. A function that returns None for a sample is left out of that sample's weighted sum (null only
when every function does). docs/rewards.md has an example request per built-in reward. Model output is only ever
matched as text, never evaluated. Start it with `python -m reward_server` (see __main__.py).
"""
import hmac
import ipaddress
import json
import logging
import re
import socket
import time
import uuid
from typing import Optional, Tuple

from flask import Flask, g, jsonify, request
from werkzeug.exceptions import HTTPException

from paddle_grpo.environment import ToolCall, ToolSet, builtins, load_tools, precheck
from paddle_grpo.environment.tool import error_result
from paddle_grpo.rewards import RewardModel, RewardSet
from paddle_grpo.rewards.combine import RewardTimeout, _call_with_timeout

from .validation import RequestError, parse_batch, parse_tool_call

access_log = logging.getLogger("reward_server.access")
logger = logging.getLogger("reward_server")

DEFAULT_MAX_CONTENT_LENGTH = 100 * 1024 * 1024
# POST /tool's body limit: a call is a name and the arguments a policy wrote within its completion (max_dec_len
# tokens, tens of KB); the reward limit (a whole batch) is far too much for one, and parsing JSON costs ~30x its
# size in memory (a 5 MB `[[],[],...]` body took 140 MB).
TOOL_MAX_BODY_BYTES = 1 << 20
DEFAULT_TIMEOUT_S = 30.0
_SAFE_REQUEST_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
WILDCARD_HOSTS = ("0.0.0.0", "::", "")
DEFAULT_PORTS = {"http": 80, "https": 443}
# What a browser sends as Origin: scheme://host[:port], the host a name, an IPv4 address or [IPv6]; nothing else.
_ORIGIN = re.compile(r"(https?)://(\[[0-9a-fA-F:.]+\]|[^\s\[\]/:?#@]+)(?::(\d{1,5}))?", re.IGNORECASE)
# Sec-Fetch-Site values a browser gives a request this server answers: from a page of this very origin, or none
# (the user typed the URL or opened a bookmark). cross-site and same-site (another port of this host is the same
# site) are a web page's requests; browsers always set it, pages cannot.
_OWN_FETCH_SITES = ("same-origin", "none")
# Tools that compute from their arguments only (no code, files, network): served without a token on request.
TOKENLESS_TOOLS = (builtins.calculator,)


class InsecureServerError(ValueError):
    """A server that would run code for whoever reaches it: a tool that needs a token is served without one."""


def tools_needing_a_token(toolset: ToolSet) -> list:
    """Names of the tools a server may serve only with a token: all but TOKENLESS_TOOLS (`python` runs code; a
    tool of your own can do anything, and the server cannot tell what)."""
    return [name for name, tool in toolset.tools.items() if tool.fn not in TOKENLESS_TOOLS]


def _split_host(value: str) -> Tuple[str, str]:
    """(host, port text) of a Host header or an Origin's netloc (`name`, `name:port`, `[v6]:port`); the host
    lowercase without a trailing dot, the port "" when none is given."""
    value = value.strip().lower()
    port = ""
    if value.startswith("["):
        end = value.find("]")
        if end > 0:
            value, port = value[1:end], value[end + 1:].partition(":")[2]
    elif value.count(":") == 1:
        value, port = value.split(":")
    return value.rstrip("."), port


def _host_name(value: str) -> str:
    """The host part of a Host header or an Origin's netloc, lowercase."""
    return _split_host(value)[0]


def same_origin(origin: str, host: Optional[str]) -> bool:
    """Is a request whose Origin header is `origin` and whose Host header is `host` same-origin: the Origin's host
    and port (by default 80 for http, 443 for https) those of the Host? "null" (a sandboxed or file:// page), a
    scheme other than http(s), a missing Host or anything malformed: no.

    A Host without a port means the default port of the scheme the client spoke, which this plain-HTTP server cannot
    see (waitress drops an untrusted X-Forwarded-Proto): taken to be the Origin's own, so a TLS proxy that passes
    the client's Host on (`Host: TOOLHOST`, `Origin: https://TOOLHOST`) means 443 and plain HTTP (`Origin:
    http://TOOLHOST`) 80."""
    match = _ORIGIN.fullmatch(origin.strip())
    if match is None or host is None:
        return False
    scheme = match.group(1).lower()
    origin_host, origin_port = _host_name(match.group(2)), int(match.group(3) or DEFAULT_PORTS[scheme])
    host_name, host_port = _split_host(host)
    if host_port and not host_port.isdigit():
        return False
    return origin_host == host_name and origin_port == int(host_port or DEFAULT_PORTS[scheme])


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        return False


def allowed_host_check(host: str, allowed_hosts=None):
    """A function name -> bool: may a request whose Host header names `name` be answered by a server bound to
    `host`? Allowed: the bind address and the loopback names; on a wildcard bind (0.0.0.0, ::) also any IP address
    and this machine's host names (a DNS rebinding attack always sends a DNS name of its own, never an IP); plus
    `allowed_hosts` (names; "*" allows every Host: no check)."""
    extra = {_host_name(h) for h in (allowed_hosts or ()) if h.strip()}
    if "*" in extra:
        return lambda name: True
    names = {_host_name(host), *LOOPBACK_NAMES, *extra}
    wildcard = host.strip() in WILDCARD_HOSTS
    if wildcard:
        names |= {socket.gethostname().lower(), socket.getfqdn().lower()}
    return lambda name: name in names or (wildcard and _is_ip(name))


def log_field(value: str, limit: int = 200) -> str:
    """`value` (a request's path, method...) as one field of an access-log line: every character that could end the
    line or split the field (line breaks of any kind, other unprintable characters, spaces, backslashes, quotes)
    escaped as \\xNN, \\uNNNN or \\UNNNNNNNN, so a request cannot forge a line or a field; cut at `limit`
    characters (a path may be 256 KB), the cut marked `...[len=N]`."""
    text = "".join(ch if ch.isprintable() and ch not in ' \\"' else _escaped(ch) for ch in value[:limit])
    return text if len(value) <= limit else f"{text}...[len={len(value)}]"


def _escaped(ch: str) -> str:
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def read_body(limit: int, hint: str) -> bytes:
    """The request body, or RequestError(413) when it is over `limit` bytes (`hint`: what to do about it). The
    Content-Length is checked before anything is read, and at most limit + 1 bytes are read, so a body without one
    (chunked, under a server that passes it through as it comes) cannot get past either."""
    length = request.content_length
    if length is not None and length > limit:
        raise RequestError(413, f"request body of {length} bytes exceeds the limit of {limit} bytes ({hint})")
    chunks, size = [], 0
    while size <= limit:  # a stream's read may return less than asked: read until the end or one byte over
        chunk = request.stream.read(limit + 1 - size)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    if size > limit:
        raise RequestError(413, f"request body exceeds the limit of {limit} bytes ({hint})")
    return b"".join(chunks)


def _error(status, message):
    response = jsonify(error_code=status, error_msg=message)
    response.status_code = status
    return response


def create_app(reward_names_or_fns, weights=None, token=None, max_content_length=DEFAULT_MAX_CONTENT_LENGTH,
               timeout_s=DEFAULT_TIMEOUT_S, tools=None, host="127.0.0.1", allowed_hosts=None,
               insecure_no_token=False):
    """The Flask app scoring with `RewardSet(reward_names_or_fns, weights, timeout_s)` and serving `tools` (tool
    specs, a comma-separated string of them, or a ToolSet; see paddle_grpo.environment.load_tools).

    reward_names_or_fns may be empty when tools are given (a tool server). token: when set, POST /, GET /tools and
    POST /tool need `Authorization: Bearer <token>` (401 otherwise, checked before a body is read; the token is
    stripped of surrounding whitespace, ValueError when nothing is left); /health stays open. max_content_length:
    POST /'s body limit in bytes (413 above it; POST /tool's is TOOL_MAX_BODY_BYTES, or this when smaller).
    timeout_s (None: no limit) bounds each reward-function call and each tool call (a tool over it is answered 200
    with error "timeout", its thread abandoned as in-process). host: the address the server binds (for the Host
    check; see allowed_host_check), allowed_hosts: more names it answers to ("*": any). A tool other than the
    calculator without a token raises InsecureServerError unless insecure_no_token."""
    if token is not None:  # a token read with a newline or spaces around it would refuse every caller's
        token = token.strip()
        if not token:
            raise ValueError("token is empty or only whitespace: give the token, or None for no token")
    toolset = tools if isinstance(tools, ToolSet) else load_tools(tools)
    risky = tools_needing_a_token(toolset)
    if risky and not token and not insecure_no_token:
        raise InsecureServerError(
            f"serving {', '.join(risky)} needs a token: anyone who can reach the port could run code as this "
            "server's user. Set one in $REWARD_SERVER_TOKEN or a file (--token-file), and the same in the "
            "trainer's tool_server_token (or start with --insecure-no-token to accept that risk)")
    host_allowed = allowed_host_check(host, allowed_hosts)
    given = reward_names_or_fns
    has_rewards = bool(given.strip()) if isinstance(given, str) else callable(given) or bool(given)
    if not has_rewards and not len(toolset):
        raise ValueError("a server needs at least one reward function or tool (--reward, --reward-model, --tool)")
    rewards = RewardSet(reward_names_or_fns, weights=weights, timeout_s=timeout_s) if has_rewards else None
    app = Flask("reward_server")
    app.config["MAX_CONTENT_LENGTH"] = max_content_length
    app.extensions["reward_set"] = rewards
    app.extensions["tool_set"] = toolset

    @app.before_request
    def start_request():
        g.start = time.perf_counter()
        given = request.headers.get("X-Request-Id", "")
        g.request_id = given if _SAFE_REQUEST_ID.fullmatch(given) else uuid.uuid4().hex[:16]
        g.batch_size = 0
        # A web page can reach a server on this host: through DNS rebinding (its own name resolving here: the Host
        # header names it) or by a cross-origin request (its Origin header names it, or its Sec-Fetch-Site says
        # so). Programs send neither Origin nor Sec-Fetch-Site.
        given_host = request.environ.get("HTTP_HOST")  # (missing: an HTTP/1.0 client; a browser always sends it)
        if given_host is not None and not host_allowed(_host_name(given_host)):
            # 421 Misdirected Request: not a 400, which the tool client reads as the policy's bad arguments.
            raise RequestError(421, f"Host header {given_host[:100]!r} is not a name this server answers to; "
                                    "start it with --allowed-hosts NAME to answer to another name")
        # Host and port, not the name alone: a page served from another port of this host (a dev server on
        # localhost:3000) is another origin, and on 127.0.0.1 any local program can serve one.
        origin = request.headers.get("Origin")
        if origin is not None and not same_origin(origin, given_host):
            raise RequestError(403, f"request from a web page ({origin[:100]!r}) refused: this server answers "
                                    "programs, not browsers (a request with an Origin must come from the host and "
                                    f"port it is sent to, Host {(given_host or '')[:100]!r})")
        # A page's GET without CORS (<img src>, fetch with mode "no-cors") carries no Origin, but a browser's
        # Sec-Fetch-Site says where it comes from.
        site = request.headers.get("Sec-Fetch-Site")
        if site is not None and site.strip().lower() not in _OWN_FETCH_SITES:
            raise RequestError(403, f"request from a web page (Sec-Fetch-Site: {site[:30]}) refused: this server "
                                    "answers programs, not browsers")

    @app.after_request
    def log_request(response):
        response.headers["X-Request-Id"] = g.get("request_id", "-")
        latency_ms = (time.perf_counter() - g.get("start", time.perf_counter())) * 1000
        # Every field from the request escaped (log_field): a path with %0A would otherwise write a line of its own.
        access_log.info("request_id=%s method=%s path=%s status=%d batch=%d latency_ms=%.1f",
                        log_field(g.get("request_id", "-")), log_field(request.method), log_field(request.path),
                        response.status_code, g.get("batch_size", 0), latency_ms)
        return response

    @app.errorhandler(RequestError)
    def bad_request(exc):
        return _error(exc.status, exc.message)

    @app.errorhandler(HTTPException)
    def http_error(exc):
        if exc.code == 404:
            routes = "POST / to score" if rewards is not None else ""
            if len(toolset):
                routes += (", " if routes else "") + "GET /tools and POST /tool for tools"
            return _error(404, f"no route {request.path}; use {routes} or GET /health")
        if exc.code == 405:
            return _error(405, f"method {request.method} is not allowed on {request.path}; "
                               f"allowed: {', '.join(sorted(exc.valid_methods or []))}")
        if exc.code == 413:
            return _error(413, f"request body exceeds the limit of {max_content_length} bytes "
                               "(start the server with a larger --max-body-mb, or send smaller batches)")
        return _error(exc.code or 500, exc.description or exc.name)

    @app.errorhandler(Exception)
    def internal_error(exc):  # a bug in the server itself: logged with traceback, answered as JSON
        logger.exception("request %s failed", g.get("request_id", "-"))
        return _error(500, f"internal error: {type(exc).__name__}: {str(exc)[:200]}")

    def check_token():
        if token is not None:
            auth = request.headers.get("Authorization")
            if auth is None or not auth.strip():
                raise RequestError(401, "missing token: send the header 'Authorization: Bearer <token>'")
            scheme, _, given = auth.strip().partition(" ")
            if scheme.lower() != "bearer" or not given.strip():
                raise RequestError(401, "malformed Authorization header: it must be 'Bearer <token>' (the word "
                                        "Bearer, a space, the token)")
            if not hmac.compare_digest(given.strip().encode(), token.encode()):
                raise RequestError(401, "wrong token in the Authorization header")

    def check_json():
        # Only JSON: a web page can POST text/plain or a form without asking, application/json only after a CORS
        # preflight, which this server never grants. Every client of the protocol sends application/json.
        if request.mimetype != "application/json":
            got = request.headers.get("Content-Type")
            raise RequestError(415, f"Content-Type must be application/json, got {got[:100]!r}" if got else
                               "Content-Type must be application/json (the request has none)")

    @app.get("/health")
    def health():
        if rewards is None:
            return jsonify(status="ok", rewards=[], weights=[], max_score=None, tools=toolset.names)
        models = [fn.name_or_path for fn in rewards.fns if isinstance(fn, RewardModel)]
        return jsonify(status="ok", rewards=rewards.names, weights=rewards.weights, max_score=rewards.max_score,
                       **({"reward_model": models[0] if len(models) == 1 else models} if models else {}),
                       **({"tools": toolset.names} if len(toolset) else {}))

    @app.get("/tools")
    def list_tools():
        check_token()
        # Not jsonify: Flask sorts keys, and the trainer writes these schemas into the prompt as they come, so
        # sorted keys would give the policy another prompt than the same tools in-process.
        body = json.dumps({"error_code": 0, "error_msg": "Success", "tools": toolset.schemas()})
        return app.response_class(body + "\n", mimetype="application/json")

    # Every POST route: the token first (who may ask at all, from headers only), then the Content-Type, then the
    # body's size, and only then is the body read and parsed: a caller without the token costs no parsing.
    @app.post("/tool")
    def call_tool():
        check_token()
        check_json()
        body = read_body(min(TOOL_MAX_BODY_BYTES, max_content_length), "a tool call is a name and its arguments")
        name, arguments = parse_tool_call(body)
        g.batch_size = 1
        early = precheck(ToolCall(name, arguments), toolset.names)
        if early is not None:  # an unknown tool: the message the policy would read in-process
            raise RequestError(404, early.content[len("error: "):])
        try:  # the server's --timeout-s bounds a call as it bounds a reward function (a hung tool frees the request)
            result = _call_with_timeout(toolset.call, (ToolCall(name, arguments),), {}, timeout_s)
        except RewardTimeout:
            result = error_result(name, "timeout", f"{name} did not finish within the tool server's time limit of "
                                  f"{timeout_s:g} s", timeout_s)
        return jsonify(error_code=0, error_msg="Success", content=result.content, error=result.error,
                       request_id=g.request_id)

    @app.post("/")
    def score():
        check_token()
        check_json()
        if rewards is None:
            raise RequestError(404, f"this server serves no reward functions, only tools ({', '.join(toolset.names)})"
                                    "; start it with --reward to score")
        batch = parse_batch(read_body(max_content_length, "start the server with a larger --max-body-mb, or send "
                                                          "smaller batches"))
        g.batch_size = len(batch["response"])
        turns = {"turns": batch["turns"]} if "turns" in batch else {}  # multi-turn: the rows' messages
        result = rewards(batch["src"], batch["response"], tgt=batch["tgt"], **turns)
        return jsonify(error_code=0, error_msg="Success", score=result.scores,
                       scores_by_function=result.scores_by_function, errors=result.errors,
                       request_id=g.request_id)

    return app
