"""The keyword arguments a registered policy loss declares (`register_policy_loss(name, loss_kwargs={...})`) and
how a recipe's `loss_kwargs` are read against them (`declared_value`).

A declared default sets the type a recipe's value must have; a range (a `checks.config_ranges.Range` or a `(low,
high)` pair) bounds each of its numbers. Text that spells a number is read as one, as the recipe parser reads the
top-level `learning_rate: 1e-3` (YAML reads `1e-3` as a string); NaN, infinities and integers beyond 64 bits are
refused wherever they sit, inside lists and dicts too.
"""

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from ...errors import ExtensionError
from ..checks.config_ranges import Range, number_problem, shown_number


@dataclass(frozen=True)
class LossKwarg:
    """A keyword argument a loss declares: its `default`, whose type a recipe's value must have (`declared_value`
    says how a value is read), and, for a number or a list of numbers, the range each number must lie in: a
    `checks.config_ranges.Range`, a `(low, high)` pair (both included; None: unbounded) or any object with
    `contains(value)` and `describe()`."""

    default: object
    range: object | None = None


LOSS_KWARGS_ATTRIBUTE = "__minimind_loss_kwargs__"  # where a loss function keeps its declaration


def declare_loss_kwargs(who: str, loss_kwargs: Mapping[str, object] | None) -> Mapping[str, LossKwarg]:
    """`loss_kwargs` as a loss declares them (name -> default or `LossKwarg`), checked: a string keyword, a range
    that can be read, a default that fits its own declaration. Otherwise one `ExtensionError` naming `who`."""
    declared = {}
    for key, value in (loss_kwargs or {}).items():
        kwarg = value if isinstance(value, LossKwarg) else LossKwarg(value)
        where = f"{who} declares loss_kwargs {key!r}"
        if not isinstance(key, str):
            raise ExtensionError(f"{where}: a keyword is a string")
        declared[key] = LossKwarg(kwarg.default, _declared_range(where, kwarg.range))
        _, problem = declared_value(declared[key], kwarg.default)
        if problem:
            raise ExtensionError(f"{where} with default {shown_number(kwarg.default)}: {problem}")
    return MappingProxyType(declared)


def declared_loss_kwargs(fn: Callable) -> Mapping[str, LossKwarg]:
    """What `fn` declared with `register_policy_loss(name, loss_kwargs=...)` (nothing: an empty mapping)."""
    return getattr(fn, LOSS_KWARGS_ATTRIBUTE, MappingProxyType({}))


def _declared_range(where: str, declared):
    """A declaration's range as an object with `contains` and `describe`: a `(low, high)` pair becomes a `Range`."""
    if declared is None or all(callable(getattr(declared, name, None)) for name in ("contains", "describe")):
        return declared
    if isinstance(declared, (tuple, list)) and len(declared) == 2 and all(map(_is_bound, declared)):
        low, high = declared
        low, high = -math.inf if low is None else low, math.inf if high is None else high
        if low <= high:
            return Range(low, high)
    raise ExtensionError(f"{where} with range {shown_number(declared)}: a range is a checks.config_ranges.Range, a (low, high) "
                         "pair of numbers with low <= high (None: unbounded), or an object with contains() and "
                         "describe()")


def _is_bound(value) -> bool:
    """None, or a number that is not NaN and fits in 64 bits (an infinity is an open end)."""
    if value is None or (isinstance(value, float) and math.isinf(value)):
        return True
    return isinstance(value, (int, float)) and not isinstance(value, bool) and number_problem(value) is None


def _as_kind(kind: type, value):
    """`value` read as a setting of type `kind` is: an int as a float, and text that spells a number as that number,
    as the recipe parser reads a top-level `learning_rate: 1e-3` (YAML reads `1e-3` as a string). Else unchanged."""
    if isinstance(value, bool) or kind not in (int, float):
        return value
    if kind is float and isinstance(value, int) and number_problem(value) is None:
        return float(value)
    if isinstance(value, str):
        try:
            return kind(value)
        except ValueError:
            return value
    return value


def _a(kind: type) -> str:
    return f"{'an' if kind.__name__[0] in 'aeiou' else 'a'} {kind.__name__}"


def _numbers(value) -> list:
    """The numbers in `value`: itself, or those inside its lists, tuples and dicts (as values), at any depth."""
    if isinstance(value, (list, tuple)):
        return [number for item in value for number in _numbers(item)]
    if isinstance(value, Mapping):
        return [number for item in value.values() for number in _numbers(item)]
    return [value] if isinstance(value, (int, float)) and not isinstance(value, bool) else []


def declared_value(kwarg: LossKwarg, value) -> tuple[object, str | None]:
    """`value` as the declared keyword argument takes it (`_as_kind`; a list for a tuple and the other way round;
    each item of a list of numbers read as the default's items are), and why it does not fit, or None: another type
    than the default's (None as default: any), a NaN, an infinity or an integer beyond 64 bits anywhere in it, a
    number (or a list's item) outside the declared range."""
    default = kwarg.default
    value = _as_kind(type(default), value)
    sequences = (list, tuple)
    same_kind = type(value) is type(default) or (isinstance(default, sequences) and type(value) in sequences)
    if default is not None and not same_kind and number_problem(value) is None:
        got = f"{type(value).__name__} {shown_number(value)}"
        return value, f"must be {_a(type(default))} (like its default {default!r}), got {got}"
    if isinstance(default, sequences):
        item_kinds = {type(item) for item in default}
        if len(item_kinds) == 1 and item_kinds <= {int, float}:
            (kind,) = item_kinds
            value = [_as_kind(kind, item) for item in value]
            wrong = [item for item in value if type(item) is not kind and number_problem(item) is None]
            if wrong:
                got = shown_number(wrong[0])
                return value, f"must be a list of {kind.__name__} (like its default {default!r}), got {got} in it"
        value = type(default)(value)
    for number in _numbers(value):
        if problem := number_problem(number):
            return value, problem
    if kwarg.range is not None:
        for number in value if isinstance(value, sequences) else [value]:
            if not kwarg.range.contains(number):
                return value, f"must be {kwarg.range.describe()}, got {shown_number(number)}"
    return value, None


__all__ = ["LOSS_KWARGS_ATTRIBUTE", "LossKwarg", "declare_loss_kwargs", "declared_loss_kwargs", "declared_value"]
