"""Stage 1 of `minimind-trl grpo`: the recipe. A YAML of arguments plus command-line overrides, parsed by TRL's
`TrlParser` over `GRPOScriptArguments`, `MiniMindGRPOConfig` and TRL's `ModelConfig`.

The YAML gives defaults, the command line overrides them, and an unknown key in either is an error naming the
file, line and the closest valid key. Recipes resolve as given or relative to the packaged `recipes/`.
"""

import difflib
import logging
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import RecipeError
from ..trainer.checks.config_ranges import NAMED_VALUES, RANGES, check_ranges, range_problem
from .grpo_help import lay_out_help
from .options import check_refused_options, check_refused_value, field_defaults
from .script_args import GRPOScriptArguments

REPO_RECIPES = Path(__file__).resolve().parents[2] / "recipes"
logger = logging.getLogger(__name__)


@dataclass
class Recipe:
    """The recipe a run was parsed from (for the model card)."""

    path: str | None = None
    text: str | None = None
    overrides: list[str] = field(default_factory=list)


def make_parser():
    from trl import ModelConfig, TrlParser

    from ..trainer.grpo_config import MiniMindGRPOConfig

    class Parser(TrlParser):
        def error(self, message):  # argparse would print the usage of ~300 options first
            raise RecipeError(f"{message} (minimind-trl grpo --help lists the options)")

        def parse_args_into_dataclasses(self, args=None, **kwargs):
            args = list(sys.argv[1:] if args is None else args)
            check_list_flags_given_once(args, list_keys(self))
            # after TrlParser set the recipe's values as defaults: `--key null` sets the default to None
            args, nulled = null_overrides(args, nullable_keys(self))
            if nulled:
                self.set_defaults(**dict.fromkeys(nulled))
            args = list_overrides(args, list_keys(self))
            return super().parse_args_into_dataclasses(args=args, **kwargs)

        def parse_known_args(self, args=None, namespace=None):
            namespace, remaining = super().parse_known_args(args, namespace)
            for action in self._actions:  # one item of a name-or-list flag stays the name it was (see take_lists)
                value = getattr(namespace, action.dest, None)
                given = isinstance(value, list) and value is not action.default  # not the recipe's own list
                if action.dest in name_or_list and given and len(value) == 1:
                    setattr(namespace, action.dest, value[0])
            return namespace, remaining

    parser = Parser((GRPOScriptArguments, MiniMindGRPOConfig, ModelConfig), prog="minimind-trl grpo")
    name_or_list = take_lists(parser)
    lay_out_help(parser, shipped_recipes())
    return parser


def packaged_recipes_dir() -> Path:
    """Recipes shipped in the wheel (`minimind_trl/recipes`), or the checkout's `recipes/`."""
    packaged = Path(__file__).resolve().parents[1] / "recipes"
    return packaged if packaged.is_dir() else REPO_RECIPES


def shipped_recipes() -> list[str]:
    """The upstream recipes shipped with the package (`minimind2/grpo/reasoning.yaml`, ...), as `--config` names
    them."""
    folder = packaged_recipes_dir()
    return sorted(str(path.relative_to(folder)) for path in folder.glob("minimind*/**/*.yaml"))


def resolve_recipe(path: str) -> str:
    """A recipe path as given, or relative to the packaged recipes (`minimind2/grpo/reasoning.yaml`)."""
    if os.path.isfile(path):
        return path
    relative = path.removeprefix("recipes/")
    candidates = [relative, relative + ".yaml"] if not relative.endswith(".yaml") else [relative]
    for candidate in candidates:
        packaged = packaged_recipes_dir() / candidate
        if packaged.is_file():
            return str(packaged)
    raise RecipeError(f"recipe not found: {path} (nor under {packaged_recipes_dir()})")


