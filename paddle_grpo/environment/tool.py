"""Tools: a plain Python function with a JSON schema (`Tool`), a set of them (`ToolSet`), the calls the policy writes
(`ToolCall`) and what comes back (`ToolResult`).

Nothing here raises on what the policy writes: a malformed call, an unknown tool, bad arguments, an exception in
the tool all become a ToolResult whose `content` says what went wrong (the text the policy sees next) and whose
`error` is one of TOOL_ERRORS.
"""
import json
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence

from .schema import function_schema

TOOL_ERRORS = ("malformed", "unknown_tool", "bad_arguments", "exception", "timeout")

_JSON_TYPES = {"string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,), "array": (list,),
               "object": (dict,)}


class ToolError(Exception):
    """Raised by a tool to fail a call with `message` (what the policy reads after "error: ") and `kind`, one of
    TOOL_ERRORS (default "exception"); e.g. the python tool at its time limit: kind "timeout"."""

    def __init__(self, message: str, kind: str = "exception") -> None:
        if kind not in TOOL_ERRORS:
            raise ValueError(f"ToolError kind must be one of {', '.join(TOOL_ERRORS)}, got {kind!r}")
        super().__init__(message)
        self.kind = kind


class ToolArgumentError(ToolError, ValueError):
    """Raised by a tool to say its arguments are wrong: a "bad_arguments" result with this message (e.g. the
    calculator refusing `x + 1` or `1/0`)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, "bad_arguments")


@dataclass
class ToolCall:
    """One call the policy wrote. `error` is "malformed" when its text could not be read as a call (then `message`
    says why, in words the policy can learn from, and `arguments` is None); `raw` is the call's text."""
    name: str
    arguments: Optional[Dict[str, Any]]
    raw: str = ""
    error: Optional[str] = None
    message: str = ""


@dataclass
class ToolResult:
    """What a call returned: `content` is the text the policy sees (on error, a message starting with "error: "),
    `error` None or one of TOOL_ERRORS, `latency_s` the call's wall time."""
    name: str
    content: str
    error: Optional[str] = None
    latency_s: float = 0.0

    def to_json(self) -> Dict[str, Any]:
        return {"name": self.name, "content": self.content, "error": self.error, "latency_s": self.latency_s}


def error_result(name: str, error: str, message: str, latency_s: float = 0.0) -> ToolResult:
    """A failed call's result: the policy reads `error: <message>`."""
    assert error in TOOL_ERRORS, error
    return ToolResult(name, f"error: {message}", error, latency_s)


def json_type_name(value: Any) -> str:
    """JSON's name for a decoded value's type (what the policy wrote, not Python's name for it)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    return {str: "string", list: "array", dict: "object"}.get(type(value), type(value).__name__)


def check_value(value: Any, prop: Dict[str, Any], where: str) -> Optional[str]:
    """Why `value` does not fit the schema fragment `prop` (type, enum, array items), or None when it does."""
    kind = prop.get("type")
    if kind in _JSON_TYPES:
        ok = isinstance(value, _JSON_TYPES[kind]) and not (isinstance(value, bool) and kind != "boolean")
        if not ok:
            return f"{where} must be a JSON {kind}, got a JSON {json_type_name(value)} ({json.dumps(value)[:40]})"
    if "enum" in prop and value not in prop["enum"]:
        return f"{where} must be one of {json.dumps(prop['enum'])}, got {json.dumps(value)[:40]}"
    if kind == "array" and "items" in prop:
        for i, item in enumerate(value):
            problem = check_value(item, prop["items"], f"{where}[{i}]")
            if problem:
                return problem
    return None


def to_content(value: Any) -> str:
    """A tool's return value as the text the policy sees: a str as it is, anything else JSON-encoded."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, default=str)


