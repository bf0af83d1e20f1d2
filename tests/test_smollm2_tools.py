"""The SmolLM2 tool recipe (configs/smollm2_tools.yaml, paddle_grpo/recipes/smollm2_tools.py and _warm.py): its data
split, the bytes of its tool format, its reward, its warm start's rows and build (on a tiny model), its config.

No real model is needed, except by the check against the imported model's chat template and tokenizer, skipped when
build/models/smollm2-135m-instruct is absent. The measured numbers are in docs/smollm2_tools.md.
"""
import importlib.util
import json
import os

import pytest

from paddle_grpo.config import load_config
from paddle_grpo.data import read_jsonl
from paddle_grpo.recipes import smollm2_tools as st
from paddle_grpo.recipes import smollm2_tools_warm as warm
from paddle_grpo.rewards import get_reward_fn

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_HAS_MODEL = os.path.isdir(os.path.join(_REPO, st.MODEL_DIR))

# The recipe's prompt for (412, 37, phrasing 2), written out by hand: SmolLM2's ChatML, its default system text,
# the short calculator note, the question, the assistant's turn opened.
PROMPT_412_37 = (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face\n\n"
    "You have a calculator. To use it, write\n<tool_call>\n"
    '{"name": "calculator", "arguments": {"expression": "12+34"}}\n</tool_call>\n'
    "and its result comes back between <tool_response> and </tool_response>.<|im_end|>\n"
    "<|im_start|>user\nA box holds 37 pencils. How many pencils are in 412 boxes?<|im_end|>\n"
    "<|im_start|>assistant\n")
TOOL_TURN_15244 = "\n<|im_start|>user\n<tool_response>\n15244\n</tool_response><|im_end|>\n<|im_start|>assistant\n"


def _load_tool(repo_root, name, path):
    spec = importlib.util.spec_from_file_location(name, repo_root / path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ------------------------------------------------------------------------------------------------------- the data

def test_split_is_disjoint_by_combination_in_either_order():
    train, held = st.split_problems()
    assert len(train) == 1000 and len(held) == 200
    combos = lambda side: [frozenset((a, b)) for a, b, _ in side]  # noqa: E731 - independent of st.combination
    assert len(set(combos(train))) == 1000 and len(set(combos(held))) == 200  # none repeats on a side
    assert not set(combos(train)) & set(combos(held))
    trained = {(a, b) for a, b, _ in train} | {(b, a) for a, b, _ in train}
    assert not [(a, b) for a, b, _ in held if (a, b) in trained or (b, a) in trained]
    assert all(100 <= a <= 999 and 10 <= b <= 99 and 0 <= k < len(st.PHRASINGS) for a, b, k in train + held)
    assert (123, 45) not in {(a, b) for a, b, _ in train + held}  # the schema's example is no problem
    assert st.split_problems() == (train, held)  # fixed: no run seed enters it
    assert {k for _, _, k in held} == set(range(len(st.PHRASINGS)))


def test_shipped_data_files_are_the_generators_output(repo_root, tmp_path):
    tool = _load_tool(repo_root, "_gen_smollm2_tools_data", "tools/data/gen_smollm2_tools_data.py")
    tool.main(["--out-dir", str(tmp_path)])
    shipped = repo_root / "data" / "smollm2_tools"
    for name in ("train.jsonl", "eval.jsonl", "train_plain.jsonl", "eval_plain.jsonl"):
        assert (tmp_path / name).read_bytes() == (shipped / name).read_bytes()
    train, held = read_jsonl(str(shipped / "train.jsonl")), read_jsonl(str(shipped / "eval.jsonl"))
    plain = read_jsonl(str(shipped / "train_plain.jsonl")) + read_jsonl(str(shipped / "eval_plain.jsonl"))
    assert [(r["a"], r["b"], r["phrasing"]) for r in train] == st.split_problems()[0]
    assert [(r["a"], r["b"], r["phrasing"]) for r in held] == st.split_problems()[1]
    assert all(r["tgt"] == str(r["a"] * r["b"]) for r in train + held)
    for r, p in zip(train + held, plain):
        q = st.PHRASINGS[r["phrasing"]].format(a=r["a"], b=r["b"])
        assert r["src"].endswith(f"<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n")
        assert {k: v for k, v in r.items() if k != "src"} == {k: v for k, v in p.items() if k != "src"}
        assert p["src"] == ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
                                  f"Hugging Face<|im_end|>\n<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n")
    assert not {r["src"] for r in train} & {r["src"] for r in held}


# ------------------------------------------------------------------------------------------------------ the format

