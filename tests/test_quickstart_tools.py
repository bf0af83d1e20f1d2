"""The tool quickstart: policy builder (paddle_grpo/recipes/quickstart_tools.py), its data files, reward and config.

The learning run (build + RL, minutes) is too slow for the suite; docs/quickstart.md has its numbers. Here the
builder runs with a tiny SFT budget, and its transcripts are checked against what the tool environment (the real
calculator through `ToolEnvironment`) makes of them, token for token.
"""
import importlib.util
import json
import os

import pytest

from paddle_grpo.data import read_jsonl, tokenize_prompts
from paddle_grpo.environment import HermesFormat, ToolEnvironment, get_tool, load_tools
from paddle_grpo.recipes import quickstart_tools as qt
from paddle_grpo.rewards import get_reward_fn


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A policy built with a 10-step SFT budget (a few seconds)."""
    out = str(tmp_path_factory.mktemp("qst") / "policy")
    stats = qt.build_quickstart_tools_policy(out, seed=3, max_steps=10, target_loss=0.0, progress=False)
    return out, stats


@pytest.fixture(scope="module")
def tokenizer(built):
    from paddle_grpo.policy import load_tokenizer

    return load_tokenizer(built[0])


def test_builder_writes_a_directory_paddlenlp_loads(built, tokenizer):
    from paddlenlp.transformers import AutoModelForCausalLM

    out, stats = built
    assert stats["sft_steps"] == 10 and stats["tool_share"] == qt.SFT["tool_share"]
    assert not os.path.exists(out + ".building")
    with open(os.path.join(out, qt.BUILD_INFO), encoding="utf-8") as f:
        assert json.load(f) == stats
    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.config.vocab_size == len(tokenizer) and model.config.hidden_size == qt.MODEL["hidden_size"]
    assert tokenizer.convert_ids_to_tokens(tokenizer.eos_token_id) == "<|im_end|>"
    # 10 steps at learning rate ~1e-3 already move the copying loss down from about ln(vocab) ~ 6.2
    assert stats["loss_init"] > 5.0 and stats["loss_final"] < stats["loss_init"]


def test_markers_and_digits_are_single_tokens(tokenizer):
    """The call-end marker must be one token (it stops a turn); digits one token each (copying is per digit)."""
    for marker in qt.MARKERS + ("<|im_start|>", "<|im_end|>"):
        assert len(tokenize_prompts(tokenizer, [marker])[0]) == 1, marker
    assert tokenize_prompts(tokenizer, ["30954"])[0] == [tokenize_prompts(tokenizer, [d])[0][0] for d in "30954"]
    with ToolEnvironment(load_tools(["calculator"]), HermesFormat(), tokenizer) as env:
        assert env.stop_token_ids() == tokenize_prompts(tokenizer, ["</tool_call>"])[0]


def test_prompt_lists_the_calculator_as_the_hermes_format_renders_it():
    schema = get_tool("calculator").schema
    text = qt.prompt(737, 42)
    assert text == HermesFormat().prompt_with_tools("What is 737*42?", None, [schema])
    assert text.startswith("<|im_start|>system\n") and json.dumps(schema) in text
    assert text.endswith("<|im_start|>user\nWhat is 737*42?<|im_end|>\n<|im_start|>assistant\n")
    assert qt.record(737, 42) == {"src": text, "tgt": "30954"}


def test_sft_transcripts_are_what_the_tool_environment_makes(tokenizer):
    """The SFT rows: prompt ids as the trainer tokenizes `src`; the call as the policy would write it; the tool turn
    token for token what ToolEnvironment appends after running the real calculator on that call; the answer and
    EOS. Only the policy's tokens (call, answer, EOS) carry loss."""
    problems = [(737, 42), (100, 10), (999, 99)]
    pid, pm, cid, cm, am = qt.encode(tokenizer, problems, [True, True, False])
    assert (pm == 1).all() and (pid == pid[0]).all()  # the system turn, the same in every row
    with ToolEnvironment(load_tools(["calculator"]), HermesFormat(), tokenizer) as env:
        for i, (a, b) in enumerate(problems):
            row, policy = cid[i][cm[i] == 1].tolist(), am[i][cm[i] == 1].tolist()
            prompt_ids = tokenize_prompts(tokenizer, [qt.record(a, b)["src"]])[0]
            assert pid[i].tolist() + row[:len(prompt_ids) - pid.shape[1]] == prompt_ids
            rest = row[len(prompt_ids) - pid.shape[1]:]
            policy = policy[len(prompt_ids) - pid.shape[1]:]
            answer = tokenize_prompts(tokenizer, [str(a * b)])[0] + [tokenizer.eos_token_id]
            if i == 2:  # a direct answer
                assert rest == answer and policy == [1] * len(answer)
                continue
            call = tokenize_prompts(tokenizer, [qt.call_text(a, b)])[0]
            assert rest[:len(call)] == call and call[-1] == env.stop_token_ids()[0]
            pending = env.begin(call, ended_by_call_end=True)
            assert pending.assistant["tool_calls"] == [{"name": "calculator",
                                                        "arguments": {"expression": f"{a}*{b}"}}]
            turn = pending.result()
            assert turn.messages[0]["content"] == str(a * b) and turn.messages[0]["error"] is None
            assert rest == call + turn.ids + answer
            assert policy == [1] * len(call) + [0] * len(turn.ids) + [1] * len(answer)
        assert not cm[2][len(qt.encode(tokenizer, [(999, 99)], [False])[2][0]):].any()  # padding after EOS


