"""The reward server's HTTP protocol on a real waitress server: good requests, every kind of bad one, tokens,
limits, request ids and access logs, per-sample failures, and concurrency without a global lock."""
import json
import logging
import threading

import pytest
import requests

from paddle_grpo.rewards import Scores
from reward_server import create_app

TGT = "(1) Ann is a knight\n(2) Bob is a knave"
GOOD = "x</think><answer>(1) Ann is a knight\n(2) Bob is a knave</answer>"
FLIPPED = "x</think><answer>(1) Ann is a knave\n(2) Bob is a knave</answer>"
VALID = {"src": ["q1", "q2", "q3"], "tgt": [TGT] * 3, "response": [GOOD, FLIPPED, "no tags"]}


@pytest.fixture
def url(serve):
    return serve(create_app("kk,tag_format", weights=[1.0, 0.5], max_content_length=4096)).url


def post(url, body, headers=None, **kwargs):
    data = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return requests.post(url + "/", data=data, timeout=10, headers={"Content-Type": "application/json",
                                                                    **(headers or {})}, **kwargs)


def test_scores_batch(url):
    reply = post(url, VALID)
    assert reply.status_code == 200
    body = reply.json()
    assert body["error_code"] == 0 and body["error_msg"] == "Success"
    assert body["scores_by_function"] == {"kk": [3.0, -0.5, -3.0], "tag_format": [1.0, 1.0, 0.0]}
    assert body["score"] == [3.5, 0.0, -3.0]
    assert body["errors"] == [None, None, None]
    assert body["request_id"] == reply.headers["X-Request-Id"]


def test_health(url):
    reply = requests.get(url + "/health", timeout=5)
    assert reply.status_code == 200
    assert reply.json() == {"status": "ok", "rewards": ["kk", "tag_format"], "weights": [1.0, 0.5], "max_score": 3.5}


@pytest.mark.parametrize("body, message", [
    (b"", "empty request body"),
    (b"{not json", "request body is not valid JSON"),
    (b"\xff\xfe\xfa garbage", "request body is not valid JSON"),
    (b"[" * 2000 + b"]" * 2000, "request body is not valid JSON"),   # deep enough for RecursionError
    ([VALID], "must be a JSON object with fields src, tgt, response; got a JSON array"),
    ({"src": ["a"], "tgt": ["b"]}, "missing field 'response'"),
    ({"tgt": ["b"]}, "missing fields 'src', 'response'"),
    ({**VALID, "src": "q1"}, "field 'src' must be an array of strings, got a JSON string"),
    ({**VALID, "tgt": None}, "field 'tgt' must be an array of strings, got a JSON null"),
    ({**VALID, "response": [GOOD, 7, "x"]}, "field 'response' item 1 must be a string, got a JSON number"),
    ({**VALID, "tgt": [TGT, TGT, {"a": 1}]}, "field 'tgt' item 2 must be a string, got a JSON object"),
    ({**VALID, "tgt": [TGT]}, "fields src, tgt and response must have equal lengths, got src=3, tgt=1, response=3"),
    ({"src": [], "tgt": [], "response": []}, "empty batch: src, tgt and response have no items"),
])
def test_bad_request(url, body, message):
    reply = post(url, body)
    assert reply.status_code == 400
    assert reply.json() == {"error_code": 400, "error_msg": reply.json()["error_msg"]}
    assert message in reply.json()["error_msg"]
    assert requests.get(url + "/health", timeout=5).status_code == 200  # still serving


def test_body_over_limit(url):
    big = {**VALID, "response": ["y" * 5000, "", ""]}
    reply = post(url, big)
    assert reply.status_code == 413
    body = reply.json()
    assert body["error_code"] == 413
    assert "exceeds the limit of 4096 bytes" in body["error_msg"] and "--max-body-mb" in body["error_msg"]


def test_chunked_body_over_limit(url):
    # No Content-Length: the limit is enforced while reading the stream.
    chunks = (part.encode() for part in ['{"src": ["', "y" * 5000, '"], "tgt": ["t"], "response": ["r"]}'])
    reply = requests.post(url + "/", data=chunks, timeout=10, headers={"Content-Type": "application/json"})
    assert reply.status_code == 413
    assert "exceeds the limit of 4096 bytes" in reply.json()["error_msg"]