def test_prompt_and_tool_turn_bytes():
    assert st.prompt(412, 37, 2) == PROMPT_412_37
    assert st.tool_turn_text("15244") == TOOL_TURN_15244
    assert st.call_text("412*37") == '<tool_call>\n{"name": "calculator", "arguments": {"expression": "412*37"}}\n' \
                                     "</tool_call>"
    with_examples = st.prompt(412, 37, 2, examples=True)
    assert with_examples.count("<|im_start|>assistant\n<tool_call>") == len(st.EXAMPLES)
    assert with_examples.startswith(PROMPT_412_37[:PROMPT_412_37.index("<|im_start|>user")])
    assert with_examples.endswith(PROMPT_412_37[PROMPT_412_37.index("<|im_start|>user"):])
    assert '"$defs"' not in st.prompt(412, 37, 0, listing="qwen") and "# Tools" in st.prompt(412, 37, 0, listing="qwen")


def test_the_environment_reads_the_call_and_writes_the_tool_turn(plain_tokenizer):
    """Through the trainer's own environment (the markers several tokens, as in SmolLM2's vocabulary): the call
    is read and run at the end of the turn, and the tool turn is the recipe's bytes."""
    from paddle_grpo.data import tokenize_prompts
    from paddle_grpo.environment import HermesFormat, ToolEnvironment, load_tools

    env = ToolEnvironment(load_tools(["calculator"]), HermesFormat(default_system=st.SYSTEM), plain_tokenizer)
    assert env.stop_token_ids() == []  # no call-end token: the turn ends at <|im_end|>
    turn = tokenize_prompts(plain_tokenizer, [st.call_text("412*37") + "<|im_end|>"])[0]
    result = env.begin(turn, ended_by_call_end=False).result()
    assert result.messages[0]["content"] == "15244" and result.messages[0]["error"] is None
    assert plain_tokenizer.decode(result.ids) == TOOL_TURN_15244
    env.close()


@pytest.mark.skipif(not _HAS_MODEL, reason=f"{st.MODEL_DIR} not imported ({st.IMPORT_COMMAND})")
def test_prompt_is_the_models_chat_template_and_fits(repo_root):
    """The prompt and a whole tool conversation are what SmolLM2's own template renders for those messages (the
    tool result a user turn), and prompt and trajectory fit the config's lengths in its tokens."""
    from paddle_grpo.data import tokenize_prompts
    from paddle_grpo.policy import load_tokenizer

    tok = load_tokenizer(str(repo_root / st.MODEL_DIR))
    messages = [{"role": "system", "content": st.system_text()},
                {"role": "user", "content": st.question(412, 37, 2)}]
    assert tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == PROMPT_412_37
    conversation = messages + [{"role": "assistant", "content": st.call_text("412*37")},
                               {"role": "user", "content": "<tool_response>\n15244\n</tool_response>"}]
    rendered = tok.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
    assert rendered == PROMPT_412_37 + st.call_text("412*37") + "<|im_end|>" + TOOL_TURN_15244
    cfg = load_config(str(repo_root / "configs" / "smollm2_tools.yaml"), device="cpu", warn=False)
    assert max(len(tokenize_prompts(tok, [st.prompt(999, 99, k)])[0]) for k in range(4)) <= cfg.max_prompt_len
    trajectory = sum(len(tokenize_prompts(tok, [t])[0]) for t, _ in warm.transcript((999, 99, 0), True))
    assert trajectory <= cfg.max_dec_len


# ------------------------------------------------------------------------------------------------------ the reward

def test_reward_scores_the_last_number_of_the_final_answer():
    fn = get_reward_fn("paddle_grpo.recipes.smollm2_tools:final_answer_reward")
    assert fn is st.final_answer_reward and fn.max_score == 1.0
    completions = ["The answer is 15244.", "15,244", "412 * 37 = 15244", "15244 boxes, not 15245",
                   "The answer is 15245.", "fifteen thousand", "", "-15244", "152440"]
    assert fn(["p"] * 9, completions, tgt=["15244"] * 9) == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    # a chat completion: the content of its last message (the final assistant turn) is the answer
    turns = [{"role": "assistant", "content": "", "tool_calls": [{"name": "calculator"}]},
             {"role": "tool", "content": "15244"}, {"role": "assistant", "content": "It is 15244."}]
    assert fn(["p"], [turns], tgt=["15244"]) == [1.0]
    assert [st.final_number(t) for t in ("a 1,234,567 b", "x 12, y", "none", "3 - 5")] == [1234567, 12, None, 5]
    # the answer the majority vote counts is the number the reward compares
    assert fn.extract_answer is st.final_answer
    assert st.final_answer(["p"] * 4, ["The answer is 15,244.", "none", "-7", turns]) == ["15244", None, "-7", "15244"]


# -------------------------------------------------------------------------------------------------- the warm start

