"""RewardClient against real HTTP servers that misbehave on purpose, and the in-process twin."""
import json
import socket
import time

import pytest

from paddle_grpo.rewards.client import (InProcessRewarder, RewardClient, RewardRequestError, RewardResponseError,
                                        RewardServerError, make_rewarder)
from reward_server import create_app

TGT = "(1) Ann is a knight\n(2) Bob is a knave"
GOOD = "x</think><answer>Ann is a knight, Bob is a knave</answer>"
BATCH = (["p", "p"], [TGT, TGT], [GOOD, "no format"])


class Scripted:
    """A WSGI app answering the i-th request with replies[i] (the last one repeats); counts requests."""

    def __init__(self, *replies, delay_s=0.0):
        self.replies, self.delay_s, self.hits = replies, delay_s, 0

    def __call__(self, environ, start_response):
        reply = self.replies[min(self.hits, len(self.replies) - 1)]
        self.hits += 1
        environ["wsgi.input"].read()
        time.sleep(self.delay_s)
        status, body = reply
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        start_response(f"{status} X", [("Content-Type", "application/json"), ("Content-Length", str(len(data)))])
        return [data]


def ok(scores):
    return 200, {"error_code": 0, "error_msg": "Success", "score": scores}


def dead_url():
    with socket.socket() as sock:  # a port nobody listens on once the socket is closed
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


def fast_client(urls, **kwargs):
    options = dict(connect_timeout=1, read_timeout=5, max_retries=2, backoff=0.01)
    options.update(kwargs)
    return RewardClient(urls, **options)


def test_scores_from_real_server(serve):
    server = serve(create_app("kk,tag_format", weights=[1, 0.5]))
    result = fast_client(server.url).score_detailed(*BATCH)
    assert result.scores_by_function == {"kk": [3.0, -3.0], "tag_format": [1.0, 0.0]}
    assert result.scores == [3.0 + 0.5 * 1.0, -3.0 + 0.5 * 0.0]
    assert result.errors == [None, None]


def test_paddlenlp_style_reply_without_breakdown(serve):
    server = serve(Scripted(ok([1, None])))
    result = fast_client(server.url).score_detailed(*BATCH)
    assert result.scores == [1.0, None] and result.scores_by_function == {} and result.errors == [None, None]


def test_5xx_retried_then_success(serve):
    app = Scripted((503, {"error_code": 503, "error_msg": "busy"}), (500, "oops"), ok([0.5, 1.5]))
    server = serve(app)
    assert fast_client(server.url).score(*BATCH) == [0.5, 1.5]
    assert app.hits == 3


def test_5xx_forever_raises_naming_the_server(serve):
    app = Scripted((503, {"error_code": 503, "error_msg": "overloaded"}))
    server = serve(app)
    with pytest.raises(RewardServerError) as info:
        fast_client(server.url, max_retries=2).score(*BATCH)
    assert app.hits == 3
    assert str(info.value).count(f"{server.url} -> HTTP 503: overloaded") == 3


def test_4xx_not_retried(serve):
    app = Scripted((400, {"error_code": 400, "error_msg": "field 'tgt' item 1 must be a string"}))
    server = serve(app)
    with pytest.raises(RewardRequestError, match="HTTP 400: field 'tgt' item 1 must be a string"):
        fast_client(server.url).score(*BATCH)
    assert app.hits == 1


def test_429_is_retried(serve):
    app = Scripted((429, {"error_code": 429, "error_msg": "slow down"}), ok([1, 2]))
    server = serve(app)
    assert fast_client(server.url).score(*BATCH) == [1.0, 2.0]
    assert app.hits == 2


@pytest.mark.parametrize("reply, message", [
    ((200, "not json"), "not JSON"),
    ((200, {"error_code": 1, "error_msg": "reward crashed", "score": [0, 0]}), "error_code=1: 'reward crashed'"),
    (ok([1.0]), "answered 1 scores for a batch of 2"),
    (ok([1.0, "high"]), "non-numeric score at index 1"),
    ((200, {"error_code": 0, "error_msg": "Success"}), "score=NoneType"),
    ((200, [1, 2]), "JSON list, not an object"),
])
def test_malformed_reply_is_an_error(serve, reply, message):
    app = Scripted(reply)
    server = serve(app)
    with pytest.raises(RewardResponseError, match=message):
        fast_client(server.url).score(*BATCH)
    assert app.hits == 1  # a protocol violation is not retried


