"""TRL's private members behind one adapter (`trainer/trl_private.py`): the table holds against the
installed TRL and transformers, a changed member is named in one clear error, and no private member of TRL's is
used in the package without being listed."""

import ast
import functools
import inspect
import re
from dataclasses import replace
from pathlib import Path

import pytest
import transformers
import trl

from minimind_trl.trainer.trl_private import (
    GRPO,
    PRIVATE_MEMBERS,
    PrivateMember,
    TRLPrivateMemberChanged,
    check_trl_private,
    generate_single_turn,
)

PACKAGE = Path(__file__).resolve().parents[2] / "minimind_trl"
ADAPTER = PACKAGE / "trainer" / "trl_private.py"


def test_the_table_holds_for_the_installed_trl():
    check_trl_private()


def member(name: str) -> PrivateMember:
    (found,) = [m for m in PRIVATE_MEMBERS if m.name == name]
    return found


@pytest.mark.parametrize(
    ("changed", "what"),
    [
        (replace(member("_generate_single_turn"), name="_generate_one_turn"), "it no longer exists"),
        (replace(member("_generate_single_turn"), parameters=("prompt_ids", "multimodal_fields")),
         r"its leading parameters are \(prompt_ids, images\), we rely on \(prompt_ids, multimodal_fields\)"),
        (replace(member("_get_per_token_logps_and_entropies"), keywords=("want_entropy",)),
         "it has no parameter want_entropy"),
        (replace(member("_metrics"), name="_metric_buffers"), r"no longer set by the class \(no `self._metric_buffers =`"),
        (replace(member("_save_checkpoint"), name="_save_ckpt"), "it no longer exists"),
        (replace(member("add_fused_lm_head"), name="add_fused_head"), "it no longer exists"),
        (replace(member("LLM"), name="AsyncLLMEngine"), "the module no longer defines it"),
        (replace(member("_compile_all_devices"), name="_compile_everywhere"), "it no longer exists"),
    ],
)
def test_a_changed_member_is_named_with_its_class_the_version_and_what_changed(changed, what):
    with pytest.raises(TRLPrivateMemberChanged) as raised:
        check_trl_private((*PRIVATE_MEMBERS, changed))
    message = str(raised.value)
    assert f"{changed.owner}.{changed.name} ({changed.kind}" in message
    assert f"TRL {trl.__version__}, transformers {transformers.__version__}" in message
    assert re.search(what, message), message
    kinds = (" (method", " (attribute", " (module", " (class attribute")
    assert sum(message.count(kind) for kind in kinds) == 1  # only it


@functools.cache
def trl_private_names() -> frozenset[str]:
    """Every private (one leading underscore) name of TRL's GRPOTrainer and the transformers classes under it:
    members of the class and attributes its `__init__` and methods set on `self`."""
    classes = [cls for cls in trl.GRPOTrainer.__mro__ if cls.__module__.split(".")[0] in ("trl", "transformers")]
    names = {name for name in dir(trl.GRPOTrainer) if name.startswith("_") and not name.startswith("__")}
    for cls in classes:
        names |= set(re.findall(r"\bself\.(_[a-z][A-Za-z0-9_]*)\s*(?::[^=\n]+)?=[^=]", inspect.getsource(cls)))
    return frozenset(names)


TRAINER_CLASSES = {"GRPOTrainer", "Trainer", "CheckpointedTraining", "MiniMindGRPOTrainer"}  # and their subclasses


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_names_used(path: Path) -> dict[str, int]:
    """The private names used on TRL objects in `path`, with their first line: in a class built on TRL's trainer
    (its bases name one of `TRAINER_CLASSES`), what it defines or assigns in its body and its `self._x` and
    `super()._x`; anywhere, `<something trainer>._x` (`trainer._metrics`, `trainer_class._generate_single_turn`)."""
    used = {}
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and {ast.unparse(base).split(".")[-1] for base in node.bases} & TRAINER_CLASSES:
            for statement in node.body:
                if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    used.setdefault(statement.name, statement.lineno)
                elif isinstance(statement, (ast.Assign, ast.AnnAssign)):
                    targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
                    for target in targets:
                        if isinstance(target, ast.Name):
                            used.setdefault(target.id, statement.lineno)
            for inner in ast.walk(node):
                if isinstance(inner, ast.Attribute) and ast.unparse(inner.value) in ("self", "super()"):
                    used.setdefault(inner.attr, inner.lineno)
        elif isinstance(node, ast.Attribute) and "trainer" in ast.unparse(node.value).lower():
            used.setdefault(node.attr, node.lineno)
    return {name: line for name, line in used.items() if _private(name)}


