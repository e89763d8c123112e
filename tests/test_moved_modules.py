"""Former module names (an earlier layout) still import, as the same module, with a warning naming the new home:
Python code and recipes written against the old layout keep working (minimind_trl/moved_modules.py)."""

import importlib
import sys
import warnings
from pathlib import Path

import pytest

import minimind_trl  # noqa: F401  (installs the finder)
from minimind_trl.loading_utils import import_function
from minimind_trl.moved_modules import MOVED


@pytest.mark.parametrize("old, new", sorted(MOVED.items()))
def test_a_former_name_is_the_moved_module_and_warns(old, new):
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=rf"{old} moved to {new}"):
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)
    assert importlib.util.find_spec(new).origin == module.__file__  # the new home is a real file, not an alias


def test_nothing_is_left_at_a_former_name():
    # An old file left behind would shadow the move (and split a registry in two).
    for old in MOVED:
        parent, _, leaf = old.rpartition(".")
        folders = [Path(folder) for folder in importlib.import_module(parent).__path__]
        assert not any((folder / f"{leaf}.py").exists() for folder in folders), old


def test_a_recipe_naming_a_former_module_still_resolves():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sys.modules.pop("minimind_trl.trainer.advantages", None)
        function = import_function("minimind_trl.trainer.advantages:minimind_advantages", "advantage_estimator")
    from minimind_trl.trainer import minimind_advantages

    assert function is minimind_advantages
    assert any(issubclass(w.category, DeprecationWarning) for w in caught)
