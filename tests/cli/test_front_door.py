"""`minimind-trl`'s front door (`minimind_trl_cli`): the usage and every command's `--help` come from the command
table and the command's parser alone. A command that does not train answers `--help` without importing torch,
transformers, TRL or the package (the package's import registers MiniMind with transformers: seconds); `grpo --help`
imports no trainer. How long each takes is measured in benchmarks/cli_help.py, never asserted here."""

import argparse
import json
import subprocess
import sys
import textwrap

import pytest

from minimind_trl_cli import COMMANDS, answer_before_running

TRAINING_COMMANDS = {"grpo", "demo"}
HEAVY = ("torch", "transformers", "trl", "peft", "datasets", "minimind_trl")
PROBE = """
import atexit, json, sys
atexit.register(lambda: print(json.dumps(sorted(sys.modules)), file=sys.stderr))
sys.argv = ["minimind-trl", *{argv!r}]
from minimind_trl_cli import console
console()
"""


def run_front_door(*argv: str) -> tuple[subprocess.CompletedProcess, set[str]]:
    """The executable's entry in a fresh interpreter: its result and the modules it had imported when it exited."""
    code = textwrap.dedent(PROBE.format(argv=list(argv)))
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    return result, set(json.loads(result.stderr.strip().splitlines()[-1]))


def heavy(modules: set[str]) -> list[str]:
    return sorted(name for name in modules if name.split(".")[0] in HEAVY)


def test_every_command_that_does_not_train_declares_its_parser():
    light = [name for name in COMMANDS if name not in TRAINING_COMMANDS]
    assert {"convert", "export", "merge-lora"} <= set(light)
    for name in light:
        assert COMMANDS[name].parser is not None, f"{name}: name its parser in COMMANDS (minimind_trl_cli)"


LIGHT_HELP = [[], ["--help"], *([name, "--help"] for name in COMMANDS if name not in TRAINING_COMMANDS)]


@pytest.mark.parametrize("argv", LIGHT_HELP, ids=lambda argv: " ".join(argv) or "no arguments")
def test_help_of_what_does_not_train_imports_no_torch(argv):
    result, modules = run_front_door(*argv)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith(f"usage: minimind-trl {argv[0] if argv and argv[0] != '--help' else '<command>'}")
    assert not heavy(modules), heavy(modules)


def test_grpo_help_opens_with_the_command_and_its_recipe_and_imports_no_trainer():
    result, modules = run_front_door("grpo", "--config", "minimind2/grpo/reasoning.yaml", "--help")
    assert result.returncode == 0, result.stderr[-2000:]
    head, _, rest = result.stdout.partition("\nminimind-trl: data, rewards and rollouts:\n")
    assert head.startswith("usage: minimind-trl grpo --config RECIPE.yaml [--KEY VALUE ...]\n\nGRPO training")
    assert "--config RECIPE.yaml" in head.split("\noptions:\n")[1] and "minimind2/grpo/reasoning.yaml" in head
    titles = [line for line in rest.splitlines() if line and not line.startswith(" ")]
    assert titles == [
        "minimind-trl: training:", "TRL ScriptArguments: the dataset:",
        "TRL GRPOConfig and transformers TrainingArguments:", "TRL ModelConfig: loading the policy, LoRA:",
    ]  # fmt: skip
    assert "--reward_funcs" in rest.split("minimind-trl: training:")[0]  # ours, apart from TRL's
    assert "--advantage_estimator" in rest.split("TRL ScriptArguments")[0].split("minimind-trl: training:")[1]
    assert "--learning_rate" in rest.split("TRL GRPOConfig")[1] and "--dataset_name" in rest.split("TRL GRPOConfig")[0]
    assert "minimind_trl.trainer.grpo_trainer" not in modules and "datasets" not in modules


def option_problems(parser: argparse.ArgumentParser) -> list[str]:
    """Options without a help line, and options taking a value whose default (other than none) their help does not
    say (a flag's default is its absence)."""
    problems = []
    for action in parser._actions:  # noqa: SLF001 (argparse keeps its options there)
        if isinstance(action, argparse._HelpAction):  # noqa: SLF001
            continue
        name = action.option_strings[0] if action.option_strings else action.dest
        if not action.help:
            problems.append(f"{name}: no help")
        elif action.nargs != 0 and action.default not in (None, [], argparse.SUPPRESS) and "default" not in action.help:
            problems.append(f"{name}: its default {action.default!r} is not in its help")
    return problems


@pytest.mark.parametrize("name", [name for name in COMMANDS if COMMANDS[name].parser and name not in TRAINING_COMMANDS])
def test_each_option_has_a_help_line_that_gives_its_default(name):
    parser = COMMANDS[name].build_parser()
    assert parser.prog == f"minimind-trl {name}"
    assert not option_problems(parser), option_problems(parser)
    text = parser.format_help()
    for action in parser._actions:  # noqa: SLF001
        if action.choices:
            assert "{" + ",".join(action.choices) + "}" in text, (name, action.dest)


def test_merge_lora_dtype_lists_its_choices_and_default():
    text = COMMANDS["merge-lora"].build_parser().format_help()
    assert "--dtype {float32,float16,bfloat16}" in text and "(default: float32)" in text


def test_the_help_in_process_is_the_front_doors(capsys):
    assert answer_before_running(["export", "--help"]) == 0
    assert capsys.readouterr().out == COMMANDS["export"].build_parser().format_help()
    assert answer_before_running(["export", "m", "o", "--format", "llama"]) is None  # the command runs
    assert answer_before_running(["export", "--", "--help"]) is None  # after `--`, a file named --help
    assert answer_before_running(["no-such-command"]) == 2
