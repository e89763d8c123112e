"""`safe_math.evaluate`: Python's arithmetic without `eval`, bounded, refusing everything else.

The reference for the allowed expressions is what upstream ran, `eval(expr, {"__builtins__": {}, "math": math})`,
applied here to this file's own literal expressions (the package never evals)."""

import ast
import math
import random

import pytest

from minimind_trl.agent import safe_math
from minimind_trl.agent.safe_math import (
    BINARY_BITS,
    CALL_BITS,
    MATH_FUNCTIONS,
    MAX_INT_BITS,
    UnsafeExpression,
    evaluate,
)

UPSTREAM_GLOBALS = {"__builtins__": {}, "math": math}

ARITHMETIC = [
    "256*37", "2**10", "3*4/2-1", "(1+2)*3", "1/3", "7", "-16-88", "912/49", "10**3000", "2**-3", "(-8)**(1/3)",
    "7//2", "-7//2", "7%3", "-7%3", "7.5%2", "2**0.5", "+5", "--5", "~5", "not 0", "True+1", "1e308*10", "1j**2",
    "math.sqrt(144)", "math.pi", "math.e*2", "math.log(100, 10)", "math.factorial(20)", "math.comb(50, 25)",
    "math.perm(10)", "math.frexp(8)", "math.gcd(12, 18)", "math.isqrt(10**40)", "math.inf", "math.nan",
    "math.floor(2.5)+math.ceil(2.5)", "math.pow(2, 10)", "math.fsum", "1_000 + 0x10", " 1+1", "\t2*3",
    "(((1)))", "None", "10**5000 % 7", "(10**4000) // (10**3999)",
]  # fmt: skip
FAILING = ["1/0", "math.sqrt(-1)", "10**400 / 3", "2.0**10000", "math.exp(1000)", "1 +", "2²", "math.factorial(-1)"]


def upstream(expression: str):
    return eval(expression, dict(UPSTREAM_GLOBALS))  # noqa: S307 - the test's own literal, as upstream ran it


@pytest.mark.parametrize("expression", [e for e in ARITHMETIC if e != "math.fsum"])
def test_arithmetic_gives_pythons_value_and_text(expression):
    expected = upstream(expression)
    value = evaluate(expression)
    if isinstance(expected, float) and math.isnan(expected):
        assert math.isnan(value)
    else:
        assert value == expected and type(value) is type(expected)
    if not (isinstance(expected, int) and expected.bit_length() > 14_000):
        assert str(value) == str(expected)  # what the tool returns


@pytest.mark.parametrize("expression", FAILING)
def test_what_fails_in_python_fails_here(expression):
    with pytest.raises(Exception) as upstream_error:
        upstream(expression)
    with pytest.raises(type(upstream_error.value)):
        evaluate(expression)


@pytest.mark.parametrize(
    "expression",
    [
        "__import__('os')",
        "().__class__.__base__.__subclasses__()",
        "math.__dict__",
        "math.__loader__",
        "math._private",
        "sqrt(144)",  # a bare name: upstream had no builtins either
        "abs(-1)",
        "x",
        "'abc' * 3",
        "[1, 2]",
        "(1, 2)",
        "{1: 2}",
        "1 < 2",
        "1 if 1 else 2",
        "lambda: 1",
        "[x for x in ()]",
        "math.sqrt.__self__",
        "math.fsum([1, 2])",
        "math.sqrt(*[4])",
        "1 << 10",
        "1 & 1",
        "math.frexp(8) * 10**9",  # a tuple result takes no part in arithmetic
        "math",
        "math.sqrt",  # a function is no number
    ],
)
def test_everything_but_arithmetic_is_refused(expression):
    with pytest.raises((UnsafeExpression, SyntaxError)):
        evaluate(expression)


