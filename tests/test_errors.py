"""One error base (`errors.MiniMindTRLError`) for every exception class a user can see: each class defined anywhere
in `minimind_trl` that subclasses `Exception` derives from it, so `except MiniMindTRLError` catches every
user-facing error, and the `minimind-trl` command reports each as one `error:` line. The few classes left out are
listed in `NOT_USER_ERRORS`, each with its reason."""

import ast
import builtins
import importlib
import inspect
import pkgutil
from pathlib import Path

import minimind_trl
from minimind_trl.errors import MiniMindTRLError

PACKAGE = Path(minimind_trl.__file__).resolve().parent

NOT_USER_ERRORS = {
    # Never leaves the agent's toolbox: `Toolbox.execute` catches it and the tool's failure becomes the model's
    # observation text (`<tool> raised <kind>: <message>`), as upstream reports a raising mock tool.
    "minimind_trl.agent.tool_process.ToolRaised": "caught inside the toolbox, reported to the model, never raised",
    # A fault of the harness (the tool worker cannot start, its pipe breaks), not of anything the user gave: the
    # command must not turn it into a one-line usage error with exit code 2, it keeps its traceback as a bug does.
    "minimind_trl.agent.tool_process.ToolHarnessError": "a harness fault, not bad input: it keeps its traceback",
}
BUILTIN_EXCEPTIONS = {name for name, value in vars(builtins).items()
                      if inspect.isclass(value) and issubclass(value, BaseException)}


def package_exceptions() -> dict[str, type]:
    """{qualified name: class} for every `Exception` subclass defined at the top level of a `minimind_trl` module
    (every module imported; `__main__` modules left out, importing one runs the command)."""
    found = {}
    for info in pkgutil.walk_packages(minimind_trl.__path__, "minimind_trl."):
        if info.name.rsplit(".", 1)[-1] == "__main__":
            continue
        module = importlib.import_module(info.name)
        for value in vars(module).values():
            if inspect.isclass(value) and issubclass(value, Exception) and value.__module__ == module.__name__:
                found[f"{value.__module__}.{value.__qualname__}"] = value
    return found


def test_every_exception_class_derives_from_the_one_error_base():
    classes = package_exceptions()
    assert "minimind_trl.agent.safe_math.UnsafeExpression" in classes  # the walk reaches every subpackage
    outside = sorted(name for name, cls in classes.items()
                     if not issubclass(cls, MiniMindTRLError) and name not in NOT_USER_ERRORS)
    assert not outside, (f"{outside} do not derive from errors.MiniMindTRLError: derive them from it (or from a "
                         "subclass in errors.py), or list them in NOT_USER_ERRORS with the reason")
    assert all(issubclass(cls, ValueError) for cls in classes.values() if issubclass(cls, MiniMindTRLError))


def test_the_exemptions_are_current():
    classes = package_exceptions()
    for name, reason in NOT_USER_ERRORS.items():
        assert name in classes, f"NOT_USER_ERRORS lists {name}, which no longer exists"
        assert not issubclass(classes[name], MiniMindTRLError), f"{name} derives from MiniMindTRLError now"
        assert reason


def test_no_exception_class_hides_from_the_walk():
    """A class defined inside a function (or a class) is not reached by importing modules; none subclasses a
    built-in exception directly, so the walk above sees every exception class the package defines."""
    hidden = []
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        top_level = {id(node) for node in tree.body}
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and id(node) not in top_level:
                bases = {base.id for base in node.bases if isinstance(base, ast.Name)}
                if bases & BUILTIN_EXCEPTIONS:
                    hidden.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name}")
    assert not hidden, f"exception classes the import walk cannot check: {hidden}"
