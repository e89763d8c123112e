"""What a newcomer's install holds is enough: with only `[project.dependencies]` (no extras), every module of the
package imports and the default commands (demo, grpo, convert, export, merge-lora) run; each optional extra
fails with a message naming the extra to install.

Installing a second virtual environment would take minutes, so the test builds the same thing from this one: a
site directory holding exactly the files of the distributions `pyproject.toml`'s dependencies pull in (their
RECORDs, file by file, as links), and runs a Python that sees only the standard library, that directory and the
checkout. A package outside the closure (pytest, matplotlib, deepspeed, gguf, ...) is then not importable at all,
as in the venv README Quickstart line 1 makes minus its `[plot]` extra.
"""

import importlib.metadata as metadata
import json
import os
import re
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement

REPO_ROOT = Path(__file__).resolve().parents[1]


def core_requirements() -> list[Requirement]:
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    return [Requirement(spec) for spec in project["dependencies"]]


def distribution_closure(requirements: list[Requirement], find=metadata.distribution) -> dict[str, metadata.Distribution]:
    """Every installed distribution the requirements pull in, markers evaluated for this interpreter, following the
    extras a requirement asks for: torch's CUDA build needs `cuda-toolkit[cufile,cublas,...]`, whose libraries
    (libcufile.so.0, ...) come only through those extras' markers (`extra == "cufile"`)."""
    environment = default_environment()
    found: dict[str, metadata.Distribution] = {}
    followed: set[tuple[str, str]] = set()  # (distribution, extra) pairs whose requirements were added
    pending = [(requirement, "") for requirement in requirements]
    while pending:
        requirement, parent_extra = pending.pop()
        if requirement.marker is not None and not requirement.marker.evaluate({**environment, "extra": parent_extra}):
            continue
        key = re.sub(r"[-_.]+", "-", requirement.name).lower()
        if key not in found:
            try:
                found[key] = find(requirement.name)
            except metadata.PackageNotFoundError:
                pytest.fail(f"{requirement.name} is a dependency of minimind-trl but is not installed in this venv")
        for extra in ("", *sorted(requirement.extras)):
            if (key, extra) not in followed:
                followed.add((key, extra))
                pending.extend((Requirement(spec), extra) for spec in found[key].requires or [])
    return found


def build_core_site(target: Path, requirements=None, find=metadata.distribution) -> set[str]:
    """Link every file of the closure of `requirements` (default: the core ones) into `target` (a site directory);
    returns the distributions' names."""
    closure = distribution_closure(core_requirements() if requirements is None else requirements, find)
    for distribution in closure.values():
        root = Path(distribution.locate_file(""))
        for file in distribution.files or []:
            source = (root / file).resolve()
            if file.parts[0] == ".." or not source.is_file():  # console scripts outside site-packages, caches
                continue
            link = target / file
            link.parent.mkdir(parents=True, exist_ok=True)
            if not link.exists():
                link.symlink_to(source)
    return set(closure)


@pytest.fixture(scope="module")
def core_site(tmp_path_factory) -> tuple[Path, set[str]]:
    # named like a real one: dill and datasets pickle modules under a `site-packages` path by reference
    target = tmp_path_factory.mktemp("core-env") / "site-packages"
    target.mkdir()
    return target, build_core_site(target)


PRELUDE = """
import site, sys
sys.path[:] = [p for p in sys.path if "site-packages" not in p]
site.addsitedir({site_dir!r})
sys.path.insert(0, {repo!r})
"""