def check_recipe_keys(parser, path: str) -> str:
    """Reject keys no dataclass knows, naming the file, line and the closest valid key; returns the text."""
    import yaml

    text = Path(path).read_text(encoding="utf-8")
    try:
        node = yaml.compose(text)
    except yaml.YAMLError as exc:
        raise RecipeError(f"{path}: invalid YAML: {exc}") from exc
    if node is None or not isinstance(node, yaml.MappingNode):
        raise RecipeError(f"{path}: a recipe must be a YAML mapping of argument names to values")
    known = {action.dest for action in parser._actions} - {"help", "config"} | {"env"}
    types, defaults = field_types(parser), field_defaults(parser)
    seen: dict[str, int] = {}
    for key_node, value_node in node.value:
        key, line = key_node.value, key_node.start_mark.line + 1
        if key in seen:
            raise RecipeError(
                f"{path}:{line}: key {key!r} is given twice (lines {seen[key]} and {line}); YAML would silently keep "
                "the later one. Keep one."
            )
        seen[key] = line
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise RecipeError(f"{path}:{line}: unknown key {key!r}{hint}")
        if key in types:
            value = yaml.safe_load(yaml.serialize(value_node))
            problem = value_problem(key, value, types[key])
            if problem:
                raise RecipeError(f"{path}:{value_node.start_mark.line + 1}: {key}: {problem}")
            check_refused_value(key, value, defaults, where=f"{path}:{line}")  # before TRL's parsing: some fail raw
    return text


def check_override_ranges(argv: list[str]) -> None:
    """Numeric command-line overrides against their range (`config_ranges.RANGES`), naming the flag as typed
    (`--num_generations 0` would otherwise divide by zero while the arguments are parsed); their types are
    argparse's to check."""
    for index, arg in enumerate(argv[:-1]):
        name, _, inline = arg.removeprefix("--").partition("=")
        key = name.replace("-", "_")
        if not arg.startswith("--") or key not in RANGES:
            continue
        raw = inline or argv[index + 1]
        problem = range_problem(key, raw)
        if problem is not None:
            raise RecipeError(f"--{name} {raw}: {problem}")


def dict_keys(parser) -> set[str]:
    """The keys whose field takes a dict (`loss_kwargs`, `lr_scheduler_kwargs`, ...): JSON on the command line."""
    import typing

    return {
        key for key, annotation in field_types(parser).items()
        if any(arg is dict or typing.get_origin(arg) is dict for arg in (annotation, *typing.get_args(annotation)))
    }  # fmt: skip


def check_override_json(argv: list[str], keys: set[str]) -> None:
    """A dict setting's command-line value that starts with `{` is JSON (transformers reads it with `json.loads`),
    refused naming the flag as typed when it is not (`--loss_kwargs '{coef: 0.1}'`: YAML's form, a raw
    `JSONDecodeError` before)."""
    import json

    for index, arg in enumerate(argv):
        name, equals, inline = arg.removeprefix("--").partition("=")
        if not arg.startswith("--") or name.replace("-", "_") not in keys:
            continue
        raw = inline if equals else (argv[index + 1] if index + 1 < len(argv) else "")
        if raw.startswith("{"):
            try:
                json.loads(raw)
            except ValueError as exc:
                raise RecipeError(
                    f"--{name} {raw}: not JSON ({exc}); write it as --{name} '{{\"key\": 0.5}}' (keys and strings in "
                    "double quotes, the whole value quoted for the shell)"
                ) from None


NULL_WORDS = ("null", "none", "~")  # YAML's null spellings (and Python's None), case-insensitive
NULL_MEANINGFUL = {"report_to", *NAMED_VALUES}  # fields where the string "none" has its own meaning


def nullable_keys(parser) -> set[str]:
    """The keys whose field may be None (type `X | None`), but for those where "none" is a value of its own."""
    import types as pytypes
    import typing

    return {
        key for key, annotation in field_types(parser).items()
        if typing.get_origin(annotation) in (typing.Union, pytypes.UnionType)
        and type(None) in typing.get_args(annotation) and key not in NULL_MEANINGFUL
    }  # fmt: skip


