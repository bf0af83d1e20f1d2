"""docs/tools.md says what the code does: the conversation it shows is the text the format produces, the example
tool gives the schema shown, the error examples are the messages the code writes, and the limits it states are the
module constants. (Its server commands and curl replies run in tests/reward_server/test_docs.py.)"""
import json
import re

from paddle_grpo.environment import HermesFormat, ToolResult, get_tool, load_tools
from paddle_grpo.environment import builtins, sandbox

FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


def blocks(repo_root, lang):
    text = (repo_root / "docs" / "tools.md").read_text(encoding="utf-8")
    return [body for kind, body in FENCE.findall(text) if kind == lang], text


def test_the_conversation_shown_is_the_formats_text(repo_root):
    shown = blocks(repo_root, "text")[0][0]
    fmt = HermesFormat()
    call = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "123*45"}}\n</tool_call>'
    expected = (fmt.prompt_with_tools("What is 123*45?", None, [get_tool("calculator").schema],
                                      system="You are a helpful assistant.")
                + call + fmt.tool_turn_text([ToolResult("calculator", "5535")], ended_by_call_end=True)
                + "The answer is 5535.<|im_end|>\n")
    assert shown == expected


def test_the_example_tool_gives_the_schema_shown(repo_root, tmp_path):
    (code,), _ = blocks(repo_root, "python")
    (schema,), _ = blocks(repo_root, "json")
    path = tmp_path / "my_tools.py"
    path.write_text(code)
    tool = load_tools([f"{path}:unit_price"]).tools["unit_price"]
    assert json.dumps(tool.schema) == schema.strip()
    assert tool.call({"total": 10, "count": 4}).content == "2.50 EUR"


def test_the_error_examples_are_the_codes_messages(repo_root):
    _, text = blocks(repo_root, "text")
    fmt, tools = HermesFormat(), load_tools("calculator,python")
    malformed = fmt.parse('<tool_call>{"name": "calculator" "arguments": {"expression": "1"}}</tool_call>')[1][0]
    unknown = tools.call(fmt.parse('<tool_call>{"name": "calc", "arguments": {}}</tool_call>')[1][0])
    missing = tools.call(fmt.parse('<tool_call>{"name": "calculator", "arguments": {}}</tool_call>')[1][0])
    for message in ("error: " + malformed.message, unknown.content, missing.content):
        assert f"`{message}`" in text, message


def test_the_limits_stated_are_the_constants(repo_root):
    _, text = blocks(repo_root, "text")
    assert (sandbox.CPU_SECONDS, sandbox.WALL_SECONDS, sandbox.MEMORY_MB, sandbox.FILE_MB,
            sandbox.MAX_OUTPUT_CHARS) == (5, 8, 1024, 4, 2000)
    for row in ("| CPU time, per call (all its processes; each also `RLIMIT_CPU`) | 5 s |",
                "| wall time (then every process it started is killed) | 8 s |",
                "each also `RLIMIT_AS`, its address space) | 1024 MB |", "`RLIMIT_FSIZE`) | 4 MB |",
                "| 2,000 characters of"):
        assert row in text, row
    # Per call: processes and descriptors; the namespaces' /tmp; the uids of the calls.
    assert (sandbox.MAX_PROCESSES, sandbox.MAX_FILES, sandbox.TMP_MB) == (64, 64, 64)
    assert (sandbox.UID_RANGE.start, sandbox.UID_RANGE.stop) == (64000, 64064)
    assert "`RLIMIT_NPROC` of the call's own user) | 64 |" in text and "a private 64 MB `/tmp`" in text
    assert "`RLIMIT_NOFILE`; sockets' kernel buffers are memory outside the resident sum) | 64 |" in text
    assert "`sandbox.MAX_PROCESSES` (64) per call" in text and "64000-64063" in text
    assert (builtins.MAX_EXPRESSION_CHARS, builtins.MAX_RESULT_BITS, builtins.MAX_EXPONENT) == (1000, 4096, 10000)
    assert "at most 1,000 characters, integer results up to 2**4096 (1,234 digits), exponents up to 10,000" in text
    assert len(str(2 ** 4096)) == 1234


def test_the_docs_say_what_a_turn_holds_and_what_a_dead_tool_server_does(repo_root, tool_tokenizer):
    """A turn stops at the first `</tool_call>` when it is one token (the rollout test
    tests/rollout/test_multi_turn.py::test_a_turn_stops_at_the_first_call_end_token checks the behaviour); the page
    says so, and no longer that a turn may hold several calls. A dead tool server waits reward_server_max_wait_s
    and stops the run (tests/test_tool_server_faults.py)."""
    from paddle_grpo.environment import ToolEnvironment, ToolSet

    _, text = blocks(repo_root, "text")
    flat = " ".join(text.split())
    assert "a turn may hold several calls" not in flat
    assert "So with Qwen2.5's vocabulary **a turn holds one call**: the rollout stops at the first `</tool_call>`" \
        in flat
    env = ToolEnvironment(ToolSet([get_tool("calculator")]), HermesFormat(), tool_tokenizer)
    assert env.stop_token_ids() == [tool_tokenizer.get_vocab()["</tool_call>"]]
    assert "for up to `reward_server_max_wait_s`" in flat and "the rollout raises `ToolServerError`" in flat
    assert "**a tool's output is plain text**" in flat


def test_the_character_bound_of_the_cut_is_the_constant(repo_root):
    from paddle_grpo.environment.executor import CUT_CHARS_PER_TOKEN

    _, text = blocks(repo_root, "text")
    assert CUT_CHARS_PER_TOKEN == 32 and "`max_tool_response_len * 32` characters are tokenized" in text
