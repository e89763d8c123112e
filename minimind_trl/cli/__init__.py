"""The `minimind-trl` command: a thin dispatcher to the subcommands, and the one place user errors are reported.

Each subcommand exposes `main(argv: list[str] | None) -> int` and raises `MiniMindTRLError` for bad input; the
dispatcher prints `minimind-trl <command>: error: <message>` and exits with 2 (argparse's usage-error code).
It imports a subcommand lazily, so `minimind-trl convert` does not pay for importing TRL. Flags are TRL's
`--snake_case`; `--kebab-case` is accepted too.

Modules: `recipe` -> `run_plan` -> `build` (with `policy` and `run_data`) -> `grpo` -> `hub` are the stages of
`minimind-trl grpo`; `push` pushes a finished output folder later; `minimind-trl demo` runs them on an embedded default from `minimind_trl.demos` (imported by
name, like every subcommand: the demos sit above the commands). `process_exit` ends the process: a process of a
distributed launch leaves without the interpreter's finalization, where gloo can abort it. A launcher variable set to
something that is not a number (`WORLD_SIZE=abc`) is one error line for every command, `--help` included.
"""

import importlib
import sys
from typing import NoReturn

from .process_exit import exit_process, launch_environment_problem

# subcommand -> (module, one-line help)
SUBCOMMANDS = {
    "demo": ("minimind_trl.demos.default", "teach a tiny MiniMind the reasoning format with GRPO on CPU, in minutes"),
    "grpo": ("minimind_trl.cli.grpo", "GRPO training from a recipe YAML (TRL's parser: YAML defaults, CLI overrides)"),
    "convert": ("minimind_trl.conversion.convert", "native MiniMind .pth -> Hugging Face folder (safetensors)"),
    "export": ("minimind_trl.conversion.export", "Hugging Face folder -> native .pth, Llama, Qwen3, Qwen3-MoE or GGUF"),
    "merge-lora": ("minimind_trl.conversion.merge_lora", "merge a LoRA adapter into its base model"),
    "push": ("minimind_trl.cli.push", "push a run's finished output folder to the Hugging Face Hub"),
}


def _usage() -> str:
    width = max(len(name) for name in SUBCOMMANDS)
    lines = ["usage: minimind-trl <command> [options]", "", "commands:"]
    lines += [f"  {name:<{width}}  {help_text}" for name, (_, help_text) in SUBCOMMANDS.items()]
    lines += ["", "Run `minimind-trl <command> --help` for a command's options."]
    return "\n".join(lines)


def environment_error(prog: str) -> int | None:
    """Exit code 2 after one `<prog>: error: ...` line when a launcher variable cannot be read, else None."""
    from ..errors import USER_ERROR_EXIT_CODE

    problem = launch_environment_problem()
    if problem is None:
        return None
    print(f"{prog}: error: {problem}", file=sys.stderr)
    return USER_ERROR_EXIT_CODE


def run_command(command: str, argv: list[str]) -> int:
    """Run one subcommand; a `MiniMindTRLError` becomes one line on stderr and exit code 2."""
    from ..errors import USER_ERROR_EXIT_CODE, MiniMindTRLError

    if (code := environment_error(f"minimind-trl {command}")) is not None:
        return code
    module = importlib.import_module(SUBCOMMANDS[command][0])
    try:
        return int(module.main(argv) or 0)
    except MiniMindTRLError as exc:
        print(f"minimind-trl {command}: error: {exc}", file=sys.stderr)
        return USER_ERROR_EXIT_CODE


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        if (code := environment_error("minimind-trl")) is not None:
            return code
        print(_usage())
        return 0
    command, rest = argv[0], argv[1:]
    if command not in SUBCOMMANDS:
        print(f"minimind-trl: unknown command {command!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    return run_command(command, rest)


def console() -> NoReturn:
    """The `minimind-trl` executable: `main()`, then the process ends by `exit_process` (see `process_exit`)."""
    exit_process(main())
