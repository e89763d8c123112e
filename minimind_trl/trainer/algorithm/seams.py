"""A seam of the trainer: a table of functions picked by name from the config, as `loss_type`,
`advantage_estimator` and `loss_aggregation` are (`policy_losses`, `advantages`, `loss_aggregation` each define one).

A value is a registered name or, as `reward_funcs` take, an importable `package.module:function` (also
`package.module.function`). `Seam.resolve` imports such a value with the resolver rewards use
(`loading_utils.import_function`), checks that the function can take the seam's arguments and registers it under
the value itself, so every later lookup by name finds it. `MiniMindGRPOConfig` resolves its three seams before it
validates them (`seam_choice.resolve_seam_names`): under `accelerate launch` every process builds the config, so
every process imports the module. Every problem is one `ExtensionError` line naming the config key and the value.

`Seam.register` refuses what could not be picked back unambiguously: a name that is not a non-empty string, a name
reserved for TRL's own code, and a second function under a taken name.
"""

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field

from ...errors import ExtensionError, MiniMindTRLError
from ...loading_utils import import_function, is_import_spec


def function_name(fn: Callable) -> str:
    """`package.module:qualname` of a function, as the run record and the model card name it."""
    module = getattr(fn, "__module__", None) or "?"
    return f"{module}:{getattr(fn, '__qualname__', None) or type(fn).__qualname__}"


def _written_in_python(fn: Callable) -> bool:
    """A Python function, a partial of one, or an instance whose class defines `__call__` in Python."""
    target = fn.func if isinstance(fn, functools.partial) else fn
    if inspect.isfunction(target) or inspect.ismethod(target):
        return True
    call = getattr(type(target), "__call__", None)
    return inspect.isfunction(call)


@dataclass(frozen=True)
class Seam:
    """One named seam: `key` (the config field), `what` (for messages), the positional `parameters` its functions
    take (named, for messages), its `table` of registered functions and the `reserved` names TRL's own code
    implements (name -> why it cannot be registered)."""

    key: str
    what: str
    parameters: tuple[str, ...]
    table: dict[str, Callable]
    reserved: dict[str, str] = field(default_factory=dict)

    def register(self, name: str) -> Callable[[Callable], Callable]:
        """Decorator: register a function under `name`."""
        if not isinstance(name, str) or not name.strip():
            raise ExtensionError(f"{self.what} name must be a non-empty string, got {name!r}")
        if name in self.reserved:
            raise ExtensionError(self.reserved[name])

        def register(fn: Callable) -> Callable:
            if self.table.get(name, fn) is not fn:
                raise ExtensionError(f"{self.what} {name!r} is already registered ({function_name(self.table[name])})")
            self.table[name] = fn
            return fn

        return register

    def get(self, name: str) -> Callable:
        if name not in self.table:
            known = ", ".join([*self.reserved, *self.table]) or "none"
            raise ExtensionError(f"unknown {self.key} {name!r}; {'known' if self.reserved else 'registered'}: {known}")
        return self.table[name]

    def resolve(self, value) -> None:
        """Make `value` a registered name: a `package.module:function` not registered yet is imported, checked and
        registered under `value`. Registered and reserved names are left for the config's own checks."""
        if not isinstance(value, str) or value in self.table or value in self.reserved or not is_import_spec(value):
            return
        where = f"{self.key} {value!r}"
        try:
            fn = import_function(value, self.key, ExtensionError, form="package.module:function")
        except MiniMindTRLError as exc:  # also what the module raised registering its own functions
            message = str(exc)
            raise ExtensionError(message if message.startswith(where) else f"{where}: {message}") from exc
        problem = self.signature_problem(fn)
        if problem:
            raise ExtensionError(f"{where}: {function_name(fn)} {problem}")
        self.table.setdefault(value, fn)

    def signature_problem(self, fn: Callable) -> str | None:
        """Why `fn` cannot serve the seam, or None: a class, a generator function, a function built into Python or
        an extension (`os:system`, `builtins:print`: they take any arguments or none readable, and would fail at
        the first step with a raw `TypeError`), or a function that cannot take the seam's positional arguments."""
        if inspect.isclass(fn):
            return "is a class; name a function"
        if inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn) or inspect.iscoroutinefunction(fn):
            return "is a generator or coroutine function; name a plain function that returns its result"
        if not _written_in_python(fn):
            return (f"is a {type(fn).__name__} built into Python or an extension, not a function written for this "
                    "seam; name a Python function")
        try:
            signature = inspect.signature(fn)
        except (TypeError, ValueError):  # a Python callable whose signature Python cannot read
            return None
        try:
            signature.bind(*self.parameters)
        except TypeError as exc:
            article = "an" if self.what[0] in "aeiou" else "a"
            arguments = ", ".join(self.parameters)
            name = getattr(fn, "__name__", "it")
            return f"cannot be called with {article} {self.what}'s arguments ({arguments}): {name}{signature} ({exc})"
        return None

    def function_name(self, name: str) -> str:
        """What the run record and the model card say runs for `name`."""
        if name in self.reserved:
            return f"trl:GRPOTrainer ({name})"
        return function_name(self.get(name))


__all__ = ["Seam", "function_name"]
