"""Print README.md's Quickstart command lines, one per line, exactly as the README shows them.

CI runs what a newcomer copies: the lines of the first fenced block under `## Quickstart`. Exits non-zero,
naming the problem, when the section or its block is missing or does not hold exactly two commands (the demo,
then the tests), so a README edit cannot silently change what CI runs.
"""

import re
import sys
from pathlib import Path


def quickstart_lines(readme: str) -> list[str]:
    section = re.search(r"^## Quickstart\s*$(.*?)(?=^## |\Z)", readme, re.M | re.S)
    if section is None:
        raise SystemExit("README.md has no '## Quickstart' section")
    block = re.search(r"^```[a-z]*\n(.*?)^```", section.group(1), re.M | re.S)
    if block is None:
        raise SystemExit("README.md's Quickstart section has no fenced code block")
    lines = [line for line in block.group(1).splitlines() if line.strip() and not line.lstrip().startswith("#")]
    if len(lines) != 2:
        raise SystemExit(f"README.md's Quickstart block must hold 2 command lines (demo, tests), found {len(lines)}")
    return lines


if __name__ == "__main__":
    path = Path(sys.argv[1] if len(sys.argv) > 1 else "README.md")
    print("\n".join(quickstart_lines(path.read_text(encoding="utf-8"))))