def test_read_timeout_retried_and_reported(serve):
    app = Scripted(ok([1, 1]), delay_s=1.0)
    server = serve(app)
    with pytest.raises(RewardServerError, match="ReadTimeout") as info:
        fast_client(server.url, read_timeout=0.2, max_retries=1).score(*BATCH)
    assert str(info.value).count(server.url) == 2


def test_connection_refused_names_url():
    url = dead_url()
    started = time.monotonic()
    with pytest.raises(RewardServerError) as info:
        fast_client(url, max_retries=2, backoff=0.05).score(*BATCH)
    message = str(info.value)
    assert message.count(f"{url} -> ConnectionError") == 3 and "Connection refused" in message
    assert "failed 3 times for a batch of 2" in message
    assert time.monotonic() - started < 5


def test_a_batch_json_cannot_carry_is_refused_at_once_not_retried(serve):
    # requests raises InvalidJSONError (a RequestException) for NaN; retrying the same batch cannot help, so the
    # client must say so at once rather than stall for reward_server_max_wait_s (it was retried as a transport
    # failure: 3 attempts, all logged as 'reward server failed').
    server = Scripted(ok([1.0]))
    url = serve(server).url
    started = time.monotonic()
    with pytest.raises(RewardRequestError, match="field 'turns' cannot be sent as JSON") as info:
        fast_client(url, max_retries=5, backoff=0.5).score_detailed(["p"], ["t"], ["r"],
                                                                      turns=[[{"role": "tool", "x": float("nan")}]])
    assert "NaN" in str(info.value) or "nan" in str(info.value)
    assert server.hits == 0 and time.monotonic() - started < 0.5


def test_round_robin_and_failover(serve):
    a, b = Scripted(ok([1, 1])), Scripted(ok([2, 2]))
    url_a, url_b = serve(a).url, serve(b).url
    client = fast_client(f"{url_a}, {url_b}")
    results = [client.score(*BATCH) for _ in range(10)]
    assert (a.hits, b.hits) == (5, 5)
    assert results.count([1.0, 1.0]) == 5
    # A dead server in the list: every batch still succeeds on the live one.
    c = Scripted(ok([3, 3]))
    client = fast_client([dead_url(), serve(c).url], max_retries=1)
    assert all(client.score(*BATCH) == [3.0, 3.0] for _ in range(6))
    assert c.hits == 6


def test_token_sent(serve):
    server = serve(create_app("kk", token="s3cret"))
    assert fast_client(server.url, token="s3cret").score(*BATCH) == [3.0, -3.0]
    with pytest.raises(RewardRequestError, match="HTTP 401: wrong token"):
        fast_client(server.url, token="guess").score(*BATCH)


def test_client_argument_errors():
    with pytest.raises(ValueError, match="at least one"):
        RewardClient(" , ")
    with pytest.raises(ValueError, match="http://"):
        RewardClient("127.0.0.1:8731")
    with pytest.raises(ValueError, match="equal lengths"):
        RewardClient("http://127.0.0.1:1").score(["p"], [], ["r"])
    assert RewardClient("http://127.0.0.1:1").score([], [], []) == []


def test_in_process_rewarder_matches_server(serve):
    server = serve(create_app("kk,tag_format", weights=[1, 0.5]))
    local = InProcessRewarder("kk,tag_format", weights=[1, 0.5])
    remote = fast_client(server.url)
    assert local.score(*BATCH) == remote.score(*BATCH) == [3.5, -3.0]
    assert local.score_detailed(*BATCH).scores_by_function == remote.score_detailed(*BATCH).scores_by_function


def test_make_rewarder():
    assert isinstance(make_rewarder(True, "http://127.0.0.1:8731,http://127.0.0.1:8732"), RewardClient)
    assert isinstance(make_rewarder(False, reward_funcs="kk"), InProcessRewarder)
    with pytest.raises(ValueError, match="reward_server is empty"):
        make_rewarder(True, "")
    with pytest.raises(ValueError, match="reward_funcs"):
        make_rewarder(False)
