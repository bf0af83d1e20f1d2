"""Schemas from signatures and docstrings, against hand-written expected dicts."""
from typing import Dict, List, Literal, Optional, Tuple

import pytest

from paddle_grpo.environment import Tool
from paddle_grpo.environment.schema import function_schema, parse_docstring


def search(query: str, limit: int = 5, scale: float = 1.0, exact: bool = False, tags: List[str] = (),
           mode: Literal["fast", "full"] = "fast", extra: Optional[Dict[str, int]] = None, anything=None,
           pair: Tuple[int, ...] = ()) -> str:
    """Search the notes for a query.
    Second line of the summary.

    Args:
        query: the words to look for,
            in any order.
        limit (int): at most this many hits.
        mode: fast or full.

    Returns:
        the hits, one per line.
    """
    return query


def test_schema_from_signature_and_docstring():
    assert function_schema(search, "search") == {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the notes for a query. Second line of the summary.",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string", "description": "the words to look for, in any order."},
                    "limit": {"type": "integer", "description": "at most this many hits."},
                    "scale": {"type": "number"},
                    "exact": {"type": "boolean"},
                    "tags": {"type": "array", "items": {"type": "string"}},
                    "mode": {"type": "string", "enum": ["fast", "full"], "description": "fast or full."},
                    "extra": {"type": "object"},
                    "anything": {},
                    "pair": {"type": "array", "items": {"type": "integer"}},
                },
                "required": ["query"],
            },
        },
    }


def test_no_docstring_no_hints_and_kwargs():
    def f(a, b=1, **rest):
        return a

    assert function_schema(f, "f") == {"type": "function", "function": {
        "name": "f", "description": "", "parameters": {
            "type": "object", "properties": {"a": {}, "b": {}}, "required": ["a"], "additionalProperties": True}}}
    assert Tool.from_function(f).call({"a": 1, "c": 2}).content == "1"


def test_positional_only_and_varargs_are_refused():
    def g(a, /, b):
        return a

    def h(*args):
        return args

    with pytest.raises(TypeError, match="'a' is positional-only"):
        function_schema(g, "g")
    with pytest.raises(TypeError, match="'args' is positional-only or \\*args"):
        Tool.from_function(h)


def test_docstring_sections_end_where_they_should():
    description, args = parse_docstring("""Do it.

    Arguments:
        x: first.
        *y: second
            continued.
    Raises:
        ValueError: not an argument.
    """)
    assert description == "Do it."
    assert args == {"x": "first.", "y": "second continued."}
