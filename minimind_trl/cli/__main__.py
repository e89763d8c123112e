"""`python -m minimind_trl.cli ...`: the `minimind-trl` command."""

from minimind_trl_cli import console

console()
