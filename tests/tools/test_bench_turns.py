"""tools/bench/bench.py --turns: multi-turn steps whose completions are scripted through calculator calls; the JSON
line's turn keys against what the script and the environment's tool turn must give, and the bench's own checks."""
import json
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
BENCH = REPO / "tools" / "bench" / "bench.py"
TINY = REPO / "tools" / "bench" / "shapes" / "tiny.json"


def run_bench(*args):
    return subprocess.run([sys.executable, str(BENCH), "--shape", str(TINY), "--threads", "1",
                           *args], capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def bench(load_tool):
    return load_tool("bench/bench")


@pytest.fixture(scope="module")
def char_tokenizer(tmp_path_factory):
    from paddle_grpo.recipes.tiny import build_char_tokenizer

    return build_char_tokenizer(str(tmp_path_factory.mktemp("char128")), 128)


def test_two_turn_steps(bench, char_tokenizer):
    """6 rows (tiny.json: 2 prompts x 3), 2 turns: every row calls the calculator once (5535, no error) and then
    answers; actions = the call and the answer, each with its EOS (one token per character); tool tokens = the
    environment's tool turn; the rollout's parts add up to it."""
    segments, tool_end, need = bench.turn_script(char_tokenizer, 2)
    out = run_bench("--turns", "2", "--set", "vocab_size=128", "--set", f"completion_len={need}",
                    "--set", "warmup_steps=0", "--set", "timed_steps=1")
    assert out.returncode == 0, out.stderr[-2000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    rows = 6
    actions = len(bench.CALL) + 1 + len(bench.ANSWER) + 1
    assert [len(s) for s in segments] == [len(bench.CALL) + 1, len(bench.ANSWER) + 1]
    assert r["turns"] == 2 and r["turns_per_sample"] == 2 and r["truncated_samples"] == 0
    assert r["tool_calls_per_step"] == rows and r["tool_errors"] == 0
    assert r["completion_tokens_per_step"] == rows * actions and r["completion_len_min"] == actions
    assert r["tool_tokens_per_step"] == rows * (need - actions)
    assert r["decode_steps_median"] >= need - 1  # one step per token after the prefill's (more when rows lag)
    assert 0 < r["tool_latency_s_median"] < 5
    assert 0 < r["rollout_decode_s_median"] <= r["rollout_s_median"]
    assert r["rollout_tool_wait_s_median"] >= 0 and r["rollout_sampling_s_median"] >= 0
    for key in ("step_s_median", "update_s_median", "reference_s_median", "peak_rss_mb"):  # the usual keys
        assert r[key] > 0, key


def test_turn_script_follows_the_environment(bench, char_tokenizer):
    """The script's tool turn is what ToolEnvironment feeds after a call ending at EOS (no single-token call end in
    a character vocabulary), and the tool turn ends with `tool_end`."""
    from paddle_grpo.environment import HermesFormat, ToolEnvironment, ToolSet, get_tool

    segments, tool_end, need = bench.turn_script(char_tokenizer, 3)
    with ToolEnvironment(ToolSet([get_tool("calculator")]), HermesFormat(), char_tokenizer) as env:
        assert env.stop_token_ids() == []
        turn = env.begin(segments[0], ended_by_call_end=False).result()
    assert turn.messages[0]["content"] == "5535" and turn.ids[-len(tool_end):] == tool_end
    assert need == 2 * (len(segments[0]) + len(turn.ids)) + len(segments[-1]) and segments[0] == segments[1]


def test_bad_turns_settings_are_refused(bench, char_tokenizer, tmp_path):
    from paddle_grpo.recipes.tiny import build_char_tokenizer

    shape = json.loads(TINY.read_text())
    with pytest.raises(SystemExit, match="completion_len must hold .* --set completion_len="):
        bench.check_turn_budget({**shape, "turns": 2}, char_tokenizer)  # tiny.json's completion_len 5
    bench.check_turn_budget({**shape, "turns": 2, "completion_len": 400}, char_tokenizer)
    with pytest.raises(SystemExit, match="vocab_size >= 128"):  # tiny.json's 64 tokens have no '{'
        bench.turn_script(build_char_tokenizer(str(tmp_path), 64), 2)
    with pytest.raises(SystemExit, match="turns must be an integer >= 1"):
        bench.main(["--shape", str(TINY), "--turns", "0"])
    bad = tmp_path / "shape.json"
    bad.write_text(json.dumps({**shape, "turns": "2"}))
    with pytest.raises(SystemExit, match="turns must be an integer >= 1"):
        bench.load_shape(str(bad))


def test_the_python_tools_script(bench, char_tokenizer):
    """--tool python: the scripted call is a well-formed call of the python tool, and the budget counts its real
    output ("5535\\n": the tool is run once)."""
    from paddle_grpo.environment import HermesFormat

    segments, _, need = bench.turn_script(char_tokenizer, 2, "python")
    _, calls = HermesFormat().parse(char_tokenizer.decode(segments[0][:-1]))
    assert [(c.name, c.arguments, c.error) for c in calls] == [("python", {"code": "print(123*45)"}, None)]
    assert need == bench.turn_script(char_tokenizer, 2)[2] - len(bench.CALL) + len(bench.call_text("python")) + 1
