"""RewardSet: weighted totals, per-function scores, per-sample isolation of failures and timeouts, and how a
failure (total None) differs from an abstention (None term skipped in the sum)."""
import math
import threading
import time

import numpy as np
import pytest

from paddle_grpo.rewards import RewardSet, Scores

RELEASE = threading.Event()  # lets the deliberately hung calls finish at the end of the test session


def fragile(prompts, completions, **kwargs):
    """Raises on any batch holding 'BOOM', else the completion's length."""
    if any("BOOM" in c for c in completions):
        raise ValueError("cannot score BOOM")
    return [float(len(c)) for c in completions]


def sleepy(prompts, completions, **kwargs):
    """Hangs on 'SLOW' (until released), else 1.0."""
    if any("SLOW" in c for c in completions):
        RELEASE.wait(30)
    return [1.0] * len(completions)


def abstain(prompts, completions, **kwargs):
    """None (abstains, no reason) for completions starting with '?', else 2.0."""
    return [None if c.startswith("?") else 2.0 for c in completions]


def unsure(prompts, completions, **kwargs):
    """None with a reason (a reported failure) for '?' completions, else 2.0."""
    return Scores([None if c == "?" else 2.0 for c in completions],
                  ["no idea" if c == "?" else None for c in completions])


@pytest.fixture(autouse=True, scope="module")
def release_hung_calls():
    yield
    RELEASE.set()


def test_weighted_total_and_breakdown():
    rs = RewardSet(["tag_format", "tag_format_strict"], weights="0.5,2")
    out = rs(["p"] * 3, ["<answer>a</answer>", "x <answer>a</answer>", "nothing"], tgt=["", "", ""])
    assert out.scores_by_function == {"tag_format": [1.0, 1.0, 0.0], "tag_format_strict": [1.0, 0.0, 0.0]}
    assert out.scores == [2.5, 0.5, 0.0]
    assert out.errors == [None, None, None]


def test_returned_none_is_skipped_in_the_sum():
    rs = RewardSet([abstain, "tag_format"], weights=[1.0, 3.0])
    out = rs(["p"] * 3, ["?", "? <answer>y</answer>", "<answer>y</answer>"])
    assert out.scores_by_function == {"abstain": [None, None, 2.0], "tag_format": [0.0, 1.0, 1.0]}
    assert out.scores == [0.0, 3.0, 5.0]  # samples 0 and 1: tag_format's term alone (3 * 0.0, 3 * 1.0)
    assert out.errors == [None, None, None]  # abstaining is not an error
    alone = RewardSet([abstain])(["p", "p"], ["?", "x"])
    assert alone.scores == [None, 2.0]  # every term None -> None total
    assert alone.errors == [None, None]


def fixed_scores(name, values):
    """A reward function named `name` that returns `values` (one per completion, in order)."""
    def fn(prompts, completions, **kwargs):
        assert len(completions) == len(values)
        return list(values)

    fn.__name__ = name
    return fn


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_weighted_sum_over_non_none_terms_matches_a_loop(seed):
    rng = np.random.default_rng(seed)
    n_fn, n = 3, 11
    raw = rng.normal(size=(n_fn, n))
    scores = [[None if rng.random() < 0.3 else float(raw[k, i]) for i in range(n)] for k in range(n_fn)]
    weights = [float(w) for w in rng.uniform(-2.0, 2.0, size=n_fn)]
    out = RewardSet([fixed_scores(f"f{k}", scores[k]) for k in range(n_fn)], weights=weights)(["p"] * n, ["c"] * n)
    assert out.scores_by_function == {f"f{k}": scores[k] for k in range(n_fn)}
    assert out.errors == [None] * n
    for i in range(n):
        terms = [weights[k] * scores[k][i] for k in range(n_fn) if scores[k][i] is not None]
        # a float64 weighted sum of <= n_fn terms against the exactly rounded fsum: n_fn u64 ~ 1e-15 relative
        assert out.scores[i] == (pytest.approx(math.fsum(terms), rel=1e-12, abs=1e-15) if terms else None)


def test_infinite_scores_are_failures_too():
    out = RewardSet([fixed_scores("f", [math.inf, -math.inf, 1.0]), "tag_format"])(["p"] * 3, ["a", "b", "c"])
    assert out.scores == [None, None, 1.0]
    assert out.errors == ["f: returned inf", "f: returned -inf", None]


def test_none_with_a_reason_is_a_failure():
    rs = RewardSet([unsure, "tag_format"], weights=[1.0, 3.0])
    out = rs(["p", "p"], ["?", "<answer>y</answer>"])
    assert out.scores_by_function == {"unsure": [None, 2.0], "tag_format": [0.0, 1.0]}
    assert out.scores == [None, 5.0]
    assert out.errors == ["unsure: no idea", None]


