"""K&K reward: PaddleNLP's rules (format +1/-1; answer +2/-1.5/-2) on hand-written responses."""
import pytest

from paddle_grpo.rewards import get_reward_fn
from paddle_grpo.rewards.kk import format_ok, kk_score, last_answer, parse_answer, parse_ground_truth

TGT = "(1) Michael is a knight\n(2) Zoey is a knave\n(3) Ethan is a knight"
RIGHT = "(1) Michael is a knight\n(2) Zoey is a knave\n(3) Ethan is a knight"


def respond(answer, think="Suppose Michael is a knight..."):
    # The prompt ends with "<think>", so a real completion starts inside the think block.
    return f"{think}</think>\n<answer>{answer}</answer>"


@pytest.mark.parametrize("response, expected", [
    (respond(RIGHT), 3.0),                                                     # +1 +2
    ("<think>" + respond(RIGHT), 3.0),                                         # explicit <think> also fine
    (respond("(1) Ethan is a knight\n(2) Michael is a knight\n(3) Zoey is a knave"), 3.0),  # any order
    (respond("  MICHAEL   is a  KNIGHT,\n\n zoey is a Knave;   ethan is a knight  "), 3.0),  # case, spaces
    (respond("Michael is a knight, Zoey is a knave, and Ethan is a knight."), 3.0),
    (respond("(1) Michael is a knave\n(2) Zoey is a knave\n(3) Ethan is a knight"), -0.5),  # +1 -1.5
    (respond("(1) Michael is a knight\n(2) Zoey is a knave"), -1.0),          # Ethan missing: +1 -2
    (respond("I don't know"), -1.0),                                           # +1 -2
    (respond(""), -1.0),
    (respond("Michael is a knight, Michael is a knave, Zoey is a knave, Ethan is a knight"), -1.0),  # ambiguous
    ("Michael is a knight</think> no answer tags", -3.0),                     # format -1, answer -2
    (respond(RIGHT) + "<answer>" + RIGHT + "</answer>", -3.0),                # two answer blocks
    ("<answer>" + RIGHT + "</answer><think>x</think>", -3.0),                 # tags out of order
    ("<think>a</think><think>" + respond(RIGHT), -3.0),                       # <think> twice
    (respond(RIGHT).replace("</answer>", ""), -3.0),                           # unclosed answer
    ("", -3.0),
])
def test_kk_scores(response, expected):
    assert kk_score(response, TGT) == expected


def test_kk_batch_signature_ignores_extra_columns():
    kk = get_reward_fn("kk")
    out = kk(["p", "p"], [respond(RIGHT), "junk"], tgt=[TGT, TGT], completion_ids=[[1, 2], [3]], split="train")
    assert out == [3.0, -3.0]


def test_kk_accepts_chat_completions():
    kk = get_reward_fn("kk")
    assert kk(["p"], [[{"role": "assistant", "content": respond(RIGHT)}]], tgt=[TGT]) == [3.0]


def test_kk_needs_references():
    kk = get_reward_fn("kk")
    with pytest.raises(ValueError, match="tgt"):
        kk(["p"], [respond(RIGHT)])
    with pytest.raises(ValueError, match="1 completions but 2 references"):
        kk(["p"], [respond(RIGHT)], tgt=[TGT, TGT])


def test_ground_truth_formats():
    assert parse_ground_truth(TGT) == {"michael": "knight", "zoey": "knave", "ethan": "knight"}
    assert parse_ground_truth("Aurora is a knight, Ethan is a knave, and Noah is a knight.") == {
        "aurora": "knight", "ethan": "knave", "noah": "knight"}
    with pytest.raises(ValueError, match="cannot read"):
        parse_ground_truth("nothing useful")
    with pytest.raises(ValueError, match="two statuses"):
        parse_ground_truth("(1) Ann is a knight\n(2) Ann is a knave")


def test_name_matching_is_whole_word():
    # "Ava" must not match inside "Avery": Avery's status must not be read as Ava's.
    truth = {"ava": "knave", "avery": "knight"}
    assert parse_answer("Avery is a knight and Ava is a knave", truth) == truth
    assert parse_answer("Avery is a knight", truth) is None


def test_format_and_last_answer():
    assert format_ok("<think>a</think><answer>b</answer>")
    assert not format_ok("<think>a</think><answer>b</answer></answer>")
    assert last_answer("<answer>one</answer> <answer>two</answer>") == "two"
    assert last_answer("<answer>open only") is None