def null_overrides(argv: list[str], nullable: set[str]) -> tuple[list[str], list[str]]:
    """`argv` without the `--key null` / `--key=null` / `--key none` of nullable keys, and those keys: on the command
    line they mean None, as `key: null` does in the YAML (`--reward_model_name_or_path null` unsets the recipe's
    path)."""
    kept, nulled, index = [], [], 0
    while index < len(argv):
        arg = argv[index]
        name, equals, inline = arg.removeprefix("--").partition("=")
        key = name.replace("-", "_")
        if arg.startswith("--") and key in nullable:
            value = inline if equals else (argv[index + 1] if index + 1 < len(argv) else None)
            ends = equals or index + 2 >= len(argv) or argv[index + 2].startswith("--")
            if value is not None and value.strip().lower() in NULL_WORDS and ends:
                nulled.append(key)
                index += 1 if equals else 2
                continue
        kept.append(arg)
        index += 1
    return kept, nulled


def take_lists(parser) -> set[str]:
    """Give the flags of fields that hold a name or a list of names (`report_to`, `optim_target_modules`: `str |
    list[str]`, which transformers' parser reads as one string) the list flags' forms, and return their keys. One
    item stays the string it was: a string and a list of one can mean different things (`optim_target_modules`)."""
    import typing

    keys = set()
    for action in parser._actions:
        args = typing.get_args(field_types(parser).get(action.dest))
        if action.nargs is None and str in args and list[str] in args:
            action.nargs = "+"
            keys.add(action.dest)
    return keys


def list_keys(parser) -> set[str]:
    """The keys whose flag takes a list: `list[...]` fields (`--reward_funcs`, `--agent_tools`, `--reward_weights`,
    `--lora_target_modules`, ...) and those of a name or a list (`--report_to`, see `take_lists`)."""
    return {action.dest for action in parser._actions if action.nargs in ("+", "*")}


LIST_FORMS = "--{flag} a b (space-separated), --{flag} a,b or --{flag} '[a, b]' (a YAML list, as in a recipe)"


def check_list_flags_given_once(argv: list[str], keys: set[str]) -> None:
    """Refuse a list flag given twice (either spelling): argparse would keep the last list and drop the first
    without a word, where `--agent_tools a --agent_tools b` reads as both."""
    seen: dict[str, str] = {}
    for arg in argv:
        flag = arg.partition("=")[0]
        key = flag.removeprefix("--").replace("-", "_")
        if not arg.startswith("--") or key not in keys:
            continue
        if key in seen:
            spellings = f" (as {seen[key]} and {flag})" if seen[key] != flag else ""
            raise RecipeError(
                f"{flag} is given twice{spellings}: a list flag takes all its items at once (argparse would keep the "
                f"last and drop the first); give it once, as {LIST_FORMS.format(flag=flag.removeprefix('--'))}"
            )
        seen[key] = flag


def list_overrides(argv: list[str], keys: set[str]) -> list[str]:
    """`argv` with the value of each list flag as separate words: `--agent_tools '[mytools:f, other:g]'` (a YAML
    flow list, as the recipe writes it; also unquoted, split by the shell), `--agent_tools mytools:f,other:g` and
    `--agent_tools=mytools:f` all become `--agent_tools mytools:f other:g`, the form argparse reads (TRL's parser
    takes a list field's items as separate words and would keep `[mytools:f]` as one name). An item that itself
    holds a comma is quoted inside the brackets (`'["a,b"]'`). A value that is none of these is a `RecipeError`
    naming the flag and the forms it takes."""
    expanded, index = [], 0
    while index < len(argv):
        arg = argv[index]
        name, equals, inline = arg.removeprefix("--").partition("=")
        index += 1
        if not arg.startswith("--") or name.replace("-", "_") not in keys:
            expanded.append(arg)
            continue
        words = [inline] if equals else []
        while not equals and index < len(argv) and not argv[index].startswith("--"):
            words.append(argv[index])
            index += 1
        expanded += [f"--{name}", *list_items(name, words)] if words else [arg]  # no value: argparse says so
    return expanded


