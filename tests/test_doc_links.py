"""Every section a doc, recipe, script or module points at exists.

References are markdown links in `.md` files (`[text](docs/x.md#anchor)`, `[text](#anchor)`) and plain mentions
anywhere in the tree (`docs/deviations.md#bf16-numerics`, `benchmarks/README.md`). A file must exist and an
anchor must be one of that file's headings, slugged as GitHub does. Sections named in prose (`README: "Known
upstream defects"`) cannot be checked and so are not allowed: name the file and anchor instead.
"""

import os
import re
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
TEXT_SUFFIXES = {".md", ".py", ".yaml", ".yml", ".sbatch", ".toml", ".txt", ".cfg"}
MARKDOWN_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
PLAIN_REFERENCE = re.compile(r"(?<![\w/.-])((?:docs/[\w.-]+\.md|README\.md|benchmarks/README\.md))(#[\w-]+)?")
PROSE_SECTION = re.compile(r"README:\s*\"[^\"]+\"|README \([A-Z][^)]*\)")


# .gitignore's folders: environments, caches, run outputs, and the GPU check's wheels, rehearsal and report
SKIPPED_DIRS = re.compile(r"^(\.git|\.venv.*|__pycache__|\.pytest_cache|build|dist|outputs|runs|minimind-trl-demo"
                          r"|.*\.egg-info|\.gpu-wheels|\.gpu-rehearsal|gpu_check_out|\.whl|\.gl)$")


def tracked_text_files() -> list[Path]:
    """The project's text files: the tree walked as it is (CI's clean copy is not a git checkout), without
    environments, caches and run outputs."""
    found = []
    for folder, dirs, files in os.walk(REPO_ROOT):
        dirs[:] = sorted(d for d in dirs if not SKIPPED_DIRS.match(d))
        found += [Path(folder) / name for name in sorted(files) if Path(name).suffix in TEXT_SUFFIXES]
    return found


def github_slug(heading: str) -> str:
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(markdown: Path) -> set[str]:
    """The anchors GitHub gives the headings of `markdown` (fenced code is not headings; repeats get -1, -2...)."""
    found, seen, fenced = set(), {}, False
    for line in markdown.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        match = re.match(r"^#{1,6}\s+(.+?)\s*#*\s*$", line)
        if match and not fenced:
            slug = github_slug(match.group(1))
            count = seen.get(slug, 0)
            seen[slug] = count + 1
            found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def shown(path: Path) -> str:
    return str(path.relative_to(REPO_ROOT)) if path.is_relative_to(REPO_ROOT) else str(path)


def problem(target: Path, anchor: str | None) -> str | None:
    if not target.exists():
        return f"{shown(target)} does not exist"
    if anchor and target.suffix == ".md" and anchor not in anchors(target):
        return f"{shown(target)} has no section #{anchor} (it has: {', '.join(sorted(anchors(target)))})"
    return None


def references(path: Path):
    """(line number, target file, anchor) of every reference in `path`."""
    text = path.read_text(encoding="utf-8")
    for number, line in enumerate(text.splitlines(), start=1):
        if path.suffix == ".md":
            for match in MARKDOWN_LINK.finditer(line):
                link = match.group(1)
                if re.match(r"^[a-z]+:", link):  # http(s), mailto
                    continue
                file, _, anchor = link.partition("#")
                yield number, (path.parent / file).resolve() if file else path, anchor or None
        for match in PLAIN_REFERENCE.finditer(line):
            yield number, REPO_ROOT / match.group(1), (match.group(2) or "")[1:] or None


def test_every_referenced_file_and_section_exists():
    broken = []
    for path in tracked_text_files():
        if path.name == Path(__file__).name:  # this file's examples
            continue
        for number, target, anchor in references(path):
            if (why := problem(target, anchor)) is not None:
                broken.append(f"{path.relative_to(REPO_ROOT)}:{number}: {why}")
    assert not broken, "dangling references:\n" + "\n".join(broken)


def test_no_section_is_named_only_in_prose():
    prose = [
        f"{path.relative_to(REPO_ROOT)}:{number}: {match.group(0)}"
        for path in tracked_text_files()
        if path.name != Path(__file__).name
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)
        for match in PROSE_SECTION.finditer(line)
    ]
    assert not prose, "name the file and anchor (docs/x.md#section) instead of a section title:\n" + "\n".join(prose)


@pytest.mark.parametrize(
    "heading, slug",
    [
        ("Layout only: `--rewards rules`", "layout-only---rewards-rules"),
        ("Dynamic sampling (opt-in, `dynamic_sampling: true`)", "dynamic-sampling-opt-in-dynamic_sampling-true"),
        ("llama.cpp on the GGUF export", "llamacpp-on-the-gguf-export"),
        ("Where upstream's `train_grpo.py` lives", "where-upstreams-train_grpopy-lives"),
    ],
)
def test_slugs_follow_github(heading, slug):
    assert github_slug(heading) == slug


def test_a_dangling_reference_is_found(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text("# Title\n\n## Real section\n\n```bash\n# not a heading\n```\n[ok](#real-section) [bad](#not-a-heading)\n")
    found = [problem(target, anchor) for _, target, anchor in references(doc)]
    assert found[0] is None and found[1] is not None and "#not-a-heading" in found[1]
