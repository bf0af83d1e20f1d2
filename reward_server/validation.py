"""Reading a scoring request: `{"src": [str], "tgt": [str], "response": [str]}`, equal non-zero lengths; an
optional `"turns": [[message, ...], ...]` (multi-turn rollouts: each response's messages) goes to the reward
functions as their `turns` keyword.

Every rejection is a RequestError whose message names the field (and the index for a bad item), so a user can fix
the request from the message alone.
"""
import json

from paddle_grpo.environment.format import strict_json

FIELDS = ("src", "tgt", "response")


class RequestError(Exception):
    """A request the server cannot accept: HTTP `status` with `message` as the error_msg."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status
        self.message = message


def json_type(value):
    """JSON's name for the type of a decoded value (what the client sent, not Python's name for it)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _json_body(body, shape, loads=json.loads):
    if not body:
        raise RequestError(400, f"empty request body; send JSON {shape}")
    try:
        return loads(body)
    except (ValueError, RecursionError) as exc:  # RecursionError: absurdly nested arrays
        raise RequestError(400, f"request body is not valid JSON: {str(exc)[:200]}") from None


def parse_tool_call(body):
    """(name, arguments) of a tool call, POST /tool's body `{"name": str, "arguments": {...}}`, or
    RequestError(400). Read as the trainer reads a policy's call (strict_json): NaN, Infinity, numbers beyond a
    double and lone surrogates are refused, so every client's call meets the same rules."""
    shape = '{"name": "<tool>", "arguments": {...}}'
    data = _json_body(body, shape, strict_json)
    if not isinstance(data, dict):
        raise RequestError(400, f"request body must be a JSON object {shape}; got a JSON {json_type(data)}")
    name = data.get("name")
    if not isinstance(name, str) or not name:
        got = "missing" if "name" not in data else f"a JSON {json_type(name)}"
        raise RequestError(400, f"field 'name' must be the tool's name (a non-empty string), got {got}")
    arguments = data.get("arguments", {})
    if not isinstance(arguments, dict):
        raise RequestError(400, f"field 'arguments' must be a JSON object, got a JSON {json_type(arguments)}")
    return name, arguments


def parse_batch(body):
    """The three lists from the raw request body, or RequestError(400)."""
    data = _json_body(body, '{"src": [...], "tgt": [...], "response": [...]}')
    if not isinstance(data, dict):
        raise RequestError(400, f"request body must be a JSON object with fields src, tgt, response; "
                                f"got a JSON {json_type(data)}")
    missing = [f for f in FIELDS if f not in data]
    if missing:
        raise RequestError(400, f"missing field{'s' if len(missing) > 1 else ''} {', '.join(map(repr, missing))}; "
                                "a request needs src, tgt and response")
    for field in FIELDS:
        items = data[field]
        if not isinstance(items, list):
            raise RequestError(400, f"field '{field}' must be an array of strings, got a JSON {json_type(items)}")
        for i, item in enumerate(items):
            if not isinstance(item, str):
                raise RequestError(400, f"field '{field}' item {i} must be a string, got a JSON {json_type(item)}")
    lengths = {f: len(data[f]) for f in FIELDS}
    if len(set(lengths.values())) != 1:
        raise RequestError(400, "fields src, tgt and response must have equal lengths, got "
                                + ", ".join(f"{f}={n}" for f, n in lengths.items()))
    if lengths["src"] == 0:
        raise RequestError(400, "empty batch: src, tgt and response have no items")
    batch = {f: data[f] for f in FIELDS}
    if "turns" in data:  # optional (multi-turn rollouts): per sample a list of message objects
        turns = data["turns"]
        if not isinstance(turns, list) or len(turns) != lengths["src"] or \
                not all(isinstance(t, list) and all(isinstance(m, dict) for m in t) for t in turns):
            raise RequestError(400, f"field 'turns' must be an array of {lengths['src']} arrays of message objects "
                                    "(one per response)")
        batch["turns"] = turns
    return batch