def unlisted_uses(paths) -> list[str]:
    """`path:line name` for each private name of TRL's used in `paths` and missing from the table."""
    listed = {m.name for m in PRIVATE_MEMBERS}
    owned = trl_private_names()
    return [
        f"{path.name}:{line} {name}"
        for path in paths
        for name, line in private_names_used(path).items()
        if name in owned and name not in listed
    ]


def package_files() -> list[Path]:
    return [path for path in sorted(PACKAGE.rglob("*.py")) if path != ADAPTER]


def test_every_private_member_of_trl_the_package_uses_is_in_the_table():
    unlisted = unlisted_uses(package_files())
    assert not unlisted, f"TRL private members used but not listed in trl_private.PRIVATE_MEMBERS: {unlisted}"


def swapped_trl_functions(path: Path) -> dict[str, int]:
    """What `path` assigns on a TRL module (`_trl_grpo.add_fused_lm_head = ...`): a module of TRL's imported with
    `from trl... import module` or `import trl...`, anywhere in the file (function-level imports too)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    modules = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "trl":
            modules |= {alias.asname or alias.name for alias in node.names}
        elif isinstance(node, ast.Import):
            modules |= {alias.asname or alias.name for alias in node.names if alias.name.split(".")[0] == "trl"}
    swapped = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                for element in target.elts if isinstance(target, ast.Tuple) else [target]:
                    if isinstance(element, ast.Attribute) and ast.unparse(element.value) in modules:
                        swapped.setdefault(element.attr, node.lineno)
    return swapped


def test_every_function_swapped_in_a_trl_module_is_in_the_table():
    listed = {m.name for m in PRIVATE_MEMBERS if m.kind.startswith("module")}
    swapped = {f"{path.name}:{line} {name}" for path in package_files()
               for name, line in swapped_trl_functions(path).items() if name not in listed}
    assert not swapped, f"functions of TRL's modules swapped but not listed in trl_private.PRIVATE_MEMBERS: {swapped}"
    assert {"add_fused_lm_head", "LLM"} <= set().union(*(swapped_trl_functions(p) for p in package_files()))


def test_an_unlisted_private_use_is_reported(tmp_path):
    """What the test above would say for a new private use: the file, the line and the name."""
    new_use = tmp_path / "new_use.py"
    new_use.write_text("def f(trainer, kernel):\n    return trainer._metrics, trainer._prepare_inputs(None), kernel._step\n")
    assert unlisted_uses([new_use]) == ["new_use.py:2 _prepare_inputs"]


def test_the_table_lists_only_members_the_package_uses():
    used = set().union(*(private_names_used(path) for path in [*package_files(), ADAPTER]))  # its accessors too
    text = "\n".join(path.read_text(encoding="utf-8") for path in [*package_files(), ADAPTER])
    stale = [m.name for m in PRIVATE_MEMBERS if m.name not in used and not re.search(rf"\.{m.name}\b", text)]
    assert not stale, f"listed in trl_private.PRIVATE_MEMBERS but no longer used: {stale}"


def test_generate_single_turn_passes_trls_parameters_by_name():
    seen = {}

    class Trainer:
        def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
            seen.update(prompt_ids=prompt_ids, images=images, fields=multimodal_fields, n=num_generations)
            return [[1]] * len(prompt_ids), None

    assert generate_single_turn(Trainer(), [[5, 6], [7]]) == ([[1], [1]], None)
    assert seen == {"prompt_ids": [[5, 6], [7]], "images": None, "fields": {}, "n": 1}
    assert list(inspect.signature(trl.GRPOTrainer._generate_single_turn).parameters)[1:5] == [
        "prompt_ids", "images", "multimodal_fields", "num_generations"]
    assert member("_generate_single_turn").owner == GRPO
