"""Rewards see the trajectory (docs/tools.md, "Masks"): for a multi-turn rollout `completion_texts` is each row's final
assistant turn, `step.score` passes `turns` to in-process reward functions (a TRL-style function that ignores it keeps
working) and `completion_ids` of the whole completion; through a real reward server on 127.0.0.1 the request carries
`turns`, the server hands them to its functions, and a malformed `turns` field is answered 400. `ToolMetrics` against
counts by hand."""
import numpy as np
import paddle
import pytest
import requests

from paddle_grpo import step
from paddle_grpo.parallel import ParallelContext
from paddle_grpo.rewards.client import InProcessRewarder, RewardClient
from paddle_grpo.rollout import Rollout
from reward_server import create_app

TURNS = [
    [{"role": "assistant", "content": "Let me compute.", "tool_calls": [{"name": "calculator",
                                                                           "arguments": {"expression": "12*34"}}]},
     {"role": "tool", "name": "calculator", "content": "408", "error": None, "latency_s": 0.25},
     {"role": "assistant", "content": "It is 408.", "tool_calls": []}],
    [{"role": "assistant", "content": "It is 400.", "tool_calls": []}],
    [{"role": "assistant", "content": "", "tool_calls": [{"name": "abacus", "arguments": {}}]},
     {"role": "tool", "name": "abacus", "content": "error: unknown tool 'abacus'", "error": "unknown_tool",
      "latency_s": 0.0},
     {"role": "assistant", "content": "", "tool_calls": [{"name": "calculator", "arguments": {"expression": "1/0"}}]},
     {"role": "tool", "name": "calculator", "content": "error: timed out", "error": "timeout", "latency_s": 0.75}],
]
# Per row: "a" action, "t" tool output / template, "." padding (the union contiguous from column 0).
LAYOUT = ["aatttaa", "aaa....", "atttatt"]
ACTIONS = np.array([[c == "a" for c in r] for r in LAYOUT], dtype="int64")
TOOLS = np.array([[c == "t" for c in r] for r in LAYOUT], dtype="int64")


def tool_rollout():
    n, T = ACTIONS.shape
    ids = np.arange(1, n * T + 1).reshape(n, T) * (ACTIONS | TOOLS)
    r = Rollout(prompt_ids=paddle.ones([n, 2], "int64"), prompt_mask=paddle.ones([n, 2], "int64"),
                completion_ids=paddle.to_tensor(ids), completion_mask=paddle.to_tensor(ACTIONS),
                lengths=ACTIONS.sum(1), truncated=np.array([False, False, True]),
                sample_logprobs=paddle.zeros([n, T]))
    r.tool_mask, r.turns = paddle.to_tensor(TOOLS), TURNS
    return r


def used_408(prompts, completions, turns=None, **kwargs):
    return [float(any(m["role"] == "tool" and m["content"] == "408" for m in t)) + float("408" in c)
            for t, c in zip(turns, completions)]


def trl_style(prompts, completions, **kwargs):
    return [float(len(c)) for c in completions]


def test_rewards_score_the_final_answer_and_get_the_turns():
    rollout = tool_rollout()
    texts = step.completion_texts(None, rollout)  # no tokenizer needed: the answer is in the turns
    assert texts == ["It is 408.", "It is 400.", ""]
    seen = {}

    def keep(prompts, completions, turns=None, completion_ids=None, **kwargs):
        seen.update(turns=turns, completion_ids=completion_ids)
        return [0.0] * len(completions)

    records = [{"src": "q", "tgt": "408"}]
    result = step.score(ParallelContext(), InProcessRewarder([used_408, trl_style, keep]), False, records, [0],
                        rollout, texts, 3)
    assert result.scores_by_function["used_408"] == [2.0, 0.0, 0.0]
    assert result.scores_by_function["trl_style"] == [10.0, 10.0, 0.0]
    assert seen["turns"] == TURNS
    ids = rollout.completion_ids.numpy()
    assert seen["completion_ids"] == [ids[0, :7].tolist(), ids[1, :3].tolist(), ids[2, :7].tolist()]


