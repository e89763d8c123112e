"""Modules small enough to read in one sitting: none of `minimind_trl/` over ~450 lines, a modeling file (the
self-contained model a saved folder ships) over ~700. A module that grows past its limit is split by
responsibility (docs/architecture.md)."""

from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "minimind_trl"
LIMIT, MODELING_LIMIT = 450, 700


def limit(path: Path) -> int:
    return MODELING_LIMIT if path.name.startswith("modeling_") else LIMIT


def oversized(package: Path) -> list[str]:
    sizes = {path: len(path.read_text(encoding="utf-8").splitlines()) for path in sorted(package.rglob("*.py"))}
    return [f"{path.relative_to(package)}: {n} lines (limit {limit(path)})" for path, n in sizes.items() if n > limit(path)]


def test_no_module_is_over_its_limit():
    assert not oversized(PACKAGE), "split these by responsibility:\n" + "\n".join(oversized(PACKAGE))


@pytest.mark.parametrize("name, lines, over", [("trainer.py", 451, True), ("trainer.py", 450, False),
                                               ("modeling_x.py", 701, True), ("modeling_x.py", 700, False)])
def test_the_check_counts_lines_against_each_files_limit(tmp_path, name, lines, over):
    (tmp_path / name).write_text("x = 1\n" * lines)
    assert bool(oversized(tmp_path)) is over