def test_raising_sample_makes_the_total_none():
    rs = RewardSet([fragile, "tag_format"])
    out = rs(["p"] * 3, ["ab", "BOOM <answer>c</answer>", "<answer>c</answer>"])
    assert out.scores_by_function == {"fragile": [2.0, None, 18.0], "tag_format": [0.0, 1.0, 1.0]}
    # Sample 1: tag_format's 1.0 is not paid alone; the failure makes the whole total None.
    assert out.scores == [2.0, None, 19.0]
    assert out.errors == [None, "fragile: ValueError: cannot score BOOM", None]


def same_but_raising(prompts, completions, **kwargs):
    """Raises on 'BOOM', None on '?', else 2.0: both cases in one function."""
    if any("BOOM" in c for c in completions):
        raise ValueError("cannot score BOOM")
    return [None if c.startswith("?") else 2.0 for c in completions]


def test_raise_versus_return_none_with_weights_1_and_half():
    rs = RewardSet([same_but_raising, "tag_format"], weights=[1.0, 0.5])
    out = rs(["p"] * 3, ["BOOM <answer>a</answer>", "? <answer>a</answer>", "<answer>a</answer>"])
    assert out.scores == [None, 0.5, 2.5]
    assert out.errors == ["same_but_raising: ValueError: cannot score BOOM", None, None]


def test_failures_in_two_functions_are_both_reported():
    rs = RewardSet([fragile, unsure])
    out = rs(["p", "p"], ["BOOM", "?"])
    assert out.scores == [None, None]
    assert out.errors == ["fragile: ValueError: cannot score BOOM", "unsure: no idea"]


def test_a_failure_is_logged(caplog):
    RewardSet([fragile])(["p"] * 3, ["a", "BOOM", "BOOM"])
    assert "reward fragile failed on 2 of 3 samples (their total reward is None); first: ValueError: cannot " \
           "score BOOM" in caplog.text


def test_hanging_sample_times_out_alone():
    rs = RewardSet([sleepy, fragile], timeout_s=0.3)
    started = time.monotonic()
    out = rs(["p"] * 3, ["a", "SLOW", "ccc"])
    elapsed = time.monotonic() - started
    assert out.scores_by_function == {"sleepy": [1.0, None, 1.0], "fragile": [1.0, 4.0, 3.0]}
    assert out.errors == [None, "sleepy: timed out after 0.3 s", None]
    assert out.scores == [2.0, None, 4.0]  # a timeout is a failure: fragile's 4.0 is not paid alone
    assert elapsed < 2.0, elapsed  # batch call (0.3 s) + concurrent per-sample calls (0.3 s)


def test_bad_return_values():
    def wrong_length(prompts, completions, **kwargs):
        return [1.0]

    def mixed(prompts, completions, **kwargs):
        return ["high", float("nan"), True, 3]

    out = RewardSet([wrong_length])(["p"] * 2, ["a", "b"])
    assert out.scores == [1.0, 1.0]  # per-sample calls return one score each, which is the right length
    out = RewardSet([mixed, "tag_format"])(["p"] * 4, ["a", "b", "c", "d"])
    assert out.scores == [None, None, 1.0, 3.0]  # a value that is not a finite number is a failure
    assert out.errors == ["mixed: returned a str, not a number", "mixed: returned nan", None, None]


def test_a_note_beside_a_number_is_not_an_error():
    def noted(prompts, completions, **kwargs):
        return Scores([1.0], ["fine, just saying"])

    out = RewardSet([noted])(["p"], ["a"])
    assert out.scores == [1.0] and out.errors == [None]


def test_columns_are_sliced_per_sample():
    seen = []

    def picky(prompts, completions, tgt=None, completion_ids=None, **kwargs):
        if len(completions) > 1:
            raise RuntimeError("batch not supported")
        seen.append((tgt, completion_ids, kwargs["note"]))
        return [0.0]

    RewardSet([picky])(["p", "q"], ["a", "b"], tgt=["t0", "t1"], completion_ids=[[1], [2]], note="same")
    assert seen == [(["t0"], [[1]], "same"), (["t1"], [[2]], "same")]


def test_configuration_errors():
    with pytest.raises(ValueError, match="got 1 reward weights for 2 reward functions \\(kk, gsm8k\\)"):
        RewardSet("kk,gsm8k", weights=[1.0])
    with pytest.raises(ValueError, match="must be numbers"):
        RewardSet("kk", weights="heavy")
    with pytest.raises(KeyError, match="unknown reward"):
        RewardSet("kk,nope")
    with pytest.raises(ValueError, match="at least one"):
        RewardSet("")
    assert RewardSet([fragile, fragile]).names == ["fragile", "fragile#2"]