def test_the_reward_server_gets_the_turns(serve):
    server = serve(create_app([used_408, trl_style]))
    client = RewardClient(server.url, max_retries=0)
    texts = [step.final_answer(t) for t in TURNS]
    result = client.score_detailed(["q"] * 3, ["408"] * 3, texts, turns=TURNS)
    assert result.scores_by_function["used_408"] == [2.0, 0.0, 0.0]
    assert result.scores == [12.0, 10.0, 0.0]
    # Without turns a function that needs them fails on every sample (its reason in `errors`), the batch answers.
    assert client.score_detailed(["q"], ["408"], ["x"]).scores == [None]


@pytest.mark.parametrize("turns, why", [
    ("x", "field 'turns' must be an array of 1 arrays of message objects"),
    ([[]] * 2, "field 'turns' must be an array of 1 arrays of message objects"),
    ([["assistant"]], "field 'turns' must be an array of 1 arrays of message objects"),
])
def test_a_malformed_turns_field_is_answered_400(serve, turns, why):
    server = serve(create_app([trl_style]))
    reply = requests.post(server.url + "/", json={"src": ["q"], "tgt": [""], "response": ["a"], "turns": turns},
                          timeout=10)
    assert reply.status_code == 400
    assert why in reply.json()["error_msg"]


def test_tool_metrics_count_turns_calls_errors_and_tool_tokens():
    rollout = tool_rollout()
    batch = step.Batch.from_rollout(rollout, step.completion_texts(None, rollout),
                                    step.score(ParallelContext(), InProcessRewarder([trl_style]), False,
                                               [{"src": "q"}], [0], rollout, ["a"] * 3, 3), [0], 3)
    m = step.ToolMetrics.of(ParallelContext(), batch, wait_s=1.5).as_dict()
    assert m == {"rollout/turns_per_sample": 5 / 3, "rollout/tool_calls_per_sample": 3 / 3,
                 "rollout/tool_use_rate": 2 / 3, "rollout/tool_error_rate": 2 / 3, "rollout/tool_timeout_rate": 1 / 3,
                 "rollout/tool_latency_s": pytest.approx(1.0 / 3, rel=1e-15), "rollout/tool_token_share": 8 / 17,
                 "perf/tool_wait_s": 1.5}
    assert step.tool_calls_per_row(batch.turns, 3) == [1, 0, 2]
    counts = step.tool_counts_per_row(batch.turns, 3)
    assert [c[0] for c in counts] == [1, 0, 2] and sum(c[1] for c in counts) == 2 and sum(c[2] for c in counts) == 5
    # the evaluation's counts of the same rows give the rollout's numbers (a second code path: ToolMetrics.of)
    again = step.eval_tool_metrics(counts, None)
    assert again == {"eval/tool_use_rate": m["rollout/tool_use_rate"], "eval/turns_per_sample": 5 / 3,
                     "eval/tool_calls_per_sample": m["rollout/tool_calls_per_sample"],
                     "eval/tool_error_rate": m["rollout/tool_error_rate"]}
    # hand-made: 4 samples, 1 + 2 calls of which 1 failed, 2 + 1 + 3 + 1 turns
    out = step.eval_tool_metrics([(1, 0, 2), (0, 0, 1), (2, 1, 3), (0, 0, 1)], np.array([True, False, False, True]))
    assert out == {"eval/tool_use_rate": 0.5, "eval/tool_calls_per_sample": 0.75, "eval/tool_error_rate": 1 / 3,
                   "eval/turns_per_sample": 1.75, "eval/accuracy_with_tools": 0.5, "eval/accuracy_without_tools": 0.5}
    assert np.isnan(step.eval_tool_metrics([(1, 0, 2)], np.array([True]))["eval/accuracy_without_tools"])
    assert step.eval_tool_metrics([(0, 0, 1)], None)["eval/tool_error_rate"] == 0.0  # no call: no failed call
    assert step.tool_counts_per_row(None, 2) == [(0, 0, 1), (0, 0, 1)]
