"""Multi-turn rollouts with the calculator, end to end in one process: the Trainer on tool_helpers' tiny policy
(whose turns hold calculator calls whatever it is asked: well-formed, malformed and of an unknown tool), real files,
an in-process reward that reads the turns.

One step each of GRPO, REINFORCE++ and PPO: tool turns occur (tool_mask set, the calculator's 408 among the results,
the error paths too), the rewards scored the final assistant turn and saw the turns, the metrics of docs/algorithms.md
section 7 equal a recomputation from the step's batch, lengths count actions only, every parameter trained; LoRA
trains its adapters only; a resumed run continues exactly (same process, same kernels: bitwise); evaluation reports
tool use and accuracy with and without it. Multi-process parity: tests/parallel/test_tools_parallel.py.
"""
import json
import math

import numpy as np
import pytest
from tool_helpers import REWARD_FILE, build_tool_policy, write_tool_data

from paddle_grpo.config import config_from_dict
from paddle_grpo.step import final_answer
from paddle_grpo.trainer import Trainer
from resume_helpers import full_and_resumed, params, read_metrics

TOOL_METRICS = ("rollout/turns_per_sample", "rollout/tool_calls_per_sample", "rollout/tool_use_rate",
                "rollout/tool_error_rate", "rollout/tool_timeout_rate", "rollout/tool_latency_s",
                "rollout/tool_token_share", "perf/tool_wait_s")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    d = tmp_path_factory.mktemp("tools")
    build_tool_policy(str(d / "policy"))
    write_tool_data(str(d))
    (d / "rewards.py").write_text(REWARD_FILE)
    return d


def make_cfg(workdir, out, **overrides):
    values = dict(actor_model_name_or_path=str(workdir / "policy"), tools="calculator", max_turns=3,
                  use_rm_server=False, reward_funcs=f"{workdir / 'rewards.py'}:used_calculator",
                  train_datasets=str(workdir / "train.jsonl"), output_dir=str(out), logging_dir=str(out / "vdl"),
                  max_prompt_len=256, max_dec_len=128, min_dec_len=1, max_length=384, max_tool_response_len=32,
                  global_batch_size=4, rollout_n=4, per_device_train_batch_size=8, per_device_logprob_batch_size=16,
                  per_device_value_batch_size=16, learning_rate=2e-3, max_steps=1, kl_coeff=0.0,
                  save_strategy="no", disable_tqdm=True, seed=3, temperature=1.0, report_to="none")
    values.update(overrides)
    return config_from_dict(values)


def check_batch(batch, metrics):
    """The step's batch holds tool turns, and its metrics are what the batch says."""
    cm, tm = batch.completion_mask.numpy(), batch.tool_mask.numpy()
    union = cm | tm
    assert tm.any() and not (cm & tm).any()
    assert all(union[i, :union[i].sum()].all() for i in range(len(batch)))  # contiguous from column 0
    tools = [m for t in batch.turns for m in t if m["role"] == "tool"]
    assert any(m["content"].strip() == "408" and m["error"] is None for m in tools)  # a well-formed call ran
    assert {m["error"] for m in tools} - {None}  # and some failed (malformed / unknown tool): a message each
    # The rewards scored each row's final answer (completion_texts), and saw the turns (the reward asserts it).
    assert batch.texts == [final_answer(t) for t in batch.turns]
    np.testing.assert_array_equal(batch.lengths, cm.sum(1))  # lengths are actions
    n = len(batch)
    calls = [sum(m["role"] == "tool" for m in t) for t in batch.turns]
    expected = {"rollout/turns_per_sample": sum(m["role"] == "assistant" for t in batch.turns for m in t) / n,
                "rollout/tool_calls_per_sample": sum(calls) / n,
                "rollout/tool_use_rate": sum(c > 0 for c in calls) / n,
                "rollout/tool_error_rate": sum(m["error"] is not None for m in tools) / len(tools),
                "rollout/tool_timeout_rate": 0.0,
                "rollout/tool_token_share": tm.sum() / union.sum(),
                "response_length/mean": cm.sum(1).mean()}
    for key, value in expected.items():
        # float64 means of small integer counts: equal up to one rounding of the division (rel 1e-12)
        assert metrics[key] == pytest.approx(value, rel=1e-12), key
    assert 0 < metrics["rollout/tool_latency_s"] < 10 and metrics["perf/tool_wait_s"] >= 0


