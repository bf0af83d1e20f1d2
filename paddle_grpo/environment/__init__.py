"""Tools for multi-turn rollouts: functions the policy calls by writing a tool call, their JSON schemas, the
tool-call format of the chat template, and the runner that executes the calls of all rows concurrently.

    tools = load_tools("calculator,python")              # registered names, module:function, file.py:function
    fmt = get_format("auto", tokenizer)                   # the Hermes format of Qwen2.5's template
    prompt = fmt.prompt_with_tools(src, tokenizer, tools.schemas())
    with ToolEnvironment(tools, fmt, tokenizer, timeout_s=10) as env:
        pending = env.begin(turn_ids, ended_by_call_end=True)   # starts the calls, returns at once
        turn = pending.result()                                  # ToolTurn: messages, ids (context tokens)

Built-ins: `calculator` (builtins.py) and `python` (sandbox.py: limits, and every process a snippet starts dies with
its call; isolated only as root on Linux: docs/tools.md, "What a snippet can reach").
docs/tools.md explains the format, writing a tool and serving tools over HTTP (`RemoteToolSet`).
This package sits below the rollout: it imports only data.py, user_code.py and http_util.py of the package.
"""
from .tool import TOOL_ERRORS, Tool, ToolArgumentError, ToolCall, ToolError, ToolResult, ToolSet, precheck
from .registry import available_tools, get_tool, load_tools, register_tool, unregister_tool
from . import builtins, sandbox  # noqa: F401  (register calculator and python)
from .format import HermesFormat, ToolCallFormat, get_format
from .executor import PendingTurn, ToolEnvironment, ToolTurn
from .client import RemoteToolSet, ToolServerError

__all__ = [
    "TOOL_ERRORS", "Tool", "ToolArgumentError", "ToolCall", "ToolError", "ToolResult", "ToolSet", "available_tools",
    "get_tool", "load_tools", "register_tool", "unregister_tool", "HermesFormat", "ToolCallFormat", "get_format",
    "PendingTurn", "ToolEnvironment", "ToolTurn", "RemoteToolSet", "ToolServerError", "precheck",
]
