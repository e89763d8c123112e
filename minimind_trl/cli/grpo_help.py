"""How `minimind-trl grpo --help` reads: what the command does and `--config` first, then every key a recipe may hold,
minimind-trl's own settings apart from TRL's (HfArgumentParser lists the fields of each dataclass in one run).

`make_parser` (`recipe`) builds the parser without the trainer, so the help costs what TRL's own `trl grpo --help`
does (benchmarks/cli_help.py).
"""

import argparse
import dataclasses

USAGE = "minimind-trl grpo --config RECIPE.yaml [--KEY VALUE ...]"
DESCRIPTION = (
    "GRPO training of a MiniMind (a save_pretrained folder, a Hub id or a native .pth) from a recipe: a YAML of the "
    "settings below, each overridable on the command line as --KEY VALUE (`--KEY null` unsets an optional one). "
    "Shipped recipes: {recipes} (docs/training.md)."
)
CONFIG_HELP = (
    "the recipe: a YAML of these settings, as given or under the packaged recipes/ (e.g. minimind2/grpo/reasoning); "
    "the command line overrides it"
)


def lay_out_help(parser, recipes: list[str]) -> None:
    """The usage and description (naming the shipped `recipes`), `--config` listed first, the settings grouped."""
    from trl import GRPOConfig, ModelConfig, ScriptArguments

    from ..trainer.grpo_config import MiniMindGRPOConfig
    from .script_args import GRPOScriptArguments

    parser.usage = USAGE
    parser.description = DESCRIPTION.format(recipes=", ".join(recipes))
    # TrlParser takes `--config PATH` out of the arguments before parsing; declared here so --help lists it first
    parser.add_argument("--config", metavar="RECIPE.yaml", default=argparse.SUPPRESS, help=CONFIG_HELP)
    group_settings(parser, [
        ("minimind-trl: data, rewards and rollouts", GRPOScriptArguments, ScriptArguments),
        ("minimind-trl: training", MiniMindGRPOConfig, GRPOConfig),
        ("TRL ScriptArguments: the dataset", ScriptArguments, None),
        ("TRL GRPOConfig and transformers TrainingArguments", GRPOConfig, None),
        ("TRL ModelConfig: loading the policy, LoRA", ModelConfig, None),
    ])  # fmt: skip


def group_settings(parser, groups) -> None:
    """Move each setting's flags from the parser's one list into the first group whose dataclass has the field and
    whose base (when given) has not: minimind-trl's own settings apart from TRL's, in `groups`' order."""
    titled = [(parser.add_argument_group(title), set(fields_of(own)) - set(fields_of(base) if base else ())) for
              title, own, base in groups]  # fmt: skip
    options = parser._optionals  # argparse's "options" group: -h, --config and, as HfArgumentParser adds them, all
    for action in list(options._group_actions):
        group = next((group for group, names in titled if action.dest in names), None)
        if group is not None:
            options._group_actions.remove(action)
            group._group_actions.append(action)


def fields_of(dataclass_type) -> list[str]:
    return [item.name for item in dataclasses.fields(dataclass_type) if item.init]


__all__ = ["lay_out_help"]
