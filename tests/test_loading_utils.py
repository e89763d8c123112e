"""`minimind_trl.loading_utils.import_object`, the one resolver of every `module:function` a recipe names: a name
that is no Python import path, a module that is missing, that raises or ends the process at import, a missing name
in it, each is one error line naming the key and the value (tests/cli/test_input_checks.py runs every recipe key
that takes such a name through the command)."""

import sys

import pytest

from minimind_trl.errors import MiniMindTRLError
from minimind_trl.loading_utils import import_function, import_object, is_import_spec

# module name -> its source: what a user's module can do at import
MODULES = {
    "names_fine": "def f(x):\n    return x\n",
    "names_exits": "import sys\nsys.exit(3)\n",
    "names_exits_zero": "import sys\n\nsys.exit()\n",
    "names_interrupted": "raise KeyboardInterrupt\n",
    "names_raises": "def f(x):\n    return x\n\nraise RuntimeError('no GPU here\\nsecond line')\n",
    "names_base_exception": "class Stop(BaseException):\n    pass\n\nraise Stop('stopped')\n",
    "names_getattr": "def __getattr__(name):\n    raise RuntimeError(f'lazy {name} failed')\n",
    "names_missing_dependency": "import names_no_such_dependency\n",
}


@pytest.fixture
def modules(tmp_path, monkeypatch):
    for name, source in MODULES.items():
        (tmp_path / f"{name}.py").write_text(source)
        monkeypatch.delitem(sys.modules, name, raising=False)
    (tmp_path / "names_pkg").mkdir()
    (tmp_path / "names_pkg" / "__init__.py").write_text("")
    (tmp_path / "names_pkg" / "inner.py").write_text("def g(x):\n    return x\n")
    monkeypatch.chdir(tmp_path)  # the working directory is importable, as in TRL's scripts


@pytest.mark.parametrize(
    "spec, problem",
    [
        (".names_fine:f", "a relative module name"),
        ("..names_fine:f", "a relative module name"),
        (".names_pkg.inner.g", "a relative module name"),
        ("../names_fine:f", "a file path, not a module name"),
        ("names_pkg/inner:g", "a file path, not a module name"),
        ("/abs/names_fine:f", "a file path, not a module name"),
        ("names_pkg\\inner:g", "a file path, not a module name"),
        ("names_fine.py:f", "a file path"),
        ("names_fine.py", "a file path"),
        ("names_fine:f:extra", "more than one ':'"),
        (":f", "the module or the name in it is missing"),
        ("names_fine:", "the module or the name in it is missing"),
        ("names_pkg..inner:g", "'names_pkg..inner' is not a dotted Python module name"),
        (" names_fine:f", "' names_fine' is not a dotted Python module name"),
        ("names_fine:f.x", "'f.x' is not a Python name"),
        ("names_fine:f ", "'f ' is not a Python name"),
        ("no_such_module_xyz:f", "cannot import module 'no_such_module_xyz': No module named 'no_such_module_xyz'"),
        ("names_missing_dependency:f", "No module named 'names_no_such_dependency'"),
        ("names_fine:g", "module 'names_fine' has no attribute 'g'"),
        ("names_exits:f", "importing module 'names_exits' called sys.exit(3) (names_exits.py, line 2)"),
        ("names_exits_zero:f", "module 'names_exits_zero' called sys.exit(None) (names_exits_zero.py, line 3)"),
        ("names_interrupted:f", "importing module 'names_interrupted' was interrupted by KeyboardInterrupt"),
        ("names_raises:f", "raised RuntimeError (names_raises.py, line 4): no GPU here second line"),
        ("names_base_exception:f", "raised Stop (names_base_exception.py, line 4): stopped"),
        ("names_getattr:f", "looking up 'f' in module 'names_getattr' raised RuntimeError"),
    ],
)  # fmt: skip
def test_each_bad_name_is_one_error_naming_the_key_and_the_value(modules, spec, problem):
    with pytest.raises(MiniMindTRLError) as caught:
        import_object(spec, "reward_funcs", form="package.module:function")
    message = str(caught.value)
    assert message.startswith(f"reward_funcs {spec!r}: ") and problem in message, message
    assert "\n" not in message


@pytest.mark.parametrize("value", [None, 3, ["names_fine:f"]])
def test_a_value_that_is_not_a_string_is_refused(value):
    with pytest.raises(MiniMindTRLError, match=r"^callbacks .*: expected a string 'package.module:name'$"):
        import_object(value, "callbacks")


def test_the_callers_error_class_carries_it(modules):
    class ToolError(MiniMindTRLError):
        pass

    with pytest.raises(ToolError, match="called sys.exit"):
        import_object("names_exits:f", "agent_tools", ToolError)


def test_good_names_resolve_in_both_forms(modules):
    assert import_function("names_fine:f", "loss_type")(5) == 5
    assert import_function("names_pkg.inner:g", "loss_type") is import_object("names_pkg.inner.g", "loss_type")
    assert is_import_spec("names_pkg.inner.g") and is_import_spec("m:f") and not is_import_spec("format")


def test_a_module_name_that_moved_in_its_package_is_named():
    """A name from an earlier layout is not resolved (nothing has been released): the error says where a module of
    that name lives now, found in the package itself, not in a table of moves."""
    spec = "minimind_trl.trainer.advantages:minimind_advantages"
    with pytest.raises(MiniMindTRLError) as caught:
        import_object(spec, "advantage_estimator")
    assert str(caught.value) == (
        f"advantage_estimator {spec!r}: cannot import module 'minimind_trl.trainer.advantages': No module named "
        "'minimind_trl.trainer.advantages' (did you mean 'minimind_trl.trainer.algorithm.advantages'?)"
    )
    with pytest.raises(MiniMindTRLError) as caught:  # a leaf found nowhere: no guess
        import_object("minimind_trl.cli.demo_reward_model:in_question_language", "reward_funcs")
    assert "did you mean" not in str(caught.value)
