"""gsm8k_format: the strict-match `#### N` line, hand-written cases."""
import pytest

from paddle_grpo.rewards import RewardSet, get_reward_fn


@pytest.mark.parametrize("completion, expected", [
    ("She has 3 + 4 = 7 apples.\n#### 7", 1.0),
    ("#### 1,080\n\n", 1.0),
    ("#### -2.5", 1.0),
    ("#### $18.", 1.0),
    ("The answer is 7.", 0.0),                 # a bare number: right for `gsm8k`, not this format
    ("#### 7\nI hope that helps!", 0.0),       # not the last line
    ("#### seven", 0.0),
    ("\\boxed{7}", 0.0),
    ("", 0.0),
])
def test_format_line(completion, expected):
    assert get_reward_fn("gsm8k_format")(["q"], [completion]) == [expected]


def test_combined_with_the_answer_reward():
    rs = RewardSet("gsm8k,gsm8k_format", weights=[1.0, 0.2])
    result = rs(["q", "q", "q"], ["#### 7", "the answer is 7", "#### 8"], tgt=["#### 7"] * 3)
    assert result.scores == pytest.approx([1.2, 1.0, 0.2])  # float64 weighted sums: u64 roundings only
    assert rs.max_score == pytest.approx(1.2)
