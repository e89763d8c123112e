"""The `minimind-trl` command: a thin dispatcher to the subcommands, and the one place user errors are reported.

The executable starts in `minimind_trl_cli` (the command table, and what it answers without torch: the usage and the
`--help` of the commands that do not train), which hands the rest to `main` here. Each subcommand exposes
`main(argv: list[str] | None) -> int` and raises `MiniMindTRLError` for bad input; the dispatcher prints
`minimind-trl <command>: error: <message>` and exits with 2 (argparse's usage-error code). It imports a subcommand
lazily, so `minimind-trl convert` does not pay for importing TRL. Flags are TRL's `--snake_case`; `--kebab-case` is
accepted too. A launcher variable set to something that is not a number (`WORLD_SIZE=abc`) is one error line for
every command, `--help` included (`minimind_trl_cli.process_exit`).

Modules: `recipe` (with `grpo_help`) -> `run_plan` -> `build` (with `policy` and `run_data`) -> `grpo` -> `hub` are the
stages of `minimind-trl grpo`; `push` pushes a finished output folder later; `minimind-trl demo` runs them on an
embedded default from `minimind_trl.demos` (imported by name, like every subcommand: the demos sit above the commands).
"""

import importlib
import sys

from minimind_trl_cli import COMMANDS, answer_before_running, environment_error


def run_command(command: str, argv: list[str]) -> int:
    """Run one subcommand; a `MiniMindTRLError` becomes one line on stderr and exit code 2."""
    from ..errors import USER_ERROR_EXIT_CODE, MiniMindTRLError

    if (code := environment_error(f"minimind-trl {command}")) is not None:
        return code
    module = importlib.import_module(COMMANDS[command].module)
    try:
        return int(module.main(argv) or 0)
    except MiniMindTRLError as exc:
        print(f"minimind-trl {command}: error: {exc}", file=sys.stderr)
        return USER_ERROR_EXIT_CODE


def main(argv: list[str] | None = None) -> int:
    """`minimind-trl ARGV` in this process: the exit code (argparse's `--help` and usage errors raise SystemExit)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    answered = answer_before_running(argv)
    return answered if answered is not None else run_command(argv[0], argv[1:])
