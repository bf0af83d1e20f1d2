"""rouge_l against a hand-computed LCS, and length_similarity."""
import pytest

from paddle_grpo.rewards import get_reward_fn


def lcs(a, b):
    """Longest common subsequence length, plain dynamic programming (independent of rouge_score)."""
    table = [[0] * (len(b) + 1) for _ in range(len(a) + 1)]
    for i, x in enumerate(a):
        for j, y in enumerate(b):
            table[i + 1][j + 1] = table[i][j] + 1 if x == y else max(table[i][j + 1], table[i + 1][j])
    return table[-1][-1]


def test_rouge_l_hand_computed():
    ref, cand = "the quick brown fox jumps", "The brown dog jumps"
    # LCS = "the brown jumps" = 3 tokens; P = 3/4, R = 3/5, F1 = 2PR/(P+R) = 0.45*2/1.35 = 2/3.
    # float64 ratios of small integers: a few u64 roundings, far below approx's default rel 1e-6
    assert get_reward_fn("rouge_l")(["p"], [cand], tgt=[ref]) == [pytest.approx(2 / 3)]


def test_rouge_l_matches_plain_lcs_reference():
    pairs = [("a b c d e f", "a c e b d f"), ("police killed the gunman", "the gunman kill police"),
             ("x y z", "x y z"), ("one two", "three four")]
    for ref, cand in pairs:
        r, c = ref.lower().split(), cand.lower().split()
        k = lcs(r, c)
        expected = 0.0 if k == 0 else 2 * (k / len(c)) * (k / len(r)) / (k / len(c) + k / len(r))
        assert get_reward_fn("rouge_l")(None, [cand], tgt=[ref]) == [pytest.approx(expected)]  # float64 ratios


def test_rouge_l_empty_and_missing_tgt():
    assert get_reward_fn("rouge_l")(None, ["", "words"], tgt=["words", ""]) == [0.0, 0.0]
    with pytest.raises(ValueError, match="tgt"):
        get_reward_fn("rouge_l")(None, ["words"])


@pytest.mark.parametrize("completion, ref, expected", [
    ("one two three", "a b c d e f", 0.5),
    ("a b c d e f", "one two three", 0.5),
    ("same  length\nhere", "x y z", 1.0),
    ("", "", 1.0),
    ("", "x", 0.0),
])
def test_length_similarity(completion, ref, expected):
    assert get_reward_fn("length_similarity")(None, [completion], tgt=[ref], completion_ids=[[0]]) == [expected]
