"""ToolArguments: tools and multi-turn rollouts (docs/tools.md)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List

from .fields import arg


@dataclass
class ToolArguments:
    """Multi-turn rollouts with tools (docs/tools.md). With `tools` empty (the default) a rollout is one completion
    per prompt and the other keys of this group have no effect (each one set says so in one line)."""
    tools: List[str] = arg(None, "(new) Tools the policy may call: registered names (calculator, python), "
                                 "`module:function` or `path/file.py:function`, as a list or a comma-separated "
                                 "string. Set: rollouts are multi-turn (decoding stops at the end of a tool call, "
                                 "the calls run, their results are appended as a tool turn, decoding goes on); "
                                 "tool-output tokens are context, not actions (no gradient, KL, entropy, value "
                                 "loss or length). Empty: single-turn rollouts.", default_factory=list)
    max_turns: int = arg(4, "(new) Most assistant turns per sample (each but the last may end in tool calls; so at "
                            "least 2 with tools); "
                            "max_dec_len bounds all of a sample's completion tokens, actions and tool output.")
    tool_timeout_s: float = arg(10.0, "(new) Time limit in seconds per tool call; a call over it becomes a tool "
                                      "message saying so (error 'timeout'), the rollout goes on.")
    tool_max_workers: int = arg(8, "(new) Tool calls running at once (one pool for all sequences of a rollout).")
    tool_format: str = arg("auto", "(new) The tool-call format: auto (the tokenizer's chat template renders the "
                                   "tools when it can, Hermes / Qwen2.5 `<tool_call>` JSON otherwise) or a format's "
                                   "name (docs/tools.md, \"The format\").")
    max_tool_response_len: int = arg(256, "(new) A tool's output is cut to this many tokens (with a marker saying "
                                          "so) before it is appended to the conversation.")
    tool_server: str = arg("", "(new) URL of a server that runs the tools (`python -m reward_server --tool ...`): "
                               "the calls go there over HTTP (transport failures are retried for up to "
                               "reward_server_max_wait_s, then the run saves and stops; 4xx answers raise). Empty: "
                               "the tools run in the trainer's process.")
    tool_server_token: str = arg("", "(new) Bearer token sent to tool_server (empty: none). Left out of the file "
                                     "and the command line: `$TOOL_SERVER_TOKEN` when it is set and not empty; an "
                                     "explicit empty value means no token even then. Prefer the variable or a "
                                     "config file only you can read (mode 600) to the command line, which `ps` "
                                     "shows. Printed and written out as '***'.")
    tool_server_max_unanswered: int = arg(3, "(new) After this many tool calls in a row that tool_server does not "
                                             "answer within tool_timeout_s (any answer resets the count), the run "
                                             "saves and stops: the server has stalled, and its silence is not a "
                                             "'timeout' for the policy to learn from (a tool that runs long is "
                                             "answered by the server with error 'timeout' when its --timeout-s is "
                                             "below tool_timeout_s). 0: never stop; every such call is a 'timeout'.")
    tool_sandbox: str = arg("auto", "(new) Isolation of the python tool in the trainer's process (a tool server has "
                                    "its own --sandbox): auto (namespaces where they can be made: root with "
                                    "CAP_SYS_ADMIN on Linux; else none, a warning says so), namespaces (demanded: "
                                    "the run refuses to start without them), process (never). As root a snippet "
                                    "runs as a user of its own in every mode (docs/tools.md, \"What a snippet can "
                                    "reach\").", choices=("auto", "namespaces", "process"))
