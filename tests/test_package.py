"""The package's shape: every module imports on its own in a fresh interpreter, and no two modules import each
other (directly or through others), counting imports inside functions too."""

import ast
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

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


@pytest.mark.slow
def test_every_module_imports_alone_in_a_fresh_interpreter():
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")

    def import_alone(name):
        result = subprocess.run(
            [sys.executable, "-c", f"import {name}"], capture_output=True, text=True, env=env, timeout=300
        )
        return name, result.returncode, result.stderr[-2000:]

    with ThreadPoolExecutor(max_workers=2) as pool:
        failures = [(name, err) for name, rc, err in pool.map(import_alone, module_names()) if rc != 0]
    assert not failures, failures
