"""Arithmetic a model may ask for, evaluated without `eval`.

Upstream's `calculate_math` mock is `eval(expression, {"__builtins__": {}, "math": math})`: a prompt can reach
Python's object graph through it (`().__class__.__base__...`) and hang the run (`9**9**9`). `evaluate` walks the
parsed expression instead and allows only what arithmetic needs:

* numbers (int, float, complex, True/False) and `None`, parentheses;
* `+ - * / // % **`, unary `+ - ~` and `not`;
* `math.<name>` constants (`math.pi`, `math.e`, ...) and calls of `math` functions with numeric arguments.

Everything else (other names, attribute access, strings, containers, comparisons, lambdas, subscripts) raises
`UnsafeExpression`. The work is bounded: every integer the evaluation produces has at most `MAX_INT_BITS` bits,
and `**`, `math.factorial`, `math.comb` and `math.perm` are refused before they would compute one that is larger
(float arithmetic is constant-time, and overflows raise). The bound is far above what upstream can print: CPython
3.11 refuses `str()` of an int over 4300 digits (about 14,300 bits), so upstream's `10**5000` fails at `str()`,
as it fails here; larger values fail here before they are computed, with the same outcome for the tool.

Where an expression is allowed its value is Python's own: the operators are Python's, so `str()` of the result
is what upstream's `eval` gives (`3*4/2-1` is `5.0`, `1/3` is `0.3333333333333333`).
"""

import ast
import math
import operator
from collections.abc import Callable
from typing import Any

MAX_INT_BITS = 1 << 17  # 131,072 bits, about 39,000 decimal digits

NUMBER_TYPES = (int, float, complex)  # bool is an int
BINARY_OPERATORS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
UNARY_OPERATORS: dict[type, Callable[[Any], Any]] = {
    ast.UAdd: operator.pos,
    ast.USub: operator.neg,
    ast.Invert: operator.invert,
    ast.Not: operator.not_,
}
MATH_FUNCTIONS = {name: value for name, value in vars(math).items() if not name.startswith("_") and callable(value)}
MATH_CONSTANTS = {name: value for name, value in vars(math).items() if isinstance(value, float)}


class UnsafeExpression(ValueError):
    """An expression outside the allowed arithmetic, or one whose evaluation would exceed the work bound."""


def _check_int(value: Any) -> Any:
    if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        raise UnsafeExpression(f"an integer of {value.bit_length()} bits exceeds the {MAX_INT_BITS}-bit bound")
    return value


def _int_bits_bound(base: int, exponent: int) -> float:
    """An upper estimate of the bits of `base ** exponent` (exponent > 0)."""
    magnitude = abs(base)
    return 0.0 if magnitude <= 1 else exponent * math.log2(magnitude)


def _check_power(base: Any, exponent: Any) -> None:
    if isinstance(base, int) and isinstance(exponent, int) and exponent > 0:
        if _int_bits_bound(base, exponent) > MAX_INT_BITS:
            raise UnsafeExpression(f"an integer power over the {MAX_INT_BITS}-bit bound")


def _as_count(value: Any) -> float:
    """A factorial-like argument as a float magnitude (huge ones become inf: refused by the caller)."""
    try:
        return abs(float(value))
    except (OverflowError, TypeError, ValueError):
        return math.inf


def _check_math_call(name: str, args: list) -> None:
    """Refuse the `math` calls whose integer result would exceed the bound (before computing it)."""
    if name == "factorial" and args:
        n = _as_count(args[0])
        if not math.isfinite(n) or (n > 2 and (n + 0.5) * math.log2(n) - n * math.log2(math.e) > MAX_INT_BITS):
            raise UnsafeExpression("math.factorial over the bound")
    elif name in ("comb", "perm") and args:
        n = _as_count(args[0])
        k = _as_count(args[1]) if len(args) > 1 else n
        if name == "comb":
            k = min(k, max(n - k, 0.0))
        if not math.isfinite(n * k) or (n > 1 and k * math.log2(n) > MAX_INT_BITS):
            raise UnsafeExpression(f"math.{name} over the bound")


def _number(value: Any) -> Any:
    if value is not None and not isinstance(value, NUMBER_TYPES):
        raise UnsafeExpression(f"{type(value).__name__} values are not allowed")
    return value


def _math_name(node: ast.AST) -> str:
    """`name` of a `math.name` attribute node; anything else is refused."""
    if not (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "math"):
        raise UnsafeExpression(f"only math.<name> may be used, not {ast.dump(node)[:80]}")
    return node.attr


def _call(node: ast.Call) -> Any:
    name = _math_name(node.func)
    if name not in MATH_FUNCTIONS:
        raise UnsafeExpression(f"math.{name} is not an allowed function")
    if any(isinstance(arg, ast.Starred) for arg in node.args) or any(kw.arg is None for kw in node.keywords):
        raise UnsafeExpression("argument unpacking is not allowed")
    args = [_operand(arg) for arg in node.args]
    kwargs = {kw.arg: _operand(kw.value) for kw in node.keywords}
    _check_math_call(name, args)
    result = MATH_FUNCTIONS[name](*args, **kwargs)
    if isinstance(result, tuple):  # math.frexp, math.modf: printable, but no operand (no tuple arithmetic)
        return tuple(_check_int(_number(part)) for part in result)
    return _check_int(_number(result))


def _operand(node: ast.AST) -> Any:
    """A number (or None) to compute with."""
    return _number(_eval(node))


def _eval(node: ast.AST) -> Any:
    if isinstance(node, ast.Constant):
        return _number(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in BINARY_OPERATORS:
        left, right = _operand(node.left), _operand(node.right)
        if isinstance(node.op, ast.Pow):
            _check_power(left, right)
        return _check_int(BINARY_OPERATORS[type(node.op)](left, right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in UNARY_OPERATORS:
        return UNARY_OPERATORS[type(node.op)](_operand(node.operand))
    if isinstance(node, ast.Call):
        return _call(node)
    if isinstance(node, ast.Attribute):
        name = _math_name(node)
        if name not in MATH_CONSTANTS:
            raise UnsafeExpression(f"math.{name} is not an allowed constant")
        return MATH_CONSTANTS[name]
    raise UnsafeExpression(f"{type(node).__name__} is not allowed")


def evaluate(expression: str) -> Any:
    """The value of an arithmetic expression (see the module docstring), or an exception: `UnsafeExpression` for
    what is not allowed, Python's own (`SyntaxError`, `ZeroDivisionError`, `OverflowError`, `TypeError`, ...) for
    what fails. Leading spaces and tabs are ignored, as `eval` ignores them."""
    tree = ast.parse(expression.lstrip(" \t"), mode="eval")
    return _eval(tree.body)


__all__ = ["MATH_CONSTANTS", "MATH_FUNCTIONS", "MAX_INT_BITS", "UnsafeExpression", "evaluate"]