@dataclass
class Tool:
    """A function the policy may call by `name` with a JSON object of arguments, described by `schema`."""
    name: str
    fn: Callable[..., Any]
    schema: Dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name or any(c in self.name for c in ":, \n\"'"):
            raise ValueError(f"a tool name must be a non-empty string without ':', ',', quotes or spaces, "
                             f"got {self.name!r}")
        if not callable(self.fn):
            raise TypeError(f"tool {self.name!r}: fn must be callable, got {type(self.fn).__name__}")
        if not self.schema:
            self.schema = function_schema(self.fn, self.name)

    @classmethod
    def from_function(cls, fn: Callable[..., Any], name: Optional[str] = None) -> "Tool":
        """A tool of `fn` named `name` (default: the function's own name), its schema from signature + docstring."""
        return cls(name or fn.__name__, fn)

    @property
    def parameters(self) -> Dict[str, Any]:
        return self.schema["function"]["parameters"]

    def check_arguments(self, arguments: Any) -> Optional[str]:
        """Why `arguments` cannot be passed to the tool (not an object, unknown, missing, wrong type), or None."""
        if not isinstance(arguments, dict):
            return f"the arguments of {self.name} must be a JSON object, got a JSON {json_type_name(arguments)}"
        props = self.parameters.get("properties", {})
        takes = ", ".join(f"{k} ({v.get('type', 'any')})" for k, v in props.items()) or "no arguments"
        unknown = [k for k in arguments if k not in props]
        if unknown and not self.parameters.get("additionalProperties", False):
            return f"unknown argument {unknown[0]!r} for {self.name}; it takes: {takes}"
        missing = [k for k in self.parameters.get("required", []) if k not in arguments]
        if missing:
            return f"missing argument {missing[0]!r} for {self.name}; it takes: {takes}"
        for key, value in arguments.items():
            problem = check_value(value, props.get(key, {}), f"argument {key!r} of {self.name}")
            if problem:
                return problem
        return None

    def call(self, arguments: Any) -> ToolResult:
        """Run the tool; never raises (bad arguments and exceptions come back as error results)."""
        start = time.perf_counter()
        problem = self.check_arguments(arguments)
        if problem:
            return error_result(self.name, "bad_arguments", problem, time.perf_counter() - start)
        try:
            value = self.fn(**arguments)
            content = to_content(value)
        except ToolError as exc:
            return error_result(self.name, exc.kind, str(exc), time.perf_counter() - start)
        except (Exception, SystemExit) as exc:  # the tool's own failure becomes the policy's next observation
            # (SystemExit too: a tool calling sys.exit() must not end the trainer from a tool thread's result)
            return error_result(self.name, "exception", f"{self.name} raised {type(exc).__name__}: "
                                f"{str(exc)[:500]}", time.perf_counter() - start)
        return ToolResult(self.name, content, None, time.perf_counter() - start)


def precheck(call: ToolCall, names: Sequence[str]) -> Optional[ToolResult]:
    """The result of a call that cannot run at all (malformed, or naming no tool of `names`), else None."""
    if call.error:
        return error_result(call.name, "malformed", call.message or "the tool call could not be read")
    if call.name not in names:
        listed = ", ".join(names) or "(none)"
        return error_result(call.name, "unknown_tool", f"unknown tool {call.name!r}; tools: {listed}")
    return None


class ToolSet:
    """The tools of a run, by name. `.call` never raises. `times_own_calls` False: ToolEnvironment bounds each call
    by its `timeout_s` (a RemoteToolSet's calls bound themselves, and its transport failures must reach the run)."""

    times_own_calls = False

    def __init__(self, tools: Sequence[Tool]) -> None:
        self.tools: Dict[str, Tool] = {}
        for tool in tools:
            if tool.name in self.tools:
                raise ValueError(f"two tools are named {tool.name!r}; tool names must be unique")
            self.tools[tool.name] = tool

    @property
    def names(self) -> List[str]:
        return list(self.tools)

    def schemas(self) -> List[Dict[str, Any]]:
        return [tool.schema for tool in self.tools.values()]

    def call(self, call: ToolCall) -> ToolResult:
        early = precheck(call, self.names)
        return early if early is not None else self.tools[call.name].call(call.arguments)

    def __len__(self) -> int:
        return len(self.tools)

    def __repr__(self) -> str:
        return f"ToolSet({', '.join(self.names)})"