@pytest.mark.parametrize(
    "expression",
    ["9**9**9", "2**(2**17)", "10**100000", "(10**40000)*(10**40000)", "math.factorial(10**6)",
     "math.factorial(10**5000)", "math.comb(10**6, 5*10**5)", "math.perm(10**9, 10**5)", "(-3)**10**7"],
)  # fmt: skip
def test_work_is_bounded(expression):
    """Each of these would compute for seconds to hours (or exhaust memory) under upstream's eval."""
    with pytest.raises(UnsafeExpression):
        evaluate(expression)


def test_the_bound_keeps_what_upstream_can_print():
    assert str(evaluate("10**3000")) == "1" + "0" * 3000
    assert evaluate("2**(2**17 - 1)").bit_length() == MAX_INT_BITS
    with pytest.raises(ValueError):  # CPython 3.11 refuses str() beyond 4300 digits, as it did upstream
        str(evaluate("10**5000"))
    assert evaluate("math.comb(10**30, 2)") == math.comb(10**30, 2)  # huge n, small k: cheap, allowed


def test_every_math_function_that_can_give_an_integer_has_a_bound_before_it_runs():
    """A new `math` function returning an int (Python 3.12's `math.sumprod` ...) fails here until it has a bound."""
    for name, fn in MATH_FUNCTIONS.items():
        for args in ([3], [7, 3], [12, 18, 4], [2.5]):
            try:
                result = fn(*args)
            except (TypeError, ValueError):
                continue
            if isinstance(result, int) and not isinstance(result, bool):
                assert name in CALL_BITS, f"math.{name} gives an integer without a bound in CALL_BITS"


@pytest.mark.parametrize("seed", range(5))
def test_the_bounds_are_upper_bounds_of_the_result(seed):
    rng = random.Random(seed)
    operands = [rng.getrandbits(rng.choice([1, 8, 64, 1000, 5000])) * rng.choice([1, -1]) for _ in range(12)]
    for left in operands:
        for right in operands:
            for op, estimate in BINARY_BITS.items():
                if estimate(left, right) > MAX_INT_BITS:  # refused by the evaluator
                    continue
                try:
                    result = safe_math.BINARY_OPERATORS[op](left, right)
                except (OverflowError, ZeroDivisionError):  # no integer built
                    continue
                if isinstance(result, int):
                    assert result.bit_length() <= estimate(left, right), (op, left, right)
    positive = [abs(x) for x in operands] + [rng.randint(0, 3000) for _ in range(6)]
    for name, estimate in CALL_BITS.items():
        for args in ([positive[0]], positive[:2], positive[:3], [rng.randint(0, 2000)], [rng.randint(0, 2000), 7]):
            if estimate(args) > MAX_INT_BITS:  # refused by the evaluator; computing it could take hours
                continue
            try:
                result = MATH_FUNCTIONS[name](*args)
            except (TypeError, ValueError, OverflowError):
                continue
            assert result.bit_length() <= estimate(args), (name, args)


@pytest.mark.parametrize("expression", [
    "math.lcm(" + ", ".join(f"2**131070 - {k}" for k in range(1, 13)) + ")",  # a 1,572,840-bit lcm
    "(2**131000) * (2**131000)",
    "2**131071 + 2**131071",
    "-(2**131071) - 2**131071",
    "2**131072",
    "math.gcd(2**131071, 2**131071) * 4",
])  # fmt: skip
def test_no_operation_builds_an_integer_over_the_bound_before_refusing_it(expression, monkeypatch):
    built = []
    monkeypatch.setitem(MATH_FUNCTIONS, "lcm", lambda *args: built.append(args) or math.lcm(*args))
    real_check = safe_math._check_int
    monkeypatch.setattr(safe_math, "_check_int", lambda value: built.append(value) if isinstance(value, int) and
                        value.bit_length() > MAX_INT_BITS else real_check(value))
    with pytest.raises(UnsafeExpression, match="refused before computing it"):
        evaluate(expression)
    assert built == []
