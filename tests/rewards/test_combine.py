"""RewardSet: weighted totals, per-function scores, and per-sample isolation of failures and timeouts."""
import threading
import time

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


def unsure(prompts, completions, **kwargs):
    """None ("cannot judge") for '?' completions, with a reason."""
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


def test_none_terms_left_out():
    rs = RewardSet([unsure, "tag_format"], weights=[1.0, 3.0])
    out = rs(["p", "p"], ["?", "<answer>y</answer>"])
    assert out.scores == [0.0, 5.0]            # sample 0: only tag_format's 3 * 0.0
    assert out.errors == ["unsure: no idea", None]
    alone = RewardSet([unsure])(["p", "p"], ["?", "x"])
    assert alone.scores == [None, 2.0]          # no term at all -> None total


def test_raising_sample_is_isolated():
    rs = RewardSet([fragile, "tag_format"])
    out = rs(["p"] * 3, ["ab", "BOOM", "<answer>c</answer>"])
    assert out.scores_by_function["fragile"] == [2.0, None, 18.0]
    assert out.scores == [2.0, 0.0, 19.0]
    assert out.errors == [None, "fragile: ValueError: cannot score BOOM", None]


def test_hanging_sample_times_out_alone():
    rs = RewardSet([sleepy, fragile], timeout_s=0.3)
    started = time.monotonic()
    out = rs(["p"] * 3, ["a", "SLOW", "ccc"])
    elapsed = time.monotonic() - started
    assert out.scores_by_function == {"sleepy": [1.0, None, 1.0], "fragile": [1.0, 4.0, 3.0]}
    assert out.errors == [None, "sleepy: timed out after 0.3 s", None]
    assert out.scores == [2.0, 4.0, 4.0]
    assert elapsed < 2.0, elapsed  # batch call (0.3 s) + concurrent per-sample calls (0.3 s)


def test_bad_return_values():
    def wrong_length(prompts, completions, **kwargs):
        return [1.0]

    def mixed(prompts, completions, **kwargs):
        return ["high", float("nan"), True, 3]

    out = RewardSet([wrong_length])(["p"] * 2, ["a", "b"])
    assert out.scores == [1.0, 1.0]  # per-sample calls return one score each, which is the right length
    out = RewardSet([mixed])(["p"] * 4, ["a", "b", "c", "d"])
    assert out.scores == [None, None, 1.0, 3.0]
    assert out.errors == ["mixed: returned a str, not a number", "mixed: returned nan", None, None]


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