def test_reward_scores_exact_products():
    fn = get_reward_fn("paddle_grpo.recipes.quickstart_tools:multiplication_reward")
    assert fn is qt.multiplication_reward and fn.max_score == 1.0
    turns = [[{"role": "assistant", "content": "", "tool_calls": [{"name": "calculator",
                                                                   "arguments": {"expression": "737*42"}}]},
              {"role": "tool", "name": "calculator", "content": "30954", "error": None, "latency_s": 0.0},
              {"role": "assistant", "content": "30954", "tool_calls": []}]] * 4
    assert fn(["p"] * 4, ["30954", " 30954\n", "30955", "309540"], tgt=["30954"] * 4, turns=turns) == \
        [1.0, 1.0, 0.0, 0.0]


def test_held_out_problems_never_train():
    held, val = qt.eval_problems(), qt.validation_problems()
    assert held == qt.eval_problems() and len(set(held)) == len(held) == qt.EVAL_SIZE
    assert len(set(val)) == len(val) > 0 and not set(val) & set(held)
    assert not (set(held) | set(val)) & set(qt.train_problems(20000, seed=1))
    assert all(qt.A_RANGE[0] <= a <= qt.A_RANGE[1] and qt.B_RANGE[0] <= b <= qt.B_RANGE[1] for a, b in held + val)


def test_shipped_data_files_are_the_generators_output(repo_root, tmp_path):
    spec = importlib.util.spec_from_file_location("_gen_quickstart_tools_data",
                                                  repo_root / "tools" / "data" / "gen_quickstart_tools_data.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    tool.main(["--out-dir", str(tmp_path)])
    for name in ("quickstart_tools_train.jsonl", "quickstart_tools_eval.jsonl"):
        assert (tmp_path / name).read_bytes() == (repo_root / "data" / name).read_bytes()
    train = read_jsonl(str(repo_root / "data" / "quickstart_tools_train.jsonl"))
    held = read_jsonl(str(repo_root / "data" / "quickstart_tools_eval.jsonl"))
    assert [(r["a"], r["b"]) for r in held] == qt.eval_problems()
    assert len({(r["a"], r["b"]) for r in train}) == len(train)
    assert not {r["src"] for r in train} & {r["src"] for r in held}
    assert all(r["tgt"] == str(r["a"] * r["b"]) and r["src"] == qt.prompt(r["a"], r["b"]) for r in train + held)


def test_sft_starts_without_the_system_turn(tokenizer):
    """listed=False: the same rows without the system turn (its first steps), the prompt the plain user turn."""
    from paddle_grpo.data import format_qwen_chat

    pid, pm, cid, cm, am = qt.encode(tokenizer, [(737, 42)], [True], listed=False)
    row = pid[0].tolist() + cid[0][cm[0] == 1].tolist()
    text = format_qwen_chat("What is 737*42?", system=None) + "".join(t for t, _ in qt.transcript(737, 42, True))
    assert row == tokenize_prompts(tokenizer, [text])[0] + [tokenizer.eos_token_id]
    listed = qt.encode(tokenizer, [(737, 42)], [True])
    assert am[0][cm[0] == 1].sum() == listed[4][0][listed[3][0] == 1].sum()  # the same policy tokens


def test_config_loads_and_fits_the_trajectory(repo_root, tokenizer):
    from paddle_grpo.config import load_config
    from paddle_grpo.recipes import policy_builder

    cfg = load_config(str(repo_root / "configs" / "quickstart_tools.yaml"))
    assert cfg.build_actor_if_missing == "quickstart_tools" and not cfg.use_rm_server
    assert cfg.tools == ["calculator"] and cfg.max_turns == 2
    assert get_reward_fn(cfg.reward_funcs) is qt.multiplication_reward
    assert policy_builder(cfg) is not None
    for path in (cfg.train_datasets, cfg.eval_datasets):
        assert os.path.isfile(repo_root / path)
    # the prompt fits max_prompt_len; call + tool turn + answer + EOS fits max_dec_len (tool tokens count in it)
    a, b = 999, 99
    assert len(tokenize_prompts(tokenizer, [qt.prompt(a, b)])[0]) <= cfg.max_prompt_len
    trajectory = sum(len(tokenize_prompts(tokenizer, [t])[0]) for t, _ in qt.transcript(a, b, True)) + 1
    assert trajectory <= cfg.max_dec_len


def test_policy_builder_runs_the_tools_recipe(monkeypatch):
    from types import SimpleNamespace

    from paddle_grpo.recipes import policy_builder

    calls = []
    monkeypatch.setattr(qt, "build_quickstart_tools_policy", lambda d, **kw: calls.append((d, kw)))
    cfg = SimpleNamespace(build_actor_if_missing="quickstart_tools", seed=7, disable_tqdm=True)
    policy_builder(cfg)("some/dir")
    assert calls == [("some/dir", {"seed": 7, "progress": False})]