def test_unknown_route_and_method(url):
    reply = requests.get(url + "/score", timeout=5)
    assert reply.status_code == 404
    assert reply.json() == {"error_code": 404, "error_msg": "no route /score; use POST / to score or GET /health"}
    reply = requests.get(url + "/", timeout=5)
    assert reply.status_code == 405
    assert reply.json()["error_code"] == 405
    assert "method GET is not allowed on /" in reply.json()["error_msg"] and "POST" in reply.json()["error_msg"]
    assert requests.post(url + "/health", timeout=5).status_code == 405


def test_token(serve):
    url = serve(create_app("kk", token="s3cret")).url
    # A header without the Bearer scheme is malformed, not missing (it was reported as "missing token").
    malformed = "malformed Authorization header: it must be 'Bearer <token>' (the word Bearer, a space, the token)"
    cases = [({}, "missing token: send the header 'Authorization: Bearer <token>'"),
             ({"Authorization": "Bearer nope"}, "wrong token in the Authorization header"),
             ({"Authorization": "s3cret"}, malformed), ({"Authorization": "Token s3cret"}, malformed),
             ({"Authorization": "Bearer "}, malformed)]
    for headers, message in cases:
        reply = post(url, VALID, headers=headers)
        assert reply.status_code == 401, headers
        assert reply.json() == {"error_code": 401, "error_msg": message}, headers
    assert post(url, VALID, headers={"Authorization": "Bearer s3cret"}).json()["score"] == [3.0, -0.5, -3.0]
    assert post(url, VALID, headers={"Authorization": "bearer s3cret"}).status_code == 200  # the scheme's case: free
    assert requests.get(url + "/health", timeout=5).status_code == 200  # health stays open


def test_token_checked_before_body(serve):
    url = serve(create_app("kk", token="s3cret")).url
    reply = post(url, b"{not json")
    assert reply.status_code == 401


def test_request_id_and_access_log(url, caplog):
    caplog.set_level(logging.INFO, logger="reward_server.access")
    reply = post(url, VALID, headers={"X-Request-Id": "trainer-step-7"})
    assert reply.headers["X-Request-Id"] == "trainer-step-7"
    unsafe = post(url, VALID, headers={"X-Request-Id": "bad id\twith spaces"})
    assert unsafe.headers["X-Request-Id"] != "bad id\twith spaces" and len(unsafe.headers["X-Request-Id"]) == 16
    bad = post(url, {"src": []})
    lines = [r.getMessage() for r in caplog.records if r.name == "reward_server.access"]
    assert any("request_id=trainer-step-7 method=POST path=/ status=200 batch=3 latency_ms=" in l for l in lines)
    assert any(f"request_id={bad.headers['X-Request-Id']} " in l and "status=400 batch=0" in l for l in lines)


RELEASE = threading.Event()


def flaky(prompts, completions, **kwargs):
    if any("BOOM" in c for c in completions):
        raise RuntimeError("exploded on purpose")
    if any("HANG" in c for c in completions):
        RELEASE.wait(20)
    return Scores([1.0] * len(completions))


def test_failing_sample_is_null_with_reason(serve):
    # A raise or a timeout in one function makes that sample's total null, even though tag_format scored it.
    url = serve(create_app([flaky, "tag_format"], timeout_s=0.3)).url
    try:
        reply = post(url, {"src": ["q"] * 3, "tgt": ["t"] * 3, "response": ["fine", "BOOM", "HANG <answer>a</answer>"]})
    finally:
        RELEASE.set()
    assert reply.status_code == 200
    body = reply.json()
    assert body["scores_by_function"] == {"flaky": [1.0, None, None], "tag_format": [0.0, 0.0, 1.0]}
    assert body["score"] == [1.0, None, None]
    assert body["errors"] == [None, "flaky: RuntimeError: exploded on purpose", "flaky: timed out after 0.3 s"]


def test_requests_are_scored_concurrently(serve):
    # Both requests must be inside the reward function at the same time to pass the barrier:
    # a global lock around scoring would make the barrier time out.
    barrier = threading.Barrier(2, timeout=5)

    def meet(prompts, completions, **kwargs):
        barrier.wait()
        return [1.0] * len(completions)

    url = serve(create_app([meet], timeout_s=None), threads=4).url
    replies = []
    threads = [threading.Thread(target=lambda: replies.append(post(url, VALID))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert [r.status_code for r in replies] == [200, 200]
    assert all(r.json()["errors"] == [None] * 3 for r in replies)
