"""The tools of a multi-turn run: each loads, or the tool server serves every named one; the python tool's
isolation where it is demanded."""
from __future__ import annotations

import difflib
from typing import Any, Callable, List, Optional

from ..config import Config


def check_tools(cfg: Config, tokenizer: Any = None, get: Optional[Callable] = None) -> List[str]:
    """Problems with the tools of a multi-turn run (`tools` set; none otherwise): in-process, each tool loads
    (`environment.load_tools`: registered names, `module:function`, `file.py:function`); with `tool_server`, its
    GET /tools answers (short timeout, the token sent) and serves every named tool. Never calls a tool. With the
    tokenizer, `tool_format` resolves for it (`environment.get_format`)."""
    if not cfg.tools:
        return []
    problems = []
    server = cfg.tool_server.strip().rstrip("/")
    if server:
        import requests

        get = get or requests.get
        headers = {"Authorization": f"Bearer {cfg.tool_server_token}"} if cfg.tool_server_token else {}
        try:
            reply = get(server + "/tools", timeout=5, headers=headers)
        except requests.RequestException as e:
            return [f"tool_server: {server}/tools cannot be reached: {type(e).__name__}: {e}"]
        try:
            body = reply.json()
        except ValueError:
            body = {}
        if reply.status_code != 200:
            why = body.get("error_msg", "") if isinstance(body, dict) else ""
            return [f"tool_server: {server}/tools answered HTTP {reply.status_code}{': ' + why if why else ''}"
                    + (" (check tool_server_token)" if reply.status_code == 401 else "")]
        try:
            served = [t["function"]["name"] for t in body["tools"]]
        except (KeyError, TypeError):
            return [f"tool_server: {server}/tools answered without a list of tool schemas (not a tool server?)"]
        missing = [name for name in cfg.tools if name not in served]
        if missing:
            problems.append(f"tools: {', '.join(missing)}: not served by tool_server {server} (it serves "
                            f"{', '.join(served) or 'no tools'}; start it with --tool {','.join(cfg.tools)})")
        else:
            print(f"  tool_server: {server}/tools: ok (serves {', '.join(served)})")
    else:
        from ..environment import load_tools

        problems += tool_problems(cfg) + sandbox_problems(cfg)
        if not problems:
            toolset = load_tools(cfg.tools)
            print(f"  tools: {', '.join(toolset.names)} ({len(toolset.schemas())} schemas)")
    if tokenizer is not None:
        from ..environment import get_format

        try:
            get_format(cfg.tool_format, tokenizer)
        except Exception as e:  # noqa: BLE001
            problems.append(f"tool_format: {cfg.tool_format!r}: {e}")
    return problems


def sandbox_problems(cfg: Config) -> List[str]:
    """The python tool's isolation `tool_sandbox` where it is demanded ("namespaces") and cannot be had here (a
    snippet is run to find out): one line saying why and how to get it."""
    from ..environment import sandbox

    try:
        sandbox.set_isolation(cfg.tool_sandbox)
    except sandbox.SandboxUnavailable as e:
        return [f"tool_sandbox: {cfg.tool_sandbox!r}: {e}"]
    return []


def tool_problems(cfg: Config) -> List[str]:
    """One line per tool of `cfg.tools` that does not load in this process (none with tool_server: the server's
    GET /tools answers for its tools), with the closest registered name for a misspelt one. Loads each tool
    (environment.get_tool: a registered name, or imports `module:function`), never calls one."""
    if not cfg.tools or cfg.tool_server.strip():
        return []
    from ..environment import available_tools, get_tool

    problems = []
    for spec in cfg.tools:
        try:
            get_tool(spec)
        except Exception as e:  # noqa: BLE001  a user's module may raise anything on import
            message = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
            close = difflib.get_close_matches(str(spec), available_tools(), n=1, cutoff=0.6) \
                if ":" not in str(spec) else []
            problems.append(f"tools: {message}" + (f" (did you mean '{close[0]}'?)" if close else ""))
    return problems
