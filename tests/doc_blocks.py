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


def run_python_blocks(blocks: list[str], workdir: Path, timeout: int = 600) -> list[str]:
    """Run model-card python blocks as a reader pastes them: each in its own namespace, in one fresh interpreter in
    `workdir`, offline. Blocks that do not `import minimind_trl` run as for a reader without the package (it cannot
    be imported), so give them apart from those that do. Returns each block's stdout; fails naming the block."""
    import json
    import subprocess
    import sys

    from grpo_fixtures import subprocess_env

    without_package = not any("import minimind_trl" in block for block in blocks)
    runner = (
        "import contextlib, io, json, sys\n"
        + ("sys.modules['minimind_trl'] = None\n" if without_package else "")
        + "outputs = []\n"
        "for block in json.loads(sys.stdin.read()):\n"
        "    out = io.StringIO()\n"
        "    with contextlib.redirect_stdout(out):\n"
        "        try:\n"
        "            exec(compile(block, '<card block>', 'exec'), {'__name__': '__main__'})\n"
        "        except BaseException:\n"
        "            sys.stderr.write(block + '\\n---\\n'); raise\n"
        "    outputs.append(out.getvalue())\n"
        "print(json.dumps(outputs))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", runner], cwd=workdir, input=json.dumps(blocks), capture_output=True, text=True,
        env=subprocess_env(HF_MODULES_CACHE=str(workdir / "hf_modules")), timeout=timeout,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout.strip().splitlines()[-1])
