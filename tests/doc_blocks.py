"""The code blocks of a docs/ page, read verbatim so a test runs what a user copies (as serving_docs.py reads
docs/agent.md's Serving section): a section by its heading, then its fenced blocks of one language."""

import re
from pathlib import Path

DOCS = Path(__file__).resolve().parents[1] / "docs"


def doc_section(page: str, title: str) -> str:
    """The text under the heading `title` (any level) of `docs/<page>`, up to the next heading of that level or
    above; fails naming the page and heading when there is none."""
    lines, level, fenced = (DOCS / page).read_text(encoding="utf-8").splitlines(keepends=True), None, False
    start = end = None
    for index, line in enumerate(lines):
        if line.startswith("```"):
            fenced = not fenced
        heading = None if fenced else re.match(r"(#+) (.*?)\s*$", line)  # a `# comment` in a code block is none
        if heading and start is None and heading.group(2) == title:
            start, level = index + 1, len(heading.group(1))
        elif heading and start is not None and len(heading.group(1)) <= level:
            end = index
            break
    if start is None:
        raise AssertionError(f"docs/{page} has no '{title}' heading")
    return "".join(lines[start:end])


def fenced_blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", text, re.M | re.S)


def doc_blocks(page: str, title: str, language: str, count: int) -> list[str]:
    """The `count` fenced `language` blocks of the section, in order (fails naming what the section holds)."""
    blocks = fenced_blocks(doc_section(page, title), language)
    if len(blocks) != count:
        raise AssertionError(f"docs/{page}'s '{title}' must hold {count} {language} block(s), found {len(blocks)}")
    return blocks


def commands(block: str) -> list[str]:
    """A bash block's command lines (comments and blank lines left out; no continuation lines)."""
    return [line for line in block.splitlines() if line.strip() and not line.lstrip().startswith("#")]