def list_items(flag: str, words: list[str]) -> list[str]:
    """The items of a list flag's value (see `list_overrides`), each as typed."""
    import yaml

    text = " ".join(words)
    forms = LIST_FORMS.format(flag=flag)
    if text.lstrip().startswith("["):
        try:
            node = yaml.compose(text)
        except yaml.YAMLError as exc:
            problem = str(exc).splitlines()[0]
            raise RecipeError(f"--{flag} {text}: not a list ({problem}); write it as {forms}") from None
        if not isinstance(node, yaml.SequenceNode) or not all(isinstance(item, yaml.ScalarNode) for item in node.value):
            raise RecipeError(f"--{flag} {text}: expected a list of names or numbers; write it as {forms}")
        items = [item.value for item in node.value]
    else:
        items = [part.strip() for word in words for part in word.split(",")]
    if not items:
        raise RecipeError(f"--{flag} {text}: an empty list; leave the flag out (or give null where it may be unset)")
    if not all(items):
        raise RecipeError(f"--{flag} {text}: an empty item (two commas, or one at an end); write it as {forms}")
    return items


def field_types(parser) -> dict:
    """Recipe key -> the annotated type of its dataclass field."""
    import typing

    types = {}
    for dataclass_type in parser.dataclass_types:
        types.update(typing.get_type_hints(dataclass_type))
    return types


def value_problem(key: str, value, annotation) -> str | None:
    """What is wrong with a YAML value for a field of type `annotation` (None when nothing is)."""
    import types as pytypes
    import typing

    args = typing.get_args(annotation) if typing.get_origin(annotation) in (typing.Union, pytypes.UnionType) else ()
    allowed = [arg for arg in args if arg is not type(None)] if args else [annotation]
    if value is None:
        return None if type(None) in args else "needs a value (it cannot be empty/null)"
    if len(allowed) != 1:
        return None  # e.g. `dict | str`: left to the parser
    kind = typing.get_origin(allowed[0]) or allowed[0]
    if kind is list:
        return None if isinstance(value, list) else f"expected a list (e.g. [{value}]), got {value!r}"
    if kind is bool:
        words = ("true", "false", "yes", "no", "1", "0")
        ok = isinstance(value, bool) or (isinstance(value, str) and value.lower() in words)
        return None if ok else f"expected true or false, got {value!r}"
    if kind in (int, float):
        if isinstance(value, str):
            try:
                value = kind(value)
            except ValueError:
                return f"expected {'an integer' if kind is int else 'a number'}, got {value!r}"
        wrong_kind = kind is int and not isinstance(value, int)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or wrong_kind:
            return f"expected {'an integer' if kind is int else 'a number'}, got {value!r}"
        return range_problem(key, value)
    return None


def parse_args(argv: list[str] | None = None):
    """Command line (with `--config RECIPE.yaml`) -> (script_args, training_args, model_args, recipe)."""
    argv = _split_config_flag(list(sys.argv[1:] if argv is None else argv))
    parser = make_parser()
    recipe = Recipe()
    if "--config" in argv:
        index = argv.index("--config")
        if index + 1 >= len(argv):
            raise RecipeError("--config needs a recipe path")
        argv[index + 1] = resolve_recipe(argv[index + 1])
        recipe.path = argv[index + 1]
        recipe.text = check_recipe_keys(parser, recipe.path)
        recipe.overrides = argv[:index] + argv[index + 2 :]
    else:
        recipe.overrides = list(argv)
    check_override_ranges(recipe.overrides)
    check_override_json(recipe.overrides, dict_keys(parser))
    try:
        script_args, training_args, model_args = parser.parse_args_and_config(argv)
    except ValueError as exc:  # unknown command-line arguments, dataclass validation (e.g. batch divisibility)
        where = f" ({recipe.path})" if recipe.path else ""
        raise RecipeError(f"invalid arguments{where}: {exc}{_process_hint(exc)}{_cpu_hint(exc)}") from exc
    check_ranges(model_args)  # TRL's ModelConfig (lora_r, lora_alpha, lora_dropout) checks none of its numbers
    check_refused_options(parser, (script_args, training_args, model_args))  # options nothing here would act on
    drop_reward_model_rewards(script_args, training_args, recipe)
    return script_args, training_args, model_args, recipe


