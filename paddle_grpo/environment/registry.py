"""Tools by name, resolved like reward functions: built-ins register themselves; users point at `module:function`
or `path/to/file.py:function` (paddle_grpo/user_code.py: the same rules and messages as rewards/registry.py).

    @register_tool("calculator")
    def calculator(expression: str) -> str: ...

    get_tool("calculator")              # a registered name
    get_tool("my_pkg.tools:search")     # an importable module (a registered function keeps its registered name)
    get_tool("tools/mine.py:lookup")    # a file; the tool is named after the function
    load_tools("calculator,python")     # a ToolSet; with server=URL a RemoteToolSet of the tools served there
"""
from typing import Callable, Dict, List, Optional, Sequence, Union

from ..user_code import load_function
from .tool import Tool, ToolSet

_REGISTRY: Dict[str, Tool] = {}


def register_tool(name: Optional[str] = None) -> Callable[[Callable], Callable]:
    """Decorator registering a plain function `fn(**arguments) -> str | int | float | dict | list` as the tool
    `name` (default: the function's name). The function is returned unchanged (still callable directly); its Tool
    (schema from signature and docstring) is built now, so a signature a JSON call cannot fill fails at import."""

    def decorator(fn: Callable) -> Callable:
        tool = Tool.from_function(fn, name)
        if tool.name in _REGISTRY and _REGISTRY[tool.name].fn is not fn:
            raise ValueError(f"a tool named {tool.name!r} is already registered ({_REGISTRY[tool.name].fn!r})")
        _REGISTRY[tool.name] = tool
        fn.__tool__ = tool  # so `module:function` of a registered function finds its registered name
        return fn

    return decorator


def unregister_tool(name: str) -> None:
    """Remove a registered tool (a test's or a notebook's own); an unknown name raises KeyError naming it."""
    if name not in _REGISTRY:
        raise KeyError(f"no tool named {name!r} is registered")
    del _REGISTRY[name]


def available_tools() -> List[str]:
    """Sorted names of the registered tools."""
    return sorted(_REGISTRY)


def get_tool(spec: Union[str, Callable, Tool]) -> Tool:
    """Resolve a registered name, `module:function` or `path/to/file.py:function` (or a function, or a Tool) to a
    Tool. Errors say what was asked for and what went wrong (an unknown name lists the registered ones)."""
    if isinstance(spec, Tool):
        return spec
    if callable(spec):
        return getattr(spec, "__tool__", None) or Tool.from_function(spec)
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"a tool is given by name or 'module:function', got {spec!r}")
    spec = spec.strip()
    if ":" not in spec:
        if spec in _REGISTRY:
            return _REGISTRY[spec]
        raise KeyError(f"unknown tool {spec!r}; registered tools: {', '.join(available_tools())}; "
                       "or give 'module:function' / 'path/to/file.py:function'")
    fn = load_function(spec, "tool")
    return getattr(fn, "__tool__", None) or Tool.from_function(fn)


def split_specs(specs: Union[str, Sequence[str], None]) -> List[str]:
    """A list or a comma-separated string of tool specs, blanks dropped."""
    items = specs.split(",") if isinstance(specs, str) else list(specs or [])
    return [s.strip() if isinstance(s, str) else s for s in items if not isinstance(s, str) or s.strip()]


def load_tools(specs: Union[str, Sequence[str], None], server: str = "", token: str = "",
               timeout_s: float = 10, retries: int = 5, max_wait_s: Optional[float] = None,
               max_unanswered: int = 3) -> ToolSet:
    """The tools of a run. Without `server`: a ToolSet of `get_tool(spec)` for each spec. With `server` (a tool
    server's URL): a RemoteToolSet whose schemas come from GET {server}/tools, restricted to the names in `specs`
    (all served tools when `specs` is empty); names the server does not serve raise ValueError naming them.
    `retries` / `max_wait_s`: its retry budget; `max_unanswered`: calls in a row without a reply that stop it
    (RemoteToolSet)."""
    names = split_specs(specs)
    if server:
        from .client import RemoteToolSet

        return RemoteToolSet(server, token=token, timeout_s=timeout_s, names=names or None, retries=retries,
                             max_wait_s=max_wait_s, max_unanswered=max_unanswered)
    return ToolSet([get_tool(spec) for spec in names])
