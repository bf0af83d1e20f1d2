"""Answer extractors (`extract_answer`, the evaluation's majority vote): the built-ins and the recipes' read the
answer their reward compares; RewardSet takes the first function that has one; a failing extractor costs its
batch's answers, not the run."""
import logging

import pytest

from paddle_grpo.recipes import quickstart, quickstart_tools, smollm2
from paddle_grpo.rewards import RewardSet, get_reward_fn, register_reward, unregister_reward
from paddle_grpo.rewards.client import InProcessRewarder

KK_TRUTH = "(1) Ann is a knight\n(2) Bob is a knave"


def test_kk_reads_the_answer_it_scores():
    fn = get_reward_fn("kk")
    completions = ["<think>x</think>\n<answer>Bob is a knave. Ann is a knight.</answer>",  # right, other order
                   "x</think><answer>(1) Ann is a knight (2) Bob is a knight</answer>",   # <think> prepended: wrong
                   "Ann is a knight and Bob is a knave.",                                  # format fails: no answer
                   "<think>x</think><answer>Ann is a knight</answer>"]                     # Bob has no status
    answers = fn.extract_answer(["p"] * 4, completions, tgt=[KK_TRUTH] * 4)
    assert answers == ["ann is a knight; bob is a knave", "ann is a knight; bob is a knight", None, None]
    assert fn(["p"] * 4, completions, tgt=[KK_TRUTH] * 4) == [3.0, -0.5, -3.0, -1.0]


def test_gsm8k_reads_the_answer_it_compares():
    fn = get_reward_fn("gsm8k")
    texts = ["so #### 1,000", "The answer is \\boxed{72}.", "about 12 then 13.", "no number"]
    assert fn.extract_answer(["p"] * 4, texts, tgt=["#### 1000"] * 4) == ["1000", "72", "13", None]
    assert getattr(get_reward_fn("gsm8k_format"), "extract_answer", None) is None  # a format reward reads none


def test_recipe_rewards_read_their_answers():
    assert quickstart.addition_reward.extract_answer(["p"] * 3, [" 137\n", "", "13 7"]) == ["137", None, "13 7"]
    assert quickstart_tools.multiplication_reward.extract_answer(["p"], ["30954"]) == ["30954"]
    assert smollm2.first_number_reward.extract_answer(["p"] * 3, ["= 12, so 14", "-3", "none"]) == ["12", "-3", None]


def test_the_first_function_with_an_extractor_gives_the_answers(caplog):
    rewarder = InProcessRewarder("tag_format,kk,gsm8k")
    assert rewarder.answer_source == "kk"
    got = rewarder.extract_answers(["p"], [KK_TRUTH], ["<think>x</think><answer>Ann is a knight, Bob is a "
                                                      "knave</answer>"])
    assert got == ["ann is a knight; bob is a knave"]
    assert InProcessRewarder("tag_format").answer_source is None
    assert InProcessRewarder("tag_format").extract_answers(["p"], ["t"], ["r"]) is None

    def broken(prompts, completions, **kwargs):
        raise RuntimeError("no parse")

    def scored(prompts, completions, **kwargs):
        return [1.0] * len(completions)

    scored.extract_answer = broken
    register_reward("test_broken_extractor")(scored)
    try:
        with caplog.at_level(logging.WARNING, logger="paddle_grpo.rewards.combine"):
            assert RewardSet("test_broken_extractor").extract_answers(["p", "q"], ["a", "b"]) == [None, None]
        assert any("extract_answer failed" in r.getMessage() and "no parse" in r.getMessage()
                   for r in caplog.records)
    finally:
        unregister_reward("test_broken_extractor")


def test_register_reward_keeps_the_extractor():
    def answers(prompts, completions, **kwargs):
        return [c[:1] for c in completions]

    @register_reward("test_with_answers", max_score=1.0, extract_answer=answers)
    def fn(prompts, completions, **kwargs):
        return [0.0] * len(completions)

    try:
        assert fn.extract_answer is answers and fn.max_score == 1.0
        assert RewardSet("test_with_answers").extract_answers(["p"], ["xy"]) == ["x"]
    finally:
        unregister_reward("test_with_answers")
    with pytest.raises(ValueError):
        register_reward("bad,name")
