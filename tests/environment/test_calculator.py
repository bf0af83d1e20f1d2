"""The calculator on hand-computed values, and what it refuses (before computing anything)."""
import time

import pytest

from paddle_grpo.environment import get_tool
from paddle_grpo.environment.builtins import MAX_EXPRESSION_CHARS, calculator


@pytest.mark.parametrize("expression, expected", [
    ("123*45", "5535"),
    (" 999 * 99 ", "98901"),
    ("(2+3)*4", "20"),
    ("2+3*4", "14"),
    ("-7 + +2", "-5"),
    ("7//2", "3"), ("-7//2", "-4"), ("-7%3", "2"), ("7%-3", "-2"),
    ("2**10", "1024"), ("2**-2", "0.25"), ("-2**2", "-4"), ("(-2)**3", "-8"),
    ("6/3", "2"), ("10/4", "2.5"), ("1/3", "0.333333333333333"),
    ("0.1+0.2", "0.3"),  # 0.30000000000000004 shown with 15 significant digits
    ("1.5e3*2", "3000"), ("1e20", "1e+20"),
    ("2**64", "18446744073709551616"),  # integers stay exact
    ("123456789*987654321", "121932631112635269"),
    ("2**4096", str(2 ** 4096)),  # exactly at the size limit
])
def test_values(expression, expected):
    assert calculator(expression) == expected
    result = get_tool("calculator").call({"expression": expression})
    assert (result.error, result.content) == (None, expected)


@pytest.mark.parametrize("expression, message", [
    ("x + 1", "a name ('x') is not allowed"),
    ("abs(-3)", "a function call ('abs(-3)') is not allowed"),
    ("__import__('os').system('true')", "a function call"),
    ("(1).real", "an attribute ('(1).real') is not allowed"),
    ("[1][0]", "an index ('[1][0]') is not allowed"),
    ("'a' * 3", "a non-numeric constant (\"'a'\") is not allowed"),
    ("True + 1", "a non-numeric constant ('True') is not allowed"),
    ("1j * 2", "a non-numeric constant ('1j') is not allowed"),
    ("1 < 2", "a comparison ('1 < 2') is not allowed"),
    ("1 << 100", "the operator << ('1 << 100') is not allowed"),
    ("~1", "the operator ~ ('~1') is not allowed"),
    ("9**9**9", "the exponent 387420489 is above the limit of 10000"),
    ("2**4097", "the result would be at least 2**4097, above the limit of 2**4096 (1234 digits)"),
    ("(10**1000)*(10**1000)", "the result of '(10**1000)*(10**1000)' is about 2**6643, above the limit"),
    ("3**4096", "the result of '3**4096' is about 2**6492, above the limit of 2**4096 (1234 digits)"),
    ("1/0", "division by zero in '1/0'"), ("5 // 0", "division by zero"), ("5 % 0", "division by zero"),
    ("0**-1", "division by zero"),
    ("1e308*10", "too large for a decimal number"), ("2.0**5000", "too large for a decimal number"),
    ("(-8)**0.5", "has no real result"),
    ("1 +", "cannot read '1 +' as arithmetic (invalid syntax)"),
    ("", "the expression is empty"),
    ("-" * (MAX_EXPRESSION_CHARS - 1) + "1", "is nested too deeply"),  # was an 'exception' (RecursionError)
    ("1+" * MAX_EXPRESSION_CHARS + "1", f"the expression has {2 * MAX_EXPRESSION_CHARS + 1} characters"),
])
def test_refusals_are_bad_arguments_with_a_message(expression, message):
    start = time.perf_counter()
    result = get_tool("calculator").call({"expression": expression})
    assert result.error == "bad_arguments" and result.content.startswith("error: ")
    assert message in result.content, result.content
    assert time.perf_counter() - start < 1.0  # refused, not computed (9**9**9 would take hours)


# Integer results at and around the documented bound, 2**4096 in magnitude (1,234 digits): powers of every base
# size (the pre-check's bound bits(|base|) - 1 per factor is loose for 3, 5, 7: 3**4096 has 6,493 bits), products
# and sums of big operands, intermediate results beyond the bound. The reference is Python's own integer arithmetic.
BOUND_CASES = ["2**4096", "-(2**4096)", "(-2)**4096", "2**4096+1", "2**4096-1", "-(2**4096)-1", "3**4096",
               "3**2584", "3**2585", "5**1764", "5**1765", "7**1459", "7**1460", "(2**2048)*(2**2048)",
               "(2**2048)*(2**2048)*2", "(2**2048+1)*(2**2048)", "2**4096+2**4096", "(2**4096+2**4096)//2",
               "(3**4096)//(3**4000)", "(2**4095)*2", "2**4095*3", "1**100000", "(-1)**100001", "0**10000"]


@pytest.mark.parametrize("expression", BOUND_CASES)
def test_integer_results_are_bounded_by_2_to_the_4096_exactly(expression):
    result = get_tool("calculator").call({"expression": expression})
    steps_ok = expression not in ("(2**4096+2**4096)//2", "(3**4096)//(3**4000)")  # over the bound on the way
    value = eval(expression)  # noqa: S307 - the test's own literals: the independent reference
    if steps_ok and abs(value) <= 2 ** 4096:
        assert (result.error, result.content) == (None, str(value))
    else:
        assert result.error == "bad_arguments" and "above the limit of 2**4096 (1234 digits)" in result.content
    assert len(str(2 ** 4096)) == 1234  # the documented digit count
