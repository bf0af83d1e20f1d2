"""GSM8K reward: answer extraction, math-verify equivalence, and the per-sample time limit."""
import threading
import time

import pytest

from paddle_grpo.rewards import get_reward_fn, make_gsm8k_reward
from paddle_grpo.rewards.gsm8k import completion_answer, gold_answer, last_boxed
from paddle_grpo.rewards.math_verify_pool import MathVerifyPool

# sympy evaluating 10^(10^10) would run for a very long time: the canonical pathological answer.
PATHOLOGICAL = r"so the result is \boxed{10^{10^{10}}}"


@pytest.mark.parametrize("tgt, gold", [
    ("Natalia sold 48/2 = <<48/2=24>>24 clips.\n#### 72", "72"),
    ("#### 1,080", "1080"),
    ("  -3 ", "-3"),
    ("#### 2.5\n", "2.5"),
    ("#### \\frac{1}{2}", "\\frac{1}{2}"),
])
def test_gold_answer(tgt, gold):
    assert gold_answer(tgt) == gold


def test_gold_answer_missing():
    with pytest.raises(ValueError, match="no answer"):
        gold_answer("#### ")


@pytest.mark.parametrize("text, answer", [
    ("24 in May, 72 in total\n#### 72", "72"),                      # #### wins over later numbers
    ("#### $1,234\nThen 5 more", "1234"),
    ("#### 1/2 cup", "1/2 cup"),                                    # not a plain number: math-verify reads it
    ("first \\boxed{3} then \\boxed{\\frac{1}{2}} and 9", "\\boxed{\\frac{1}{2}}"),  # last boxed wins
    ("\\boxed{1,000}", "1000"),
    ("48 + 24 = 72. The answer is 72.", "72"),                       # last number
    ("It is -4.5 degrees", "-4.5"),
    ("no numbers here", None),
    ("\\boxed{", None),
])
def test_completion_answer(text, answer):
    assert completion_answer(text) == answer


def test_last_boxed_nested_braces():
    assert last_boxed("x \\boxed{\\frac{a}{b}} y") == "\\frac{a}{b}"


def test_gsm8k_scores():
    gsm8k = get_reward_fn("gsm8k")
    completions = ["#### 72", "#### $72 dollars", "\\boxed{72}", "so the answer is 72.", "\\boxed{\\frac{144}{2}}",
                   "72.0",
                   "#### 71", "the answer is 73", "I give up", [{"role": "assistant", "content": "#### 72"}]]
    out = gsm8k(["q"] * len(completions), completions, tgt=["...\n#### 72"] * len(completions),
                completion_ids=[[1]] * len(completions))
    assert out == [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0]
    assert out.errors == [None] * len(completions)


def test_gsm8k_fraction_gold():
    gsm8k = get_reward_fn("gsm8k")
    assert gsm8k(None, ["\\boxed{0.5}", "#### 1/2", "\\boxed{\\frac{1}{3}}"], tgt=["#### \\frac{1}{2}"] * 3) == \
        [1.0, 1.0, 0.0]


def test_pathological_answer_times_out_alone():
    # A private one-worker pool: the timed-out worker is killed and replaced, and the next sample is scored.
    pool = MathVerifyPool(size=1)
    try:
        reward = make_gsm8k_reward(timeout_s=1.0, pool=pool)
        started = time.monotonic()
        out = reward(None, ["#### 72", PATHOLOGICAL, "\\boxed{72}"], tgt=["#### 72"] * 3)
        elapsed = time.monotonic() - started
    finally:
        pool.close()
    assert list(out) == [1.0, None, 1.0]
    assert out.errors[1] == "math-verify timed out after 1 s"
    assert out.errors[0] is None and out.errors[2] is None
    assert elapsed < 15, elapsed


def test_gsm8k_works_off_the_main_thread():
    # math-verify's own signal-based timeouts raise ValueError outside the main thread; ours must not.
    results = []
    thread = threading.Thread(target=lambda: results.append(
        get_reward_fn("gsm8k")(None, ["#### 5", "#### 6"], tgt=["5", "5"])))
    thread.start()
    thread.join(60)
    assert results == [[1.0, 0.0]]
