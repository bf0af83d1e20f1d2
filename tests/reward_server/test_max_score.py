"""The maximal reward (what eval/accuracy counts as correct) from functions, RewardSet, server and client."""

from paddle_grpo.rewards import RewardSet, get_reward_fn
from paddle_grpo.rewards.client import InProcessRewarder, RewardClient
from paddle_grpo.rewards.tag_format import make_tag_format_reward
from reward_server import create_app


def test_builtins_declare_their_maximum():
    assert {n: get_reward_fn(n).max_score for n in ("kk", "gsm8k", "rouge_l", "length_similarity", "tag_format")} \
        == {"kk": 3.0, "gsm8k": 1.0, "rouge_l": 1.0, "length_similarity": 1.0, "tag_format": 1.0}
    assert make_tag_format_reward(match_score=5, miss_score=-1).max_score == 5.0


def test_weighted_maximum_and_when_it_is_unknown():
    assert RewardSet("kk,tag_format", weights=[1.0, 0.5]).max_score == 3.5
    assert RewardSet("kk,tag_format", weights=[1.0, -0.5]).max_score is None  # needs tag_format's minimum
    assert RewardSet([lambda prompts, completions, **kw: [0.0] * len(completions)]).max_score is None
    assert InProcessRewarder("gsm8k,kk", weights=[2, 1]).max_score == 5.0


def test_server_reports_it_and_the_client_reads_it(serve):
    url = serve(create_app("kk,rouge_l", weights=[1.0, 2.0])).url
    assert RewardClient(url).max_score == 5.0


def test_client_without_a_reachable_server_says_unknown(free_port):
    client = RewardClient(f"http://127.0.0.1:{free_port}", connect_timeout=0.5)
    assert client.max_score is None
