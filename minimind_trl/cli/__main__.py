"""`python -m minimind_trl.cli ...`: the `minimind-trl` command."""

import sys

from . import main

sys.exit(main())
