"""docs/agent.md's "Serving" section as the tests run it: its shell commands and its two Python blocks, read from the
doc itself so the tests follow what a user copies and the doc cannot drift from what was checked.

The section must hold, in order: one `bash` block of three commands (train the demo, export it, `vllm serve`), the
OpenAI-client `python` block, then the transformers `python` block. Anything else fails the reading, naming what
is missing.
"""

import re
import shlex
from pathlib import Path

from doc_blocks import fenced_blocks

AGENT_DOC = Path(__file__).resolve().parents[1] / "docs" / "agent.md"
COMMANDS = ("minimind-trl demo --agent", "minimind-trl export", "vllm serve")


def serving_section(doc: Path = AGENT_DOC) -> str:
    section = re.search(r"^## Serving\s*$(.*?)(?=^## |\Z)", doc.read_text(encoding="utf-8"), re.M | re.S)
    if section is None:
        raise AssertionError(f"{doc} has no '## Serving' section")
    return section.group(1)


def serving_commands(doc: Path = AGENT_DOC) -> list[list[str]]:
    """The section's three shell commands, split as a shell splits them: demo, export, `vllm serve`."""
    blocks = fenced_blocks(serving_section(doc), "bash")
    if len(blocks) != 1:
        raise AssertionError(f"docs/agent.md's Serving section must hold one bash block, found {len(blocks)}")
    lines = [line for line in blocks[0].splitlines() if line.strip() and not line.lstrip().startswith("#")]
    if len(lines) != len(COMMANDS) or not all(line.startswith(c) for line, c in zip(lines, COMMANDS)):
        raise AssertionError(f"the Serving bash block must be {COMMANDS} in order, found {lines}")
    return [shlex.split(line) for line in lines]


def python_blocks(doc: Path = AGENT_DOC) -> tuple[str, str]:
    """(the OpenAI-client block, the transformers block)."""
    blocks = fenced_blocks(serving_section(doc), "python")
    if len(blocks) != 2 or "from openai import OpenAI" not in blocks[0] or "apply_chat_template" not in blocks[1]:
        raise AssertionError("the Serving section must hold the OpenAI-client python block, then the transformers one")
    return blocks[0], blocks[1]


def replaced(code: str, old: str, new: str) -> str:
    """`code` with its one occurrence of `old` replaced (fails when the doc no longer holds it)."""
    if code.count(old) != 1:
        raise AssertionError(f"expected {old!r} once in the doc's block, found it {code.count(old)} times")
    return code.replace(old, new)
