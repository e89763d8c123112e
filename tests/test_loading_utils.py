"""`minimind_trl.loading_utils`' name resolution: a recipe's `module:function` written with a moved module's old name
keeps resolving, to the moved module, with a DeprecationWarning naming the new name (the table of moves and the
old names as Python imports: tests/test_moved_modules.py)."""

import importlib
import sys
import warnings

import pytest

from minimind_trl.loading_utils import import_function, import_object


def test_an_old_name_in_a_recipe_resolves_to_the_moved_function_with_a_deprecation_warning(monkeypatch):
    from minimind_trl.demos.reward_model import in_question_language

    # The warning comes with the old name's first import in a process, as any deprecated module's does: start from
    # a process that has not imported it yet, whichever tests ran before in this one.
    for old_name in ("minimind_trl.cli.demo_reward_model", "minimind_trl.cli.demo_variants"):
        monkeypatch.delitem(sys.modules, old_name, raising=False)

    with pytest.warns(DeprecationWarning, match=r"minimind_trl\.demos\.reward_model"):
        func = import_function("minimind_trl.cli.demo_reward_model:in_question_language", "reward function")
    assert func is in_question_language
    with pytest.warns(DeprecationWarning, match=r"minimind_trl\.demos\.variants"):
        assert import_object("minimind_trl.cli.demo_variants.VARIANTS", "variants") is importlib.import_module(
            "minimind_trl.demos.variants"
        ).VARIANTS


def test_the_new_name_resolves_without_a_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        func = import_function("minimind_trl.demos.reward_model:in_question_language", "reward function")
    assert func.__module__ == "minimind_trl.demos.reward_model"
