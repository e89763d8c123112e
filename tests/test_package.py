"""The package's shape: every module imports on its own, and no two modules import each other (directly or
through others), counting imports inside functions too."""

import ast
import os
import subprocess
import sys
from pathlib import Path

import minimind_trl

PACKAGE_DIR = Path(minimind_trl.__file__).resolve().parent


def module_names() -> list[str]:
    names = []
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
        if parts[-1] == "__main__":
            continue
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def imported_modules(name: str, known: set[str]) -> set[str]:
    """The package modules `name` imports anywhere in its source (module level or inside functions)."""
    path = PACKAGE_DIR.parent / Path(*name.split("."))
    is_package = path.is_dir()
    source = (path / "__init__.py") if is_package else path.with_suffix(".py")
    package = name if is_package else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            # `from pkg import mod` imports the submodule `pkg.mod` when there is one
            targets = [f"{module}.{alias.name}" if f"{module}.{alias.name}" in known else module for alias in node.names]
        else:
            continue
        found.update(target for target in targets if target in known and target != name)
    return found


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        state[node] = "done"
        stack.pop()
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_package_has_no_import_cycles():
    names = module_names()
    known = set(names)
    graph = {name: imported_modules(name, known) for name in names}
    # a package's __init__ re-exports its own modules; that edge is not a cycle with the modules' own imports
    for name in names:
        graph[name] = {dep for dep in graph[name] if not name.startswith(dep + ".")}
    assert find_cycle(graph) is None, f"import cycle: {' -> '.join(find_cycle(graph))}"


def test_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


# One interpreter loads the third-party libraries once (the slow part), then forks a child per package module that
# imports that module alone: each child starts with no minimind_trl module loaded, as a fresh interpreter would.
IMPORT_EACH_ALONE = """
import importlib, os, sys, traceback
import accelerate, datasets, peft, torch, transformers, trl  # noqa: F401
assert not [m for m in sys.modules if m.split(".")[0] == "minimind_trl"], "minimind_trl loaded too early"
failures = []
for name in sys.argv[1:]:
    pid = os.fork()
    if pid == 0:
        try:
            importlib.import_module(name)
        except BaseException:
            traceback.print_exc()
            os._exit(1)
        os._exit(0)
    if os.waitpid(pid, 0)[1] != 0:
        failures.append(name)
print("failed:", failures)
sys.exit(1 if failures else 0)
"""


def test_every_module_imports_alone():
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    result = subprocess.run(
        [sys.executable, "-c", IMPORT_EACH_ALONE, *module_names()], capture_output=True, text=True, env=env, timeout=600
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    assert "failed: []" in result.stdout


def test_trls_vllm_version_warning_is_shown_once_per_process():
    """TRL's "supports vLLM 0.22-0.31" warning comes once a run, not once per calling line (five). Run in a fresh
    interpreter: pytest resets the warning filters around each test."""
    import subprocess
    import sys

    script = (
        "import warnings, minimind_trl\n"
        "text = minimind_trl.TRL_VLLM_VERSION_WARNING + ' from 0.22.0 to 0.31.0. You have version 9.9.9 installed.'\n"
        "def one():\n    warnings.warn(text, stacklevel=2)\n"
        "def another():\n    warnings.warn(text, stacklevel=2)\n"
        "one()\nanother()\none()\n"  # three calling lines: Python's default filter would show it twice
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("TRL currently supports vLLM versions") == 1, result.stderr


def test_the_test_tree_has_one_conftest():
    """Test modules import `conftest` by name (`from conftest import SHARED`, rootdir imports): a second conftest.py
    under tests/ becomes the module of that name once pytest collects it, and every module collected after it fails
    to import (CI's whole suite stopped at collection so). Shared fixtures go in tests/conftest.py."""
    tests = Path(__file__).resolve().parent
    assert sorted(str(path.relative_to(tests)) for path in tests.rglob("conftest.py")) == ["conftest.py"]


def test_pyproject_lists_every_package_folder():
    # setuptools ships only the packages pyproject.toml lists; a folder left out imports from a checkout
    # (and an editable install) but is missing from a wheel.
    import tomllib

    root = Path(__file__).resolve().parents[1]
    listed = set(tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {".".join(init.parent.relative_to(root).parts) for init in (root / "minimind_trl").rglob("__init__.py")}
    missing = sorted(folders - listed)
    assert not missing, f"packages missing from pyproject.toml's [tool.setuptools] packages: {missing}"
