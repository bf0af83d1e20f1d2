"""Trainer-side scoring: `RewardClient` for reward servers, `InProcessRewarder` for the same functions in-process.

Both have `score(src, tgt, response) -> list[float | None]` and `score_detailed(...) -> RewardResult`, so the
trainer treats them alike (`make_rewarder` picks one from `use_rm_server`). A None total means a reward function
failed on that sample (the reason is in `errors`) or every function returned None for it; the trainer leaves such
samples out (`train/reward_none_frac`). A failed request is never turned into reward 0 (PaddleNLP's client does
that): after its retries (by default for up to 10 minutes: `reward_server_max_wait_s`) the client raises
RewardServerError saying which servers were tried and how each failed.
"""
import itertools
import json
import logging
import math
import time
import uuid
from typing import Any, List, Optional, Sequence, Union

import requests

from ..http_util import RETRYABLE_4XX, WholeReplyAdapter, backoff_delay, error_msg, short_error
from .base import RewardFn
from .combine import RewardResult, RewardSet
from .reward_model import RewardModel

logger = logging.getLogger(__name__)


class RewardServerError(RuntimeError):
    """The reward server(s) could not score a batch; the message names each server tried and the failure."""


class RewardRequestError(RewardServerError):
    """A server rejected the request (4xx): retrying the same request cannot help."""


class RewardResponseError(RewardServerError):
    """A server answered 200 with a reply that breaks the protocol (not JSON, error_code != 0, wrong length)."""


def _split_urls(urls):
    if isinstance(urls, str):
        urls = urls.split(",")
    urls = [u.strip().rstrip("/") for u in urls if u and u.strip()]
    if not urls:
        raise ValueError("RewardClient needs at least one reward server URL (e.g. http://127.0.0.1:8731)")
    for url in urls:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"reward server URL must start with http:// or https://, got {url!r}")
    return urls


