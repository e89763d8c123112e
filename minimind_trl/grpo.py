"""`python -m minimind_trl.grpo` (and `accelerate launch -m minimind_trl.grpo`): `minimind-trl grpo`.

The command lives in `minimind_trl.cli.grpo`; this module keeps the launch path and the names programs import.
"""

import sys

from .cli import run_command
from .cli.build import build_trainer
from .cli.grpo import run, train
from minimind_trl_cli.process_exit import exit_process
from .cli.recipe import parse_args, parse_recipe


def main(argv: list[str] | None = None) -> int:
    """`minimind-trl grpo ARGV`: exit code 0, 2 with one error line for bad input, or 3 when training and its local
    outputs are complete but a push to the Hub failed (`errors.PUSH_FAILED_EXIT_CODE`)."""
    return run_command("grpo", list(sys.argv[1:] if argv is None else argv))


__all__ = ["build_trainer", "main", "parse_args", "parse_recipe", "run", "train"]

if __name__ == "__main__":
    exit_process(main())  # a launched process leaves without the interpreter's finalization (`process_exit`)
