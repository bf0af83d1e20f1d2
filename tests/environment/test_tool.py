"""Tool.call's argument checks and results, ToolSet, the registry and load_tools."""
import json

import pytest

from paddle_grpo.environment import (TOOL_ERRORS, Tool, ToolCall, ToolSet, available_tools, get_tool, load_tools,
                                     register_tool, unregister_tool)


def add(a: int, b: float = 0.5, tags: list = ()) -> dict:
    """Add two numbers."""
    return {"sum": a + b, "tags": list(tags)}


def boom(x: str) -> str:
    raise KeyError(x)


@pytest.mark.parametrize("arguments, message", [
    (["a"], "the arguments of add must be a JSON object, got a JSON array"),
    ({"a": 1, "c": 2}, "unknown argument 'c' for add; it takes: a (integer), b (number), tags (array)"),
    ({"b": 1.0}, "missing argument 'a' for add; it takes: a (integer), b (number), tags (array)"),
    ({"a": "1"}, "argument 'a' of add must be a JSON integer, got a JSON string (\"1\")"),
    ({"a": True}, "argument 'a' of add must be a JSON integer, got a JSON boolean (true)"),
    ({"a": 1.5}, "argument 'a' of add must be a JSON integer, got a JSON number (1.5)"),
    ({"a": 1, "b": None}, "argument 'b' of add must be a JSON number, got a JSON null (null)"),
    ({"a": 1, "tags": "x"}, "argument 'tags' of add must be a JSON array, got a JSON string (\"x\")"),
])
def test_bad_arguments_name_the_argument(arguments, message):
    result = Tool.from_function(add).call(arguments)
    assert (result.error, result.content) == ("bad_arguments", "error: " + message)


def test_results_are_json_encoded_and_exceptions_reported():
    tool = Tool.from_function(add)
    result = tool.call({"a": 2, "b": 3})  # an int is a JSON number too
    assert (result.error, json.loads(result.content)) == (None, {"sum": 5, "tags": []})
    assert result.latency_s >= 0
    failed = Tool.from_function(boom).call({"x": "k"})
    assert (failed.error, failed.content) == ("exception", "error: boom raised KeyError: 'k'")


def test_toolset_answers_malformed_and_unknown_calls():
    tools = ToolSet([Tool.from_function(add), get_tool("calculator")])
    assert tools.names == ["add", "calculator"]
    assert [s["function"]["name"] for s in tools.schemas()] == ["add", "calculator"]
    unknown = tools.call(ToolCall("calc", {"expression": "1"}))
    assert (unknown.error, unknown.content) == ("unknown_tool", "error: unknown tool 'calc'; tools: add, calculator")
    bad = tools.call(ToolCall("", None, "<tool_call>x</tool_call>", "malformed", "not JSON"))
    assert (bad.error, bad.content) == ("malformed", "error: not JSON")
    assert tools.call(ToolCall("calculator", {"expression": "2+3"})).content == "5"
    with pytest.raises(ValueError, match="two tools are named 'add'"):
        ToolSet([Tool.from_function(add), Tool.from_function(add)])
    assert set(TOOL_ERRORS) == {"malformed", "unknown_tool", "bad_arguments", "exception", "timeout"}


def test_registry_specs_and_errors(tmp_path):
    assert "calculator" in available_tools()
    assert get_tool("paddle_grpo.environment.builtins:calculator") is get_tool("calculator")
    path = tmp_path / "my_tools.py"
    path.write_text("def shout(text: str) -> str:\n    '''Upper-case a text.'''\n    return text.upper()\n")
    tool = get_tool(f"{path}:shout")
    assert tool.name == "shout" and tool.call({"text": "hi"}).content == "HI"
    assert tool.schema["function"]["description"] == "Upper-case a text."
    with pytest.raises(KeyError, match="unknown tool 'calc'; registered tools: .*calculator"):
        get_tool("calc")
    with pytest.raises(ImportError, match="tool spec 'no_such_module_xyz:f': could not import module"):
        get_tool("no_such_module_xyz:f")
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        get_tool(f"{path}:nope")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        get_tool(f"{tmp_path}/missing.py:f")
    tools = load_tools(f"calculator, {path}:shout")
    assert tools.names == ["calculator", "shout"]
    assert load_tools([]).names == [] and load_tools("").names == []


def test_register_tool():
    @register_tool("test_echo")
    def echo(text: str) -> str:
        """Echo."""
        return text

    assert echo("a") == "a"  # the function stays a function
    assert get_tool("test_echo").call({"text": "b"}).content == "b"
    with pytest.raises(ValueError, match="already registered"):
        register_tool("test_echo")(lambda text: text)
    unregister_tool("test_echo")
    with pytest.raises(KeyError, match="no tool named 'test_echo'"):
        unregister_tool("test_echo")
    with pytest.raises(ValueError, match="tool name must be"):
        Tool("a:b", echo)