class RewardClient:
    """HTTP client for one or more reward servers (PaddleNLP's protocol).

    urls: list or comma-separated string. Each `score` call goes to the next server in turn (round-robin); a failed
    attempt moves on to the next server, after an exponential backoff (backoff * 2**k seconds, capped at
    max_backoff, with +-20 % jitter so many trainer ranks do not retry in lockstep). Retried: connection errors,
    timeouts, 5xx, 408, 429, for as long as the batch's first failure is less than `max_wait_s` seconds ago (the
    last wait is shortened to end at the budget), so a reward server that restarts costs time, not the run; every
    wait is logged with the server, the attempt, its length and the budget left. `max_retries` (-1: no limit) caps
    the number of retries as well: whichever ends first. Not retried: other 4xx (RewardRequestError, with the
    server's error_msg) and protocol violations in a 200 reply (RewardResponseError). `read_timeout` bounds a
    request's whole reply after it is sent, not each wait for a byte (a server or proxy trickling it would hold the
    trainer forever): mounted on `session` for each URL (http_util.WholeReplyAdapter).
    """

    def __init__(self, urls: Union[str, Sequence[str]], connect_timeout: float = 5, read_timeout: float = 60,
                 max_retries: int = -1, backoff: float = 0.5, token: Optional[str] = None,
                 session: Optional[requests.Session] = None, max_backoff: float = 30.0,
                 max_wait_s: float = 600.0) -> None:
        self.urls = _split_urls(urls)
        self.timeout = (connect_timeout, read_timeout)
        if max_retries < -1:
            raise ValueError(f"max_retries must be -1 (no limit) or >= 0, got {max_retries}")
        if max_wait_s < 0:
            raise ValueError(f"max_wait_s must be >= 0, got {max_wait_s}")
        self.max_retries = max_retries
        self.max_wait_s = max_wait_s
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.session = session or requests.Session()
        whole_reply = WholeReplyAdapter()
        for url in self.urls:
            self.session.mount(url + "/", whole_reply)
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._turn = itertools.count()  # next() is atomic in CPython, so threads may share a client

    @property
    def max_score(self) -> Optional[float]:
        """The best total reward the server's functions can give (from its GET /health), or None when the server
        does not say (a PaddleNLP server) or cannot be asked. Asked once."""
        if not hasattr(self, "_max_score"):
            self._max_score = None
            for url in self.urls:
                try:
                    reply = self.session.get(url + "/health", timeout=self.timeout, headers=self.headers)
                    if reply.status_code == 200:
                        value = reply.json().get("max_score")
                        self._max_score = None if value is None else float(value)
                        break
                except (requests.RequestException, ValueError, AttributeError) as exc:
                    logger.warning("could not read max_score from %s/health: %s", url, short_error(exc))
        return self._max_score

    def score(self, src: Sequence[str], tgt: Sequence[str], response: Sequence[str]) -> List[Optional[float]]:
        """Weighted total reward per sample (None: a reward function failed on it, or none judged it)."""
        return self.score_detailed(src, tgt, response).scores

    def score_detailed(self, src: Sequence[str], tgt: Sequence[str], response: Sequence[str],
                       turns: Optional[Sequence[list]] = None) -> RewardResult:
        """RewardResult with the totals, the per-function scores and per-sample reasons (when the server sends
        them; a PaddleNLP server sends only `score`). `turns`: multi-turn rows' messages, sent as the request's
        `turns` field (our server passes them to the reward functions)."""
        batch = {"src": list(src), "tgt": list(tgt), "response": list(response)}
        if turns is not None:
            batch["turns"] = list(turns)
        n = len(batch["response"])
        if not (len(batch["src"]) == len(batch["tgt"]) == n):
            raise ValueError(f"src, tgt and response must have equal lengths, got {len(batch['src'])}, "
                             f"{len(batch['tgt'])}, {n}")
        if n == 0:
            return RewardResult([], {}, [])
        body = _json_body(batch)
        request_id = uuid.uuid4().hex[:16]
        first = next(self._turn)
        failures: List[str] = []
        first_failure = None
        for attempt in itertools.count():
            url = self.urls[(first + attempt) % len(self.urls)]
            try:
                reply = self.session.post(url + "/", data=body, timeout=self.timeout,
                                          headers={**self.headers, "X-Request-Id": request_id,
                                                   "Content-Type": "application/json"})
            except requests.RequestException as exc:
                failure = short_error(exc)
            else:
                status = reply.status_code
                if status == 200:
                    return _check_reply(reply, url, n, request_id)
                if status < 500 and status not in RETRYABLE_4XX:
                    raise RewardRequestError(f"reward server {url} rejected the request (request {request_id}) "
                                             f"with HTTP {status}: {error_msg(reply)}")
                failure = f"HTTP {status}: {error_msg(reply)}"
            failures.append(f"{url} -> {failure}")
            now = time.monotonic()
            first_failure = now if first_failure is None else first_failure
            left = self.max_wait_s - (now - first_failure)
            if left <= 0 or 0 <= self.max_retries <= attempt:
                raise RewardServerError(
                    f"reward servers failed {len(failures)} times for a batch of {n} over "
                    f"{now - first_failure:.0f} s (request {request_id}; retries end after "
                    f"reward_server_max_wait_s = {self.max_wait_s:g} s"
                    + (f" or reward_server_max_retries = {self.max_retries}" if self.max_retries >= 0 else "")
                    + "): " + _join_failures(failures))
            delay = backoff_delay(attempt, self.backoff, self.max_backoff)
            delay = min(delay, left)
            logger.warning("reward server %s failed (attempt %d, request %s): %s; retrying in %.1f s (%.1f s of "
                           "the %g s wait budget left, reward_server_max_wait_s)", url, attempt + 1, request_id,
                           failure, delay, left - delay, self.max_wait_s)
            time.sleep(delay)
        raise AssertionError("unreachable")  # itertools.count() never ends


def _json_body(batch: dict) -> bytes:
    """The request body, serialized once for every attempt. A value JSON cannot carry (NaN, Infinity: what a
    reward function's `turns` may hold) raises RewardRequestError naming the field at once: sending the same batch
    again cannot help (requests' own InvalidJSONError is a RequestException, so it used to be retried until
    reward_server_max_wait_s ran out)."""
    try:
        return json.dumps(batch, allow_nan=False).encode("utf-8")
    except (TypeError, ValueError):
        pass
    for field, value in batch.items():  # only on failure: which field, for the message
        try:
            json.dumps(value, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise RewardRequestError(f"the batch's field '{field}' cannot be sent as JSON ({exc}): JSON has no NaN, "
                                     "Infinity or non-JSON objects; the reward server was not asked") from None
    raise AssertionError("unreachable: the batch failed to serialize but none of its fields did")


def _join_failures(failures: List[str], keep: int = 6) -> str:
    """The failures of one batch, all of them when few, else the first and the last ones."""
    if len(failures) <= keep:
        return "; ".join(failures)
    head, tail = failures[:2], failures[-(keep - 2):]
    return "; ".join(head) + f"; ... ({len(failures) - keep} more) ...; " + "; ".join(tail)


def _check_reply(reply, url, n, request_id):
    where = f"reward server {url} (request {request_id})"
    try:
        body = reply.json()
    except ValueError:
        raise RewardResponseError(f"{where} answered 200 with a body that is not JSON: {reply.text[:200]!r}")
    if not isinstance(body, dict):
        raise RewardResponseError(f"{where} answered with a JSON {type(body).__name__}, not an object")
    if body.get("error_code") != 0:
        raise RewardResponseError(f"{where} answered error_code={body.get('error_code')!r}: "
                                  f"{body.get('error_msg')!r}")
    scores = body.get("score")
    if not isinstance(scores, list) or len(scores) != n:
        got = f"{len(scores)} scores" if isinstance(scores, list) else f"score={type(scores).__name__}"
        raise RewardResponseError(f"{where} answered {got} for a batch of {n}")
    for i, value in enumerate(scores):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not math.isfinite(value)):
            raise RewardResponseError(f"{where} answered a non-numeric score at index {i}: {value!r}")
    scores = [None if v is None else float(v) for v in scores]
    by_function = body.get("scores_by_function") or {}
    errors = body.get("errors") or [None] * n
    if not isinstance(by_function, dict) or not isinstance(errors, list) or len(errors) != n:
        raise RewardResponseError(f"{where} answered a malformed scores_by_function / errors field")
    failed = [e for e in errors if e is not None]
    if failed:  # otherwise the reasons would only be in the server's log, not the trainer's
        logger.warning("%s: a reward function failed on %d of %d samples (their total reward is None); first: %s",
                       where, len(failed), n, str(failed[0])[:300])
    return RewardResult(scores, by_function, errors)


