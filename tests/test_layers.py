"""The import layering of `minimind_trl/` (docs/architecture.md#layers): no module imports one on a higher floor,
except the climbs that page lists with a reason. The floors and the exceptions are read from the doc, so the
page a newcomer reads is the rule the suite enforces."""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "minimind_trl"
ARCHITECTURE = ROOT / "docs" / "architecture.md"


def section(text: str, title: str) -> str:
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, flags=re.M | re.S)
    assert match, f"docs/architecture.md has no '## {title}' section"
    return match.group(1)


def table_rows(text: str) -> list[list[str]]:
    """The body rows of every markdown table in `text`, cells stripped (header and rule rows left out)."""
    rows, previous = [], ""
    for line in text.splitlines():
        if line.startswith("|") and not re.fullmatch(r"\|[-| ]+\|", line) and previous.startswith("|"):
            rows.append([cell.strip() for cell in line.strip("|").split("|")])
        previous = line if line.startswith("|") else ""
    return rows


def names(cell: str) -> list[str]:
    return re.findall(r"`([\w.]+)`", cell)


def documented_layers(text: str) -> tuple[dict[str, int], set[tuple[str, str]]]:
    """{module prefix: floor} and the allowed climbs {(importer, imported)} from docs/architecture.md."""
    layers, climbs = {}, set()
    for row in table_rows(section(text, "Layers")):
        if row[0].isdigit():
            for name in names(row[1]):
                assert name not in layers, f"{name} is placed on two floors"
                layers[name] = int(row[0])
        else:
            (importer,), (imported,) = names(row[0]), names(row[1])
            assert row[2], f"the climb {importer} -> {imported} needs its reason"
            climbs.add((importer, imported))
    return layers, climbs


def modules(package: Path) -> dict[str, Path]:
    """{dotted name relative to the package ('' for its __init__): file}."""
    found = {}
    for path in package.rglob("*.py"):
        parts = path.relative_to(package).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def floor(module: str, layers: dict[str, int]) -> int | None:
    """The floor of the most specific prefix of `module` the table names."""
    parts = module.split(".")
    for end in range(len(parts), 0, -1):
        if ".".join(parts[:end]) in layers:
            return layers[".".join(parts[:end])]
    return None


def imports(module: str, path: Path, known: dict[str, Path]) -> list[tuple[str, int]]:
    """(imported module of this package, line) for every import in `path`, lazy ones included."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package.split(".") if package else []
            base = base[: len(base) - node.level + 1] if node.level > 1 else base
            target = ".".join(base + ([node.module] if node.module else []))
            candidates = [f"{target}.{alias.name}".strip(".") for alias in node.names] + [target]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("minimind_trl"):
            target = node.module.removeprefix("minimind_trl").strip(".")
            candidates = [f"{target}.{alias.name}".strip(".") for alias in node.names] + [target]
        elif isinstance(node, ast.Import):
            candidates = [a.name.removeprefix("minimind_trl").strip(".") for a in node.names
                          if a.name.startswith("minimind_trl")]  # fmt: skip
        else:
            continue
        for candidate in candidates:
            if candidate in known:
                found.append((candidate, node.lineno))
                break
    return found


def climbs(package: Path, layers: dict[str, int]) -> tuple[set[tuple[str, str]], list[str]]:
    """The imports of `package` that go up a floor ({(importer, imported)}) and the modules with no floor."""
    known = modules(package)
    unplaced = sorted(name for name in known if name and floor(name, layers) is None)
    up = set()
    for module, path in known.items():
        if not module:
            continue  # the package's __init__: registration, outside the floors
        for imported, _line in imports(module, path, known):
            if imported and floor(module, layers) is not None and floor(imported, layers) is not None:
                if floor(imported, layers) > floor(module, layers):
                    up.add((module, imported))
    return up, unplaced


def test_every_module_is_placed_and_no_import_climbs_but_the_listed_ones():
    layers, allowed = documented_layers(ARCHITECTURE.read_text())
    up, unplaced = climbs(PACKAGE, layers)
    assert not unplaced, f"modules docs/architecture.md#layers does not place: {unplaced}"
    unlisted = sorted(up - allowed)
    assert not unlisted, "imports that climb a floor, not listed with a reason in docs/architecture.md#layers:\n" + (
        "\n".join(f"  {a} -> {b}" for a, b in unlisted)
    )
    assert not allowed - up, f"listed climbs that no longer happen (remove them from the doc): {sorted(allowed - up)}"


@pytest.mark.parametrize(
    "source, climbs_up",
    [
        ("from ..cli.recipe import parse_recipe\n", True),  # relative, two levels up
        ("def f():\n    from minimind_trl.cli import recipe\n", True),  # lazy, absolute
        ("import minimind_trl.cli.recipe\n", True),
        ("from ..errors import RecipeError\n", False),  # down a floor
        ("from .sibling import x\n", False),  # same package
    ],
)
def test_the_check_sees_every_form_of_import(tmp_path, source, climbs_up):
    """A toy package shaped like ours: `rewards/probe.py` (floor 3) importing the forms a module can use."""
    package = tmp_path / "minimind_trl"
    for name in ("cli/recipe.py", "errors.py", "rewards/sibling.py", "rewards/__init__.py", "cli/__init__.py"):
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_text("x = 1\n")
    (package / "rewards" / "probe.py").write_text(source)
    up, unplaced = climbs(package, {"errors": 0, "rewards": 3, "cli": 6})
    assert not unplaced
    assert (("rewards.probe", "cli.recipe") in up) is climbs_up