def run_core(core_site, code: str, *args: str, cwd=None, timeout=900) -> subprocess.CompletedProcess:
    """Run `code` in a Python that sees only the standard library, the core closure and the checkout."""
    site_dir, _ = core_site
    prelude = PRELUDE.format(site_dir=str(site_dir), repo=str(REPO_ROOT))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(HF_HUB_OFFLINE="1", HF_HUB_DISABLE_TELEMETRY="1", TOKENIZERS_PARALLELISM="false")
    return subprocess.run(
        [sys.executable, "-S", "-c", prelude + textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=timeout,
    )


def cli(core_site, *args: str, cwd=None) -> subprocess.CompletedProcess:
    return run_core(core_site, "from minimind_trl.cli import main\nsys.argv = sys.argv[:1] + sys.argv[1:]\nsys.exit(main())", *args, cwd=cwd)


def _fake_distribution(site: Path, name: str, requires: list[str], files: dict[str, str]) -> None:
    """An installed distribution as pip leaves it: its files, and a dist-info with METADATA and RECORD."""
    info = site / f"{name}-1.0.dist-info"
    info.mkdir(parents=True)
    metadata_lines = ["Metadata-Version: 2.1", f"Name: {name}", "Version: 1.0"]
    metadata_lines += [f"Provides-Extra: {extra}" for extra in ("libs", "all")]
    metadata_lines += [f"Requires-Dist: {spec}" for spec in requires]
    (info / "METADATA").write_text("\n".join(metadata_lines) + "\n")
    for relative, text in files.items():
        (site / relative).parent.mkdir(parents=True, exist_ok=True)
        (site / relative).write_text(text)
    record = [*files, f"{info.name}/METADATA", f"{info.name}/RECORD"]
    (info / "RECORD").write_text("".join(f"{entry},,\n" for entry in record))


def test_the_core_site_follows_the_extras_a_requirement_asks_for(tmp_path):
    """torch's CUDA build asks for `cuda-toolkit[cufile,...]`; the libraries it loads (relative to its own folder, as
    its RPATH does) come from distributions that only those extras' markers pull in. A closure that ignores the
    requested extras leaves them out, and torch fails to import in the core site (libcufile.so.0). Here
    an `engine` needs `toolkit[libs]`, whose `vendorlib` is required only under `extra == "libs"`."""
    installed = tmp_path / "installed"
    loader = (
        "from pathlib import Path\n"
        "library = Path(__file__).parent.parent / 'vendorlib' / 'lib.txt'\n"
        "if not library.is_file():\n"
        "    raise ImportError(f'{library.name}: cannot open shared object file')\n"
    )
    _fake_distribution(installed, "engine", ['toolkit[libs]==1.0; python_version >= "3"'], {"engine/__init__.py": loader})
    _fake_distribution(
        installed, "toolkit", ['vendorlib==1.0; extra == "libs"', 'unwanted==1.0; extra == "all"'],
        {"toolkit/__init__.py": ""},
    )
    _fake_distribution(installed, "vendorlib", [], {"vendorlib/__init__.py": "", "vendorlib/lib.txt": "binary"})

    def find(name: str) -> metadata.Distribution:
        return next(iter(metadata.distributions(name=name, path=[str(installed)])))

    site_dir = tmp_path / "core" / "site-packages"
    names = build_core_site(site_dir, [Requirement("engine")], find)
    assert names == {"engine", "toolkit", "vendorlib"}  # `unwanted` is another extra's
    probe = subprocess.run(
        [sys.executable, "-S", "-c", f"import site; site.addsitedir({str(site_dir)!r}); import engine"],
        capture_output=True, text=True,
    )
    assert probe.returncode == 0, probe.stderr


def test_the_core_site_holds_the_dependencies_and_nothing_else(core_site):
    """The environment is what it claims: the core closure importable, the extras' packages not."""
    _, names = core_site
    assert {"torch", "transformers", "trl", "sentencepiece", "protobuf"} <= names
    probe = run_core(
        core_site,
        """
        import importlib.util, json
        names = ["torch", "transformers", "trl", "peft", "datasets", "accelerate", "sentencepiece", "google.protobuf",
                 "pytest", "matplotlib", "deepspeed", "gguf", "tensorboard", "parameterized"]
        print(json.dumps({name: importlib.util.find_spec(name) is not None for name in names}))
        """,
    )
    assert probe.returncode == 0, probe.stderr
    found = json.loads(probe.stdout.strip().splitlines()[-1])
    assert all(found[name] for name in ("torch", "transformers", "trl", "peft", "datasets", "accelerate")), found
    assert found["sentencepiece"] and found["google.protobuf"], found
    assert not any(found[name] for name in ("pytest", "matplotlib", "deepspeed", "gguf", "tensorboard")), found


def test_every_module_imports_with_only_the_core_dependencies(core_site):
    result = run_core(
        core_site,
        """
        import importlib, pkgutil, traceback
        import minimind_trl
        failed = []
        for info in pkgutil.walk_packages(minimind_trl.__path__, "minimind_trl."):
            try:
                importlib.import_module(info.name)
            except Exception:
                failed.append(info.name + ": " + traceback.format_exc().strip().splitlines()[-1])
        print("\\n".join(failed) or "all imported")
        sys.exit(1 if failed else 0)
        """,
    )
    assert result.returncode == 0, f"modules that need more than [project.dependencies]:\n{result.stdout}{result.stderr}"


@pytest.fixture(scope="module")
def tiny_demo(core_site, tmp_path_factory):
    """The default demo (full reward: the InternLM2-layout reward model and its SentencePiece tokenizer), shortened,
    with only the core dependencies: its whole pipeline, in a few seconds."""
    out = tmp_path_factory.mktemp("core-demo") / "demo"
    result = cli(
        core_site, "demo", "--steps", "2", "--warm_start_steps", "2", "--reward_model_steps", "2", "--output_dir", str(out)
    )
    return out, result


def completed(out, result) -> bool:
    """The demo ran to its end: exit 0, or 1 when two GRPO steps learnt nothing, as its summary says."""
    summary = out / "summary.json"
    return summary.is_file() and result.returncode == (0 if json.loads(summary.read_text())["learned"] else 1)


def test_the_default_demo_runs_with_only_the_core_dependencies(tiny_demo):
    out, result = tiny_demo
    assert completed(out, result), result.stdout[-3000:] + result.stderr[-3000:]
    assert (out / "config.json").is_file() and (out / "_reward_model" / "tokenizer.model").is_file()
    # without the [plot] extra the curve is skipped with the extra named, not a crash
    assert "pip install 'minimind-trl[plot]'" in result.stdout


def test_convert_export_and_grpo_run_with_only_the_core_dependencies(core_site, tiny_demo, tmp_path):
    demo, result = tiny_demo
    assert completed(*tiny_demo), result.stderr[-3000:]
    native = tmp_path / "grpo_64.pth"
    steps = [
        ("export", str(demo), str(native), "--format", "native"),
        ("convert", str(native), str(tmp_path / "converted"), "--tokenizer", str(demo)),
        ("export", str(tmp_path / "converted"), str(tmp_path / "llama"), "--format", "llama"),
        (
            "grpo", "--config", "recipes/demo/grpo.yaml", "--model_name_or_path", str(tmp_path / "converted"),
            "--dataset_name", "minimind_trl/demos/data/demo_prompts.jsonl", "--max_steps", "1",
            "--output_dir", str(tmp_path / "grpo"),
        ),
    ]
    for args in steps:
        step = cli(core_site, *args, cwd=REPO_ROOT)
        assert step.returncode == 0, f"minimind-trl {' '.join(args)}:\n{step.stdout[-2000:]}{step.stderr[-3000:]}"
    assert (tmp_path / "llama" / "config.json").is_file() and (tmp_path / "grpo" / "config.json").is_file()


def test_optional_extras_name_the_extra_to_install(core_site, tiny_demo, tmp_path):
    demo, result = tiny_demo
    assert completed(*tiny_demo), result.stderr[-3000:]
    gguf = cli(core_site, "export", str(demo), str(tmp_path / "m.gguf"), "--format", "gguf")
    assert gguf.returncode == 2 and "pip install 'minimind-trl[gguf]'" in gguf.stderr, gguf.stderr[-2000:]
    board = cli(
        core_site, "grpo", "--config", "recipes/demo/grpo.yaml", "--model_name_or_path", str(demo),
        "--dataset_name", "minimind_trl/demos/data/demo_prompts.jsonl", "--report_to", "tensorboard",
        "--output_dir", str(tmp_path / "tb"), cwd=REPO_ROOT,
    )
    assert board.returncode == 2 and "pip install 'minimind-trl[tensorboard]'" in board.stderr, board.stderr[-2000:]
    # what `accelerate launch --config_file recipes/accelerate/zero2.yaml` hands the process
    zero = run_core(
        core_site,
        "import os\nos.environ.update(ACCELERATE_USE_DEEPSPEED='true', ACCELERATE_DEEPSPEED_ZERO_STAGE='2')\n"
        "from minimind_trl.cli import main\nsys.exit(main())",
        "grpo", "--config", "recipes/demo/grpo.yaml", "--model_name_or_path", str(demo),
        "--dataset_name", "minimind_trl/demos/data/demo_prompts.jsonl", "--output_dir", str(tmp_path / "zero"),
        cwd=REPO_ROOT,
    )
    assert zero.returncode == 2 and "pip install 'minimind-trl[deepspeed]'" in zero.stderr, zero.stderr[-2000:]
    assert "Traceback" not in zero.stderr, zero.stderr[-2000:]