@pytest.mark.parametrize("algorithm", ["grpo", "reinforce_plus_plus", "ppo"])
def test_a_multi_turn_step_trains_with_tool_turns(workdir, tmp_path, algorithm):
    extra = dict(critic_model_name_or_path=str(workdir / "policy"), critic_learning_rate=1e-2) \
        if algorithm == "ppo" else {}
    trainer = Trainer(make_cfg(workdir, tmp_path / "out", rl_algorithm=algorithm, **extra))
    before = params(trainer.policy.model)
    trainer.train()
    after = params(trainer.policy.model)
    assert sum(not np.array_equal(before[k], after[k]) for k in before) > len(before) // 2
    (row,) = read_metrics(tmp_path / "out")
    check_batch(trainer.batch, row)
    b = trainer.batch  # the prompts list the tools (the format's system text, from the schema)
    prompt = trainer.tokenizer.decode(b.prompt_ids.numpy()[0][b.prompt_mask.numpy()[0] == 1].tolist())
    assert '"name": "calculator"' in prompt and prompt.rstrip().endswith("assistant")
    for key in TOOL_METRICS + ("train/policy_loss", "train/grad_norm", "train/reward"):
        assert math.isfinite(row[key]), key
    if algorithm == "ppo":
        assert row["train/value_loss"] > 0 and row["train/critic_grad_norm"] > 0
    with open(tmp_path / "out" / "rollouts.jsonl", encoding="utf-8") as f:
        samples = [json.loads(line) for line in f]
    assert samples and all(s["turns"] == trainer.batch.turns[i] for i, s in enumerate(samples))


def test_lora_trains_the_adapters_only(workdir, tmp_path):
    trainer = Trainer(make_cfg(workdir, tmp_path / "out", lora=True, lora_rank=4, learning_rate=1e-2))
    before = params(trainer.policy.model)
    trainer.train()
    after = params(trainer.policy.model)
    moved = {k for k in before if not np.array_equal(before[k], after[k])}
    assert moved and all("lora_" in k for k in moved)
    check_batch(trainer.batch, read_metrics(tmp_path / "out")[0])


def test_a_resumed_multi_turn_run_continues_exactly(workdir, tmp_path):
    """Stopped after step 1 and resumed: step 2's samples (tool turns included), metrics and the weights equal the
    uninterrupted run's bitwise (one process, the same kernels; the tools' timing does not enter the numbers:
    keyed sampling, each row's own KV slots)."""
    full, resumed = full_and_resumed(lambda out, **kw: make_cfg(workdir, out, **kw), tmp_path, 1, max_steps=2)
    a, b = read_metrics(tmp_path / "full"), read_metrics(tmp_path / "split")
    assert [r["step"] for r in a] == [1, 2] and [r["step"] for r in b] == [1, 2]
    for key in a[1]:
        if not key.startswith("perf/") and key != "rollout/tool_latency_s":  # wall times
            assert a[1][key] == b[1][key], key
    assert set(a[1]) == set(b[1])
    untimed = lambda turns: [[{k: v for k, v in m.items() if k != "latency_s"} for m in t] for t in turns]  # noqa
    assert untimed(full.batch.turns) == untimed(resumed.batch.turns)
    pa, pb = params(full.policy.model), params(resumed.policy.model)
    assert all(np.array_equal(pa[k], pb[k]) for k in pa)


def test_evaluation_reports_tool_use_and_accuracy_with_and_without_tools(workdir, tmp_path):
    trainer = Trainer(make_cfg(workdir, tmp_path / "out", do_eval=True, eval_datasets=str(workdir / "eval.jsonl"),
                               eval_do_sample=True, eval_max_reward=1.0, per_device_eval_batch_size=8))
    metrics = trainer.evaluate()
    use, acc = metrics["eval/tool_use_rate"], metrics["eval/accuracy"]
    with_tools, without = metrics["eval/accuracy_with_tools"], metrics["eval/accuracy_without_tools"]
    assert 0 < use <= 1 and metrics["eval/samples"] == 8
    # eval/accuracy is the mix of the two by the tool-use rate (a sample without calls cannot reach 1.0 here:
    # the reward's 1 needs a calculator result).
    assert without in (0.0,) or math.isnan(without)
    parts = [(use, with_tools), (1 - use, without)]
    assert acc == pytest.approx(sum(w * a for w, a in parts if w > 0), rel=1e-12)
    # a sample that uses a tool makes at least one call, and every sample has at least one assistant turn
    assert metrics["eval/tool_calls_per_sample"] >= use and metrics["eval/turns_per_sample"] >= 1
    assert 0 <= metrics["eval/tool_error_rate"] <= 1
    trainer.tools.close()


def test_tools_served_over_http_train_the_same_way(workdir, tmp_path, serve):
    """tool_server: the calls go to a real tool server on 127.0.0.1 (python -m reward_server --tool's app, with a
    token): the step's tool turns hold its results, and equal an in-process run's (the calculator is deterministic,
    and the samples do not depend on tool latency)."""
    from reward_server import create_app

    url = serve(create_app([], tools="calculator", token="T0k")).url
    remote = Trainer(make_cfg(workdir, tmp_path / "remote", tool_server=url, tool_server_token="T0k"))
    remote.train()
    check_batch(remote.batch, read_metrics(tmp_path / "remote")[0])
    local = Trainer(make_cfg(workdir, tmp_path / "local"))
    local.train()
    untimed = lambda turns: [[{k: v for k, v in m.items() if k != "latency_s"} for m in t] for t in turns]  # noqa
    assert untimed(remote.batch.turns) == untimed(local.batch.turns)
