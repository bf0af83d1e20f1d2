"""The built-in `calculator` tool: arithmetic on numbers, read with `ast` and computed by a small interpreter (no
eval: names, calls, attributes, strings, comparisons are refused before anything runs).

Accepted: int and float literals, + - * / // % ** (binary), unary + and -, parentheses. Integers stay exact
(`123*45` -> `5535`); a float is shown with 15 significant digits (`0.1+0.2` -> `0.3`, `10/4` -> `2.5`, `6/3` ->
`2`), the digits a double holds exactly. Sizes are bounded so no expression can take long or much memory: at most
MAX_EXPRESSION_CHARS characters, integer results (and every integer computed on the way) at most 2**MAX_RESULT_BITS
in magnitude (1,234 digits; a power surely above it, like `9**9**9`, is refused before it is computed), exponents of
at most MAX_EXPONENT. A refusal, a division by zero or an
overflow is a `bad_arguments` result whose message says what to fix.
"""
import ast
import math
import operator
from typing import Union

from .registry import register_tool
from .tool import ToolArgumentError

MAX_EXPRESSION_CHARS = 1000
MAX_RESULT_BITS = 4096
MAX_EXPONENT = 10_000
_LIMIT = 2 ** MAX_RESULT_BITS
_LIMIT_DIGITS = len(str(_LIMIT))  # 1234

Number = Union[int, float]
_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_ALLOWED = "numbers, + - * / // % ** and parentheses"


@register_tool("calculator")
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression.

    Args:
        expression: numbers with + - * / // % ** and parentheses, e.g. 123*45
    """
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ToolArgumentError(f"the expression has {len(expression)} characters; the limit is "
                                f"{MAX_EXPRESSION_CHARS}")
    if not expression.strip():
        raise ToolArgumentError(f"the expression is empty; write {_ALLOWED}, e.g. 123*45")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise ToolArgumentError(f"cannot read {_quote(expression)} as arithmetic "
                                f"({getattr(exc, 'msg', None) or type(exc).__name__}); use {_ALLOWED}") from None
    try:
        value = _evaluate(tree.body, expression)
    except RecursionError:  # e.g. hundreds of nested unary minuses: ast reads them, the interpreter recurses
        raise ToolArgumentError(f"{_quote(expression)} is nested too deeply; use {_ALLOWED}") from None
    return format_number(value)


def format_number(value: Number) -> str:
    """An int exactly; a float with 15 significant digits (no trailing zeros; `2.0` -> `2`)."""
    if isinstance(value, int):
        return str(value)
    if not math.isfinite(value):
        raise ToolArgumentError(f"the result is {value}: too large for a decimal number")
    return format(value, ".15g")


def _quote(text: str, limit: int = 60) -> str:
    text = text.strip()
    return repr(text if len(text) <= limit else text[:limit] + "...")


def _evaluate(node: ast.AST, expression: str) -> Number:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):  # type(): True is not a number here
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_evaluate(node.operand, expression))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left, expression), _evaluate(node.right, expression)
        _check_size(node.op, left, right)
        try:
            result = _BINARY[type(node.op)](left, right)
        except ZeroDivisionError:
            raise ToolArgumentError(f"division by zero in {_quote(expression)}") from None
        except OverflowError:
            raise ToolArgumentError(f"the result of {_quote(expression)} is too large for a decimal number") \
                from None
        if isinstance(result, complex):  # (-8) ** 0.5
            raise ToolArgumentError(f"{_quote(expression)} has no real result (a fractional power of a negative "
                                    "number)")
        if isinstance(result, float) and not math.isfinite(result):
            raise ToolArgumentError(f"the result of {_quote(expression)} is too large for a decimal number")
        _check_result(result, expression)
        return result
    raise ToolArgumentError(f"{_describe(node, expression)} is not allowed; the calculator takes only {_ALLOWED}")


def _check_size(op: ast.operator, left: Number, right: Number) -> None:
    """Refuse a power whose integer result is surely beyond MAX_RESULT_BITS before computing it. Only a power can
    grow so fast that computing it is the danger; every other operation on integers of at most MAX_RESULT_BITS
    bits is cheap, and its result is checked exactly afterwards (`_check_result`)."""
    if isinstance(op, ast.Pow) and abs(right) > MAX_EXPONENT and not (isinstance(left, int) and abs(left) <= 1):
        raise ToolArgumentError(f"the exponent {format_number(right)} is above the limit of {MAX_EXPONENT}")
    if isinstance(op, ast.Pow) and isinstance(left, int) and isinstance(right, int) and right > 0:
        # |left|**right >= 2**((bits(|left|) - 1) * right): a lower bound, so a refusal here is never wrong; a
        # result under it has at most MAX_RESULT_BITS + MAX_EXPONENT bits (cheap) and is checked exactly.
        at_least = max(abs(left).bit_length() - 1, 0) * right
        if at_least > MAX_RESULT_BITS:
            raise ToolArgumentError(f"the result would be at least 2**{at_least}, above the limit of "
                                    f"2**{MAX_RESULT_BITS} ({_LIMIT_DIGITS} digits)")


def _check_result(result: Number, expression: str) -> None:
    """Refuse an integer result above 2**MAX_RESULT_BITS in magnitude (the documented bound, exactly)."""
    if isinstance(result, int) and abs(result) > _LIMIT:
        raise ToolArgumentError(f"the result of {_quote(expression)} is about 2**{abs(result).bit_length() - 1}, "
                                f"above the limit of 2**{MAX_RESULT_BITS} ({_LIMIT_DIGITS} digits)")


def _describe(node: ast.AST, expression: str) -> str:
    text = ast.get_source_segment(expression.strip(), node) or type(node).__name__
    kind = {ast.Name: "a name", ast.Call: "a function call", ast.Attribute: "an attribute",
            ast.Subscript: "an index", ast.Compare: "a comparison", ast.BoolOp: "a logical operator",
            ast.Lambda: "a lambda", ast.Constant: "a non-numeric constant"}.get(type(node))
    if kind is None and isinstance(node, ast.BinOp):
        kind = "the operator " + {ast.BitAnd: "&", ast.BitOr: "|", ast.BitXor: "^", ast.LShift: "<<",
                                  ast.RShift: ">>", ast.MatMult: "@"}.get(type(node.op), type(node.op).__name__)
    if kind is None and isinstance(node, ast.UnaryOp):
        kind = "the operator " + {ast.Not: "not", ast.Invert: "~"}.get(type(node.op), type(node.op).__name__)
    return f"{kind or 'the construct ' + type(node).__name__} ({_quote(text, 40)})"
