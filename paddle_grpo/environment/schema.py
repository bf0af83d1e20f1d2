"""A tool's JSON schema (the OpenAI / Qwen function format) from its Python signature and docstring.

    def calculator(expression: str) -> str:
        '''Evaluate an arithmetic expression.

        Args:
            expression: numbers with + - * / // % ** and parentheses, e.g. "123*45".
        '''

gives `{"type": "function", "function": {"name": "calculator", "description": "Evaluate an arithmetic expression.",
"parameters": {"type": "object", "properties": {"expression": {"type": "string", "description": "numbers with ..."}},
"required": ["expression"]}}}`.

Type hints map to JSON types: str -> string, int -> integer, float -> number, bool -> boolean, list / List[X] /
tuple -> array (with `items` when X maps), dict / Dict -> object, Literal[a, b] -> enum, Optional[X] -> X (None is
then accepted too). A parameter without a hint (or with a hint outside this list, e.g. Any) gets no "type": any
JSON value is accepted and the function checks it itself. `**kwargs` adds `"additionalProperties": true`.
Required: the parameters without a default. The description is the docstring's first paragraph; a parameter's,
its line in the "Args:" section (Google style, `name: text` or `name (type): text`, continuation lines indented
further).
"""
import inspect
import re
import types
import typing
from typing import Any, Callable, Dict, List, Optional

_SIMPLE = {str: "string", int: "integer", float: "number", bool: "boolean", list: "array", tuple: "array",
           dict: "object"}
_SECTION = re.compile(r"^\s*(Args|Arguments|Parameters|Returns|Return|Raises|Yields|Examples?|Notes?):\s*$")
_ARG_LINE = re.compile(r"^(\*{0,2}\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")


def json_type(hint: Any) -> Dict[str, Any]:
    """The JSON-schema fragment of one type hint ({} for a hint without a JSON equivalent: any value)."""
    if hint in _SIMPLE:
        return {"type": _SIMPLE[hint]}
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Union or origin is getattr(types, "UnionType", None):  # Optional[X], X | None
        rest = [a for a in args if a is not type(None)]
        return json_type(rest[0]) if len(rest) == 1 else {}
    if origin is typing.Literal:
        kinds = {json_type(type(a)).get("type") for a in args}
        return {**({"type": kinds.pop()} if len(kinds) == 1 and None not in kinds else {}), "enum": list(args)}
    if origin in (list, tuple):
        homogeneous = origin is list or (len(args) == 2 and args[1] is Ellipsis)  # tuple[X, ...]
        items = json_type(args[0]) if args and homogeneous else {}
        return {"type": "array", **({"items": items} if items else {})}
    if origin is dict:
        return {"type": "object"}
    return {}


def parse_docstring(doc: Optional[str]) -> "tuple[str, Dict[str, str]]":
    """(description: the first paragraph on one line, {parameter: its "Args:" text on one line})."""
    lines = inspect.cleandoc(doc or "").splitlines()
    summary: List[str] = []
    for line in lines:
        if not line.strip() or _SECTION.match(line):
            break
        summary.append(line.strip())
    args: Dict[str, str] = {}
    inside, indent, current = False, 0, None
    for line in lines:
        if _SECTION.match(line):
            inside = line.strip().rstrip(":") in ("Args", "Arguments", "Parameters")
            indent, current = None, None
            continue
        if not inside or not line.strip():
            continue
        depth = len(line) - len(line.lstrip())
        match = _ARG_LINE.match(line.strip())
        if indent is None:
            indent = depth
        if depth == indent and match:
            current = match.group(1).lstrip("*")
            args[current] = match.group(2).strip()
        elif depth > indent and current is not None:  # a continuation line of the current parameter
            args[current] = (args[current] + " " + line.strip()).strip()
        elif depth < indent:  # dedented text after the section: the section is over
            inside = False
    return " ".join(summary), args


def function_schema(fn: Callable, name: str) -> Dict[str, Any]:
    """The function schema of `fn` under `name` (see the module docstring). Raises TypeError for parameters a JSON
    call cannot fill (positional-only, *args)."""
    signature = inspect.signature(fn)
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # a hint naming something undefined: fall back to the raw annotations
        hints = {k: v for k, v in getattr(fn, "__annotations__", {}).items()}
    description, arg_docs = parse_docstring(inspect.getdoc(fn))
    properties: Dict[str, Any] = {}
    required: List[str] = []
    open_ended = False
    for param in signature.parameters.values():
        if param.kind in (param.POSITIONAL_ONLY, param.VAR_POSITIONAL):
            raise TypeError(f"tool {name!r}: parameter {param.name!r} is positional-only or *args; a tool's "
                            "arguments are passed by name (a JSON object)")
        if param.kind is param.VAR_KEYWORD:
            open_ended = True
            continue
        prop = json_type(hints[param.name]) if param.name in hints else {}
        if param.name in arg_docs:
            prop["description"] = arg_docs[param.name]
        properties[param.name] = prop
        if param.default is param.empty:
            required.append(param.name)
    parameters = {"type": "object", "properties": properties, "required": required}
    if open_ended:  # **kwargs: arguments beyond the listed ones are passed on
        parameters["additionalProperties"] = True
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}
