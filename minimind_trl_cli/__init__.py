"""The `minimind-trl` executable's front door: which commands there are, and the help it prints without running one.

`import minimind_trl` registers MiniMind with transformers, which imports torch (seconds). This package sits beside
`minimind_trl`, not inside it, and imports nothing but the standard library, so `minimind-trl --help`, an unknown
command and `minimind-trl <command> --help` are answered from `COMMANDS` and the command's parser alone. A command
that does not train declares its flags in this package (`conversion.py` holds those of convert, export and
merge-lora), so its help needs no torch; `grpo`'s parser is TRL's over the recipe's dataclasses, built without the
trainer. Everything else goes to `minimind_trl.cli.main`, which runs the command's module.

A new subcommand is one `COMMANDS` entry naming its parser; `tests/cli/test_front_door.py` checks that the help of
every command that does not train imports no torch, and that `grpo`'s imports no trainer.
"""

import importlib
import sys
from dataclasses import dataclass
from typing import NoReturn

from .process_exit import USER_ERROR_EXIT_CODE, exit_process, launch_environment_problem

HELP_FLAGS = ("-h", "--help")
# Runs a command once this package has answered what it can without torch; named like the commands' modules, not
# imported, because it imports torch, transformers and, to train, TRL (and this table itself)
DISPATCHER = "minimind_trl.cli:main"


def resolve(name: str):
    """The function a `module:function` name names, its module imported now."""
    module, _, function = name.partition(":")
    return getattr(importlib.import_module(module), function)


@dataclass(frozen=True)
class Command:
    """One subcommand: the module that runs it (`main(argv) -> int`), its line in `minimind-trl --help`, and where its
    argparse parser is built (`module:function`), which prints its `--help` without importing `module` (None: the
    module's `main` prints it)."""

    module: str
    summary: str
    parser: str | None = None

    def build_parser(self):
        return resolve(self.parser)()


COMMANDS = {
    "demo": Command("minimind_trl.demos.default",
                    "teach a tiny MiniMind the reasoning format with GRPO on CPU, in minutes"),
    "grpo": Command("minimind_trl.cli.grpo", "GRPO training from a recipe: --config RECIPE.yaml, then overrides",
                    "minimind_trl.cli.recipe:make_parser"),
    "convert": Command("minimind_trl.conversion.convert", "native MiniMind .pth -> Hugging Face folder (safetensors)",
                       "minimind_trl_cli.conversion:convert_parser"),
    "export": Command("minimind_trl.conversion.export",
                      "Hugging Face folder -> native .pth, Llama, Qwen3, Qwen3-MoE or GGUF",
                      "minimind_trl_cli.conversion:export_parser"),
    "merge-lora": Command("minimind_trl.conversion.merge_lora", "merge a LoRA adapter into its base model",
                          "minimind_trl_cli.conversion:merge_lora_parser"),
    "push": Command("minimind_trl.cli.push", "push a run's finished output folder to the Hugging Face Hub",
                    "minimind_trl_cli.hub:push_parser"),
}  # fmt: skip


def usage() -> str:
    width = max(len(name) for name in COMMANDS)
    lines = ["usage: minimind-trl <command> [options]", "", "commands:"]
    lines += [f"  {name:<{width}}  {command.summary}" for name, command in COMMANDS.items()]
    lines += ["", "Run `minimind-trl <command> --help` for a command's options."]
    return "\n".join(lines)


def environment_error(prog: str) -> int | None:
    """Exit code 2 after one `<prog>: error: ...` line when a launcher variable cannot be read, else None."""
    problem = launch_environment_problem()
    if problem is None:
        return None
    print(f"{prog}: error: {problem}", file=sys.stderr)
    return USER_ERROR_EXIT_CODE


def answer_before_running(argv: list[str]) -> int | None:
    """The exit code of what is answered without running a command (a launcher variable that is not a number, the
    usage, an unknown command, a command's `--help`), None when the command must run."""
    known = bool(argv) and argv[0] in COMMANDS
    if (code := environment_error("minimind-trl" + (f" {argv[0]}" if known else ""))) is not None:
        return code
    if not argv or argv[0] in HELP_FLAGS:
        print(usage())
        return 0
    if argv[0] not in COMMANDS:
        print(f"minimind-trl: unknown command {argv[0]!r}\n\n{usage()}", file=sys.stderr)
        return USER_ERROR_EXIT_CODE
    command = COMMANDS[argv[0]]
    options = argv[1 : argv.index("--")] if "--" in argv else argv[1:]  # after `--` an argument is never a flag
    if command.parser is not None and any(arg in HELP_FLAGS for arg in options):
        command.build_parser().print_help()
        return 0
    return None


def console() -> NoReturn:
    """The `minimind-trl` executable. The process ends by `exit_process` (see `process_exit`), whatever it ran."""
    code = answer_before_running(sys.argv[1:])
    if code is None:
        code = resolve(DISPATCHER)()
    exit_process(code)


__all__ = ["COMMANDS", "Command", "answer_before_running", "console", "environment_error", "usage"]
