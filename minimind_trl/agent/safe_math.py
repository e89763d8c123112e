"""Arithmetic a model may ask for, evaluated without `eval`.

Upstream's `calculate_math` mock is `eval(expression, {"__builtins__": {}, "math": math})`: a prompt can reach
Python's object graph through it (`().__class__.__base__...`) and hang the run (`9**9**9`). `evaluate` walks the
parsed expression instead and allows only what arithmetic needs:

* numbers (int, float, complex, True/False) and `None`, parentheses;
* `+ - * / // % **`, unary `+ - ~` and `not`;
* `math.<name>` constants (`math.pi`, `math.e`, ...) and calls of `math` functions with numeric arguments.

Everything else (other names, attribute access, strings, containers, comparisons, lambdas, subscripts) raises
`UnsafeExpression`. The work is bounded: every integer the evaluation produces has at most `MAX_INT_BITS` bits.
Every allowed operation that can produce an integer has an upper estimate of its result's bits computed from its
operands *before* it runs (`BINARY_BITS`, `UNARY_BITS`, `CALL_BITS`: `+ - * // % **`, `~ -`, `math.lcm`, `gcd`,
`factorial`, `comb`, `perm`, `isqrt`, `floor`, `ceil`, `trunc`), and is refused when the estimate exceeds the
bound, so no oversized integer is ever built (float arithmetic is constant-time, and overflows raise). The tool's
time limit holds besides: the toolbox runs tools in a worker process it kills at the limit (`tool_process.py`). The bound is far above what upstream can print: CPython
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

from ..errors import MiniMindTRLError

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


class UnsafeExpression(MiniMindTRLError):
    """An expression outside the allowed arithmetic, or one whose evaluation would exceed the work bound (a
    `MiniMindTRLError`, hence still a `ValueError`)."""


def _check_int(value: Any) -> Any:
    if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        raise UnsafeExpression(f"an integer of {value.bit_length()} bits exceeds the {MAX_INT_BITS}-bit bound")
    return value


def _bits(value: Any) -> int:
    """Bits of an integer operand (0 for a float, a complex or None: they never grow an integer)."""
    return value.bit_length() if isinstance(value, int) else 0


def _as_count(value: Any) -> float:
    """A factorial-like argument as a float magnitude (huge ones become inf: refused by the caller)."""
    try:
        return abs(float(value))
    except (OverflowError, TypeError, ValueError):
        return math.inf


def _power_bits(base: Any, exponent: Any) -> float:
    if not (isinstance(base, int) and isinstance(exponent, int)) or exponent <= 0 or abs(base) <= 1:
        return 1.0  # a float, complex or negative power, or 0/1/-1 to any power (at most one bit)
    if exponent.bit_length() > 64:
        return math.inf
    return math.floor(exponent * math.log2(abs(base))) + 1


def _factorial_bits(args: list) -> float:
    n = _as_count(args[0]) if args else 0.0  # Stirling's upper bound of log2(n!)
    return (n + 0.5) * math.log2(n) - n * math.log2(math.e) + 3 if n > 2 else 3.0


def _comb_perm_bits(name: str, args: list) -> float:
    n = _as_count(args[0]) if args else 0.0
    k = _as_count(args[1]) if len(args) > 1 else n
    if name == "comb":
        k = min(k, max(n - k, 0.0))
    return k * math.log2(n) + 1 if n > 1 else 1.0


# Upper estimates of the bits of an integer result, from the operands, for every operation that can give one.
BINARY_BITS: dict[type, Callable[[Any, Any], float]] = {
    ast.Add: lambda a, b: max(_bits(a), _bits(b)) + 1,
    ast.Sub: lambda a, b: max(_bits(a), _bits(b)) + 1,
    ast.Mult: lambda a, b: _bits(a) + _bits(b),
    ast.Div: lambda a, b: 0,  # a float
    ast.FloorDiv: lambda a, b: max(_bits(a), _bits(b)) + 1,
    ast.Mod: lambda a, b: max(_bits(a), _bits(b)) + 1,
    ast.Pow: _power_bits,
}
UNARY_BITS: dict[type, Callable[[Any], float]] = {
    ast.UAdd: _bits,
    ast.USub: lambda a: _bits(a) + 1,
    ast.Invert: lambda a: _bits(a) + 1,
    ast.Not: lambda a: 1,
}
FLOAT_TO_INT_BITS = 1025  # math.floor/ceil/trunc of the largest float
CALL_BITS: dict[str, Callable[[list], float]] = {
    "lcm": lambda args: sum(_bits(a) for a in args),
    "gcd": lambda args: max((_bits(a) for a in args), default=0),
    "isqrt": lambda args: max((_bits(a) for a in args), default=0),
    "floor": lambda args: max([FLOAT_TO_INT_BITS, *(_bits(a) for a in args)]),
    "ceil": lambda args: max([FLOAT_TO_INT_BITS, *(_bits(a) for a in args)]),
    "trunc": lambda args: max([FLOAT_TO_INT_BITS, *(_bits(a) for a in args)]),
    "factorial": _factorial_bits,
    "comb": lambda args: _comb_perm_bits("comb", args),
    "perm": lambda args: _comb_perm_bits("perm", args),
}


def _check_bound(estimate: float, what: str) -> None:
    if not estimate <= MAX_INT_BITS:  # also NaN
        raise UnsafeExpression(f"{what} would give an integer of about {estimate:.0f} bits, over the "
                               f"{MAX_INT_BITS}-bit bound (refused before computing it)")


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
    if name in CALL_BITS:
        _check_bound(CALL_BITS[name](args), f"math.{name}")
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
        _check_bound(BINARY_BITS[type(node.op)](left, right), type(node.op).__name__)
        return _check_int(BINARY_OPERATORS[type(node.op)](left, right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in UNARY_OPERATORS:
        operand = _operand(node.operand)
        _check_bound(UNARY_BITS[type(node.op)](operand), type(node.op).__name__)
        return _check_int(UNARY_OPERATORS[type(node.op)](operand))
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


__all__ = ["BINARY_BITS", "CALL_BITS", "UNARY_BITS", "MATH_CONSTANTS", "MATH_FUNCTIONS", "MAX_INT_BITS", "UnsafeExpression", "evaluate"]