def given_flags(argv: list[str]) -> set[str]:
    """The keys of the `--key` flags in `argv` (both spellings, with or without `=value`)."""
    return {arg.removeprefix("--").partition("=")[0].replace("-", "_") for arg in argv if arg.startswith("--")}


def drop_reward_model_rewards(script_args, training_args, recipe: Recipe) -> None:
    """`--reward_model_name_or_path null` runs the recipe without its reward model: the recipe's rewards that score
    with it become their rule-only form (`agent_reward` -> `agent_rule_reward`) or are dropped with their weights,
    and a note says which. Rewards given with `--reward_funcs` are taken as given (and checked as such)."""
    overrides = recipe.overrides
    if not null_overrides(overrides, {"reward_model_name_or_path"})[1] or "reward_funcs" in given_flags(overrides):
        return
    from ..agent import reward as _agent_rewards  # noqa: F401  (registers agent_reward and its rule-only form)
    from ..rewards.registry import without_reward_model

    names = list(script_args.reward_funcs or [])
    weights = training_args.reward_weights
    given_weights = "reward_weights" in given_flags(overrides)
    kept, kept_weights, changes = without_reward_model(names, None if given_weights else weights)
    if not changes:
        return
    source = recipe.path or "the recipe"
    if not kept:
        raise RecipeError(
            f"--reward_model_name_or_path null: {source} scores with the reward model alone (reward_funcs {names}), "
            "so nothing would be left to reward; name the run's rewards with --reward_funcs (docs/training.md#rewards)"
        )
    script_args.reward_funcs = kept
    if not given_weights:
        training_args.reward_weights = kept_weights
    logger.warning(
        "--reward_model_name_or_path null: %s runs without its reward model: %s; rewards now %s",
        source,
        ", ".join(changes),
        ", ".join(kept),
    )


def _split_config_flag(argv: list[str]) -> list[str]:
    """`--config=PATH` as `--config PATH`: TRL's parser only looks for the separate form."""
    return [part for arg in argv for part in (arg.split("=", 1) if arg.startswith("--config=") else [arg])]


def _cpu_hint(exc: Exception) -> str:
    if "doesn't support bf16" not in str(exc):
        return ""
    return (
        " [no GPU here: an explicit bf16 on CPU needs --use_cpu true; or leave bf16 unset to get this CPU's own "
        "choice (bf16 only where it is native, docs/cpu.md), or pass --bf16 false for upstream's own CPU numerics "
        "(its bf16 autocast does nothing on CPU)]"
    )


def _process_hint(exc: Exception) -> str:
    if "divisible" not in str(exc):
        return ""
    world_size = os.environ.get("WORLD_SIZE", "1")
    if "eval batch" in str(exc):
        return (
            f" [{world_size} process(es): the eval batch is per_device_eval_batch_size x processes completions and "
            "must hold whole groups of num_generations_eval (unset: num_generations)]"
        )
    return (
        f" [{world_size} process(es): the generation batch is per_device_train_batch_size x processes x "
        "steps_per_generation completions and must hold whole groups of num_generations]"
    )


def parse_recipe(recipe_path: str, overrides: dict | list[str] | None = None):
    """Programmatic `--config recipe_path` + overrides (`{"max_steps": 10}` or `["--max_steps", "10"]`)."""
    argv = ["--config", str(recipe_path)]
    if isinstance(overrides, dict):
        for key, value in overrides.items():
            argv.append(f"--{key}")
            argv += [str(item) for item in value] if isinstance(value, (list, tuple)) else [str(value)]
    elif overrides:
        argv += list(overrides)
    return parse_args(argv)


__all__ = ["Recipe", "RecipeError", "make_parser", "parse_args", "parse_recipe", "resolve_recipe"]