def test_warm_start_rows_learn_the_policy_tokens_only(plain_tokenizer):
    """The rows' policy mask covers the call (with its EOS) and the answer (with its EOS), not the tool turn; the
    rows' tokens are the prompt's and the transcript's, in order."""
    from paddle_grpo.data import tokenize_prompts

    problems = [(412, 37, 2), (100, 10, 0)]
    pid, pm, cid, cm, am = warm.encode(plain_tokenizer, problems, [True, False])
    head = tokenize_prompts(plain_tokenizer, [PROMPT_412_37[:PROMPT_412_37.index("<|im_start|>user")]])[0]
    assert pid.tolist() == [head, head] and pm.min() == 1
    decode = lambda ids: plain_tokenizer.decode([int(i) for i in ids])  # noqa: E731
    row = cid[0][cm[0] == 1]
    assert decode(pid[0]) + decode(row) == PROMPT_412_37 + st.call_text("412*37") + "<|im_end|>" + \
        TOOL_TURN_15244 + "The answer is 15244.<|im_end|>"
    learned = decode(cid[0][am[0] == 1])
    assert learned == st.call_text("412*37") + "<|im_end|>" + "The answer is 15244.<|im_end|>"
    assert decode(cid[1][am[1] == 1]) == "The answer is 1000.<|im_end|>"
    assert cm[1].sum() < cm[0].sum() and not am[1][cm[1] == 0].any()


def test_sft_plan_holds_out_the_eval_problems_and_mixes_tool_use():
    problems, use_tool, val = warm.sft_plan(0, 50, 16, 0.25, 32)
    train, held = st.split_problems()
    assert len(problems) == 800 and set(problems) <= set(train[:-32]) and val == train[-32:]
    assert not set(problems) & set(held)
    assert 0.18 < sum(use_tool) / len(use_tool) < 0.32
    assert warm.sft_plan(0, 50, 16, 0.25, 32) == (problems, use_tool, val)


def test_warm_start_builds_on_a_tiny_model(tmp_path, monkeypatch):
    """The builder fine-tunes the model at `base` and writes a directory the trainer loads: weights changed,
    tokenizer and build_info.json beside them."""
    import numpy as np

    from paddle_grpo.policy import load_policy
    from paddle_grpo.recipes.tiny import build_tiny_policy

    corpus = [st.prompt(a, b, k) + "".join(t for t, _ in warm.transcript((a, b, k), True))
              for a, b, k in st.split_problems()[0][:20]]
    base = str(tmp_path / "base")
    build_tiny_policy(base, corpus, vocab_size=400, seed=0)
    monkeypatch.setitem(warm.WARM, "batch_size", 4)
    monkeypatch.setitem(warm.WARM, "val_size", 4)
    monkeypatch.setitem(warm.WARM, "warmup_steps", 1)
    monkeypatch.setitem(warm.WARM, "learning_rate", 1e-3)
    out = str(tmp_path / "warm")
    stats = warm.build_smollm2_tools_policy(out, base=base, max_steps=3)
    assert stats["sft_steps"] == 3 and stats["loss_final"] < stats["loss_init"]
    with open(os.path.join(out, warm.BUILD_INFO), encoding="utf-8") as f:
        assert json.load(f)["sft_steps"] == 3
    before, after = load_policy(base).model.state_dict(), load_policy(out).model.state_dict()
    assert any(not np.allclose(before[k].numpy(), after[k].numpy()) for k in before)
    with pytest.raises(FileNotFoundError, match="import_gguf"):
        warm.build_smollm2_tools_policy(str(tmp_path / "x"), base=str(tmp_path / "missing"))


# ------------------------------------------------------------------------------------------------------ the config

def test_config_loads_and_builds_its_warm_start(repo_root, monkeypatch):
    from paddle_grpo.recipes import policy_builder

    cfg = load_config(str(repo_root / "configs" / "smollm2_tools.yaml"), device="cpu", warn=False)
    assert get_reward_fn(cfg.reward_funcs) is st.final_answer_reward
    assert cfg.tools == ["calculator"] and cfg.temperature == 1.0 and cfg.eval_do_sample
    assert cfg.build_actor_if_missing == "smollm2_tools"
    for path in (cfg.train_datasets, cfg.eval_datasets):
        assert os.path.isfile(repo_root / path)
    calls = []
    monkeypatch.setattr(warm, "build_smollm2_tools_policy", lambda d, **kw: calls.append((d, kw)))
    policy_builder(cfg)("some/dir")
    assert calls == [("some/dir", {"progress": False})] or calls == [("some/dir", {"progress": True})]
    off = load_config(str(repo_root / "configs" / "smollm2_tools.yaml"),
                      ["--tools", "", "--train_datasets", "data/smollm2_tools/train_plain.jsonl",
                       "--eval_datasets", "data/smollm2_tools/eval_plain.jsonl"], device="cpu", warn=False)
    assert off.tools == [] and "calculator" not in read_jsonl(str(repo_root / off.eval_datasets))[0]["src"]