class InProcessRewarder:
    """The same `score` / `score_detailed` interface, computed in this process with a RewardSet
    (`use_rm_server: false`). Extra dataset columns may be passed as keyword arguments."""

    def __init__(self, reward_funcs: Union[str, Sequence[Union[str, RewardFn]]],
                 weights: Union[str, Sequence[float], None] = None, timeout_s: Optional[float] = None) -> None:
        self.reward_set = RewardSet(reward_funcs, weights=weights, timeout_s=timeout_s)

    @property
    def max_score(self) -> Optional[float]:
        return self.reward_set.max_score

    def score(self, src: Sequence[str], tgt: Sequence[str], response: Sequence[str],
              **columns: Any) -> List[Optional[float]]:
        return self.score_detailed(src, tgt, response, **columns).scores

    @property
    def answer_source(self) -> Optional[str]:
        """The reward function whose answer extractor the evaluation's majority vote uses (None: none has one)."""
        return self.reward_set.answer_source

    def extract_answers(self, src: Sequence[str], tgt: Sequence[str], response: Sequence[str],
                        **columns: Any) -> Optional[List[Optional[str]]]:
        """Each response's final answer (RewardSet.extract_answers), None when no function reads one."""
        return self.reward_set.extract_answers(list(src), list(response), tgt=list(tgt), **columns)

    def score_detailed(self, src: Sequence[str], tgt: Sequence[str], response: Sequence[str],
                       **columns: Any) -> RewardResult:
        return self.reward_set(list(src), list(response), tgt=list(tgt), **columns)


def make_rewarder(use_rm_server: bool, reward_server: Optional[str] = None,
                  reward_funcs: Union[str, Sequence[Union[str, RewardFn]], None] = None,
                  reward_weights: Union[str, Sequence[float], None] = None, token: Optional[str] = None,
                  timeout_s: Optional[float] = None, reward_model_name_or_path: str = "",
                  reward_batch_size: int = 8, **client_kwargs: Any) -> Union[RewardClient, InProcessRewarder]:
    """RewardClient(reward_server) when use_rm_server, else InProcessRewarder(reward_funcs, reward_weights).

    reward_model_name_or_path (in-process only): a RewardModel, loaded here and scoring after the reward_funcs
    (which may then be empty), `reward_batch_size` sequences per forward pass; its weight is the last of
    reward_weights. Under data parallelism every rank builds its own and scores its own rows."""
    model = (reward_model_name_or_path or "").strip()
    if use_rm_server:
        if model:
            raise ValueError(f"reward_model_name_or_path ({model}) is set while use_rm_server is true: the reward "
                             "server hosts the model (python -m reward_server --reward-model DIR); set "
                             "use_rm_server: false to score with it in this process")
        if not reward_server:
            raise ValueError("use_rm_server is true but reward_server is empty; give e.g. http://127.0.0.1:8731")
        return RewardClient(reward_server, token=token, **client_kwargs)
    funcs = [f.strip() for f in reward_funcs.split(",") if f.strip()] if isinstance(reward_funcs, str) \
        else list(reward_funcs or [])
    if model:
        funcs.append(RewardModel(model, batch_size=reward_batch_size).load())
    if not funcs:
        raise ValueError("use_rm_server is false: set reward_funcs (e.g. 'kk' or 'gsm8k,tag_format') or "
                         "reward_model_name_or_path")
    return InProcessRewarder(funcs, weights=reward_weights, timeout_s=timeout_s)
