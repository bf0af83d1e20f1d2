"""Seed 001's loose and strict `<answer>` format rewards, with configurable tag and scores."""
import pytest

from paddle_grpo.rewards import get_reward_fn, make_tag_format_reward


@pytest.mark.parametrize("text, loose, strict", [
    ("<answer>4</answer>", 1.0, 1.0),
    ("  <answer>\nfour zeros\n</answer>\n", 1.0, 1.0),        # multi-line and a trailing newline: both pass
    ("I think <answer>4</answer> is right", 1.0, 0.0),       # text around it: loose only
    ("<answer></answer>", 0.0, 0.0),                         # nothing inside (seed: `.+`)
    ("<answer>   </answer>", 1.0, 0.0),                      # blank inside: loose (seed) but not strict
    ("<answer>4", 0.0, 0.0),
    ("</answer>4<answer>", 0.0, 0.0),                        # closing before opening
    ("<answer>1</answer><answer>2</answer>", 1.0, 0.0),      # two blocks: not strict
    ("no tags at all", 0.0, 0.0),
])
def test_default_rewards(text, loose, strict):
    assert get_reward_fn("tag_format")(["p"], [text]) == [loose]
    assert get_reward_fn("tag_format_strict")(["p"], [text]) == [strict]


def test_seed_scores_and_custom_tag():
    # Seed 001 paid 5 for the loose format and 10 for the strict one.
    loose = make_tag_format_reward(match_score=5, miss_score=0)
    strict = make_tag_format_reward(strict=True, match_score=10, miss_score=-1)
    texts = ["x <answer>a</answer> y", "<answer>a</answer>"]
    assert loose(None, texts, completion_ids=[[1], [2]]) == [5.0, 5.0]
    assert strict(None, texts) == [-1.0, 10.0]
    think = make_tag_format_reward(tag="think", strict=True)
    assert think([], ["<think>hmm</think>", "<answer>a</answer>"]) == [1.0, 0.0]


def test_bad_tag_name():
    with pytest.raises(ValueError, match="bare tag name"):
        make_tag_format_reward(tag="<answer>")
