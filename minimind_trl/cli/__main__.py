"""`python -m minimind_trl.cli ...`: the `minimind-trl` command."""

from . import console

console()