def test_runs_collector_reads_metrics_and_cpu_log(repo_root, tmp_path):
    """tools/eval/smollm2_tools_runs.py on a hand-made run: evaluations, per-step tool metrics, the CPU seconds."""
    tool = _load_tool(repo_root, "_smollm2_tools_runs", "tools/eval/smollm2_tools_runs.py")
    out = tmp_path / "output" / "smollm2_tools_s7"
    out.mkdir(parents=True)
    (out / "config.yaml").write_text("seed: 7\nlearning_rate: 1e-05\ntools: [calculator]\n"
                                     "actor_model_name_or_path: nowhere\n")
    rows = [{"step": 0, "eval/accuracy": 0.2, "eval/tool_use_rate": 0.25, "eval/accuracy_with_tools": 0.8,
             "eval/accuracy_without_tools": 0.0, "perf/eval_s": 120.0}]
    rows += [{"step": s, "train/reward": s / 10, "rollout/tool_use_rate": 0.5, "rollout/tool_error_rate": 0.0,
              "rollout/turns_per_sample": 1.5, "response_length/mean": 40.0, "perf/step_s": 30.0} for s in (1, 2)]
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    log = tmp_path / "cpu.log"
    log.write_text("1000 500 6.0\n1060 3500 8.0\n")
    run = tool.collect_run("s7", root=str(tmp_path), cpu_log=str(log))
    assert run["seed"] == 7 and run["learning_rate"] == 1e-5 and run["warm_start"] is None
    assert run["evals"] == [{"step": 0, "accuracy": 0.2, "tool_use_rate": 0.25, "accuracy_with_tools": 0.8,
                             "accuracy_without_tools": 0.0, "eval_s": 120.0}]
    assert [s["reward"] for s in run["steps"]] == [0.1, 0.2]
    assert run["cpu"] == {"wall_s": 60, "cpu_s": 30.0, "load_min": 6.0, "load_max": 8.0, "load_mean": 7.0}
    text = tool.tables({"runs": [run]})
    assert "| 0 | 0.200 | 0.250 | 0.800 | 0.000 | 2.0 |" in text
    assert "| 1-2 | 0.15 | 0.50 | 0.00 | 1.50 | 1280 | 30 |" in text
    # the summary row: a second evaluation at step 2 reaches 0.9 after both steps' 60 s
    run["evals"].append({**run["evals"][0], "step": 2, "accuracy": 0.95, "tool_use_rate": 1.0})
    assert tool.kind(run) == "GRPO" and tool.first_step_at(run, 0.9) == 2 and tool.training_minutes(run, 1) == 0.5
    row = tool.summary({"runs": [run]}).splitlines()[2]
    assert row == "| GRPO | 7 | 0: 0.200, 2: 0.950 | +75.0 | 1.000 | 0.000 | 1.50 | 1280 | 1.0 | 1.0 (step 2) |"
    assert tool.kind({**run, "learning_rate": 0.0}) == "learning_rate 0" and tool.kind({**run, "tools": ""}) == "tools off"


def test_docs_show_the_committed_results(repo_root):
    """docs/smollm2_tools.md's RL tables are what tools/eval/smollm2_tools_runs.py prints for the committed results
    file, and its untrained and warm-start numbers are those of the baseline file."""
    tool = _load_tool(repo_root, "_smollm2_tools_runs2", "tools/eval/smollm2_tools_runs.py")
    with open(repo_root / "docs" / "results" / "smollm2_tools_rl.json", encoding="utf-8") as f:
        results = json.load(f)
    doc = (repo_root / "docs" / "smollm2_tools.md").read_text(encoding="utf-8")
    assert tool.tables(results) in doc and tool.summary(results) in doc
    runs = {r["name"]: r for r in results["runs"]}
    gain = {name: r["evals"][-1]["accuracy"] - r["evals"][0]["accuracy"] for name, r in runs.items()}
    # the goal: +30 points over the start on every seed, the tools-off run well below, the control flat
    assert all(gain[f"s{seed}"] > 0.3 for seed in (42, 1, 2)) and all(runs[f"s{s}"]["evals"][0]["step"] == 0
                                                                        for s in (42, 1, 2))
    assert gain["s42_off"] < 0.05 and abs(gain["s42_lr0"]) < 0.1
    assert tool.kind(runs["s42_off"]) == "tools off" and tool.kind(runs["s42_lr0"]) == "learning_rate 0"
    with open(repo_root / "docs" / "results" / "smollm2_tools_baseline.json", encoding="utf-8") as f:
        baseline = json.load(f)
    assert baseline["plain"]["accuracy"] == baseline["tools"]["accuracy"] == 0.0 == baseline["tools"]["tool_use_rate"]
    assert "0.035 (7/200)" in doc and baseline["tools_examples"]["accuracy"] == 0.035
