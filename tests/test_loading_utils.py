"""`minimind_trl.loading_utils`' name resolution: a recipe's `module:function` written with a moved module's old name
keeps resolving, to the moved module, with a DeprecationWarning naming the new name."""

import importlib
import importlib.util
import warnings

import pytest

from minimind_trl.loading_utils import MOVED_MODULES, import_function, import_object


@pytest.mark.parametrize("old, new", sorted(MOVED_MODULES.items()))
def test_every_moved_module_is_gone_from_its_old_name_and_imports_from_its_new_one(old, new):
    assert importlib.util.find_spec(old) is None, f"{old} still exists: it has not moved"
    importlib.import_module(new)


def test_an_old_name_in_a_recipe_resolves_to_the_moved_function_with_a_deprecation_warning():
    from minimind_trl.demos.reward_model import in_question_language

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
