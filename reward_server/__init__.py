"""Reward server: a thin Flask shell around `paddle_grpo.rewards`, wire-compatible with PaddleNLP's.

    POST /        {"src": [str], "tgt": [str], "response": [str]}
               -> {"error_code": 0, "error_msg": "Success", "score": [float | null],
                   "scores_by_function": {name: [...]}, "errors": [reason | null], "request_id": "..."}
    GET /health -> {"status": "ok", "rewards": [...], "weights": [...], "max_score": float or null}
                   (+ "reward_model": its directory or hub ID, when one is served)

Rejected requests get a 4xx status and `{"error_code": <the status>, "error_msg": "<what was wrong>"}`. A sample
on which a reward function failed (raised, timed out) gets `score` null with the reason in `errors`; the batch
still succeeds. A function that returns None for a sample is left out of that sample's weighted sum (null only
when every function does). docs/rewards.md has an example request per built-in reward. Model output is only ever
matched as text, never evaluated. Start it with `python -m reward_server` (see __main__.py).
"""
import hmac
import logging
import re
import time
import uuid

from flask import Flask, g, jsonify, request
from werkzeug.exceptions import HTTPException

from paddle_grpo.rewards import RewardModel, RewardSet

from .validation import RequestError, parse_batch

access_log = logging.getLogger("reward_server.access")
logger = logging.getLogger("reward_server")

DEFAULT_MAX_CONTENT_LENGTH = 100 * 1024 * 1024
DEFAULT_TIMEOUT_S = 30.0
_SAFE_REQUEST_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")


def _error(status, message):
    response = jsonify(error_code=status, error_msg=message)
    response.status_code = status
    return response


def create_app(reward_names_or_fns, weights=None, token=None, max_content_length=DEFAULT_MAX_CONTENT_LENGTH,
               timeout_s=DEFAULT_TIMEOUT_S):
    """The Flask app scoring with `RewardSet(reward_names_or_fns, weights, timeout_s)`.

    token: when set, POST / needs `Authorization: Bearer <token>` (401 otherwise); /health stays open.
    max_content_length: request body limit in bytes (413 above it)."""
    rewards = RewardSet(reward_names_or_fns, weights=weights, timeout_s=timeout_s)
    app = Flask("reward_server")
    app.config["MAX_CONTENT_LENGTH"] = max_content_length
    app.extensions["reward_set"] = rewards

    @app.before_request
    def start_request():
        g.start = time.perf_counter()
        given = request.headers.get("X-Request-Id", "")
        g.request_id = given if _SAFE_REQUEST_ID.fullmatch(given) else uuid.uuid4().hex[:16]
        g.batch_size = 0

    @app.after_request
    def log_request(response):
        response.headers["X-Request-Id"] = g.get("request_id", "-")
        latency_ms = (time.perf_counter() - g.get("start", time.perf_counter())) * 1000
        access_log.info("request_id=%s method=%s path=%s status=%d batch=%d latency_ms=%.1f",
                        g.get("request_id", "-"), request.method, request.path, response.status_code,
                        g.get("batch_size", 0), latency_ms)
        return response

    @app.errorhandler(RequestError)
    def bad_request(exc):
        return _error(exc.status, exc.message)

    @app.errorhandler(HTTPException)
    def http_error(exc):
        if exc.code == 404:
            return _error(404, f"no route {request.path}; use POST / to score or GET /health")
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

    @app.get("/health")
    def health():
        models = [fn.name_or_path for fn in rewards.fns if isinstance(fn, RewardModel)]
        return jsonify(status="ok", rewards=rewards.names, weights=rewards.weights, max_score=rewards.max_score,
                       **({"reward_model": models[0] if len(models) == 1 else models} if models else {}))

    @app.post("/")
    def score():
        if token is not None:
            auth = request.headers.get("Authorization", "")
            given = auth[len("Bearer "):] if auth.startswith("Bearer ") else ""
            if not given:
                raise RequestError(401, "missing token: send the header 'Authorization: Bearer <token>'")
            if not hmac.compare_digest(given.encode(), token.encode()):
                raise RequestError(401, "wrong token in the Authorization header")
        length = request.content_length
        if length is not None and length > max_content_length:
            raise RequestError(413, f"request body of {length} bytes exceeds the limit of {max_content_length} "
                                    "bytes (start the server with a larger --max-body-mb, or send smaller batches)")
        batch = parse_batch(request.get_data(cache=False))
        g.batch_size = len(batch["response"])
        turns = {"turns": batch["turns"]} if "turns" in batch else {}  # multi-turn: the rows' messages
        result = rewards(batch["src"], batch["response"], tgt=batch["tgt"], **turns)
        return jsonify(error_code=0, error_msg="Success", score=result.scores,
                       scores_by_function=result.scores_by_function, errors=result.errors,
                       request_id=g.request_id)

    return app
