"""Shared test helpers: the upstream fixtures in ../shared and small MiniMind builders."""

import os
import socket
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("MINIMIND_SHARED", REPO_ROOT.parent / "shared"))
FIXTURES = SHARED / "fixtures" / "minimind-upstream"


def require_shared(path: Path) -> Path:
    """Return `path` under ../shared; fail under CI (CI=true) and skip elsewhere when it is missing."""
    if path.exists():
        return path
    message = f"{path} is missing (set MINIMIND_SHARED to the folder holding fixtures/)"
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(message)
    pytest.skip(message)


def free_port() -> int:
    """A TCP port free on loopback now: a launcher's rendezvous port or a server the test starts."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def pytest_configure(config):
    """Register the markers of transformers' common suite, which tests/models/test_transformers_common.py imports
    from ../shared (its own conftest does this in a transformers checkout)."""
    suite_conftest = SHARED / "transformers-tests" / "conftest.py"
    if suite_conftest.is_file():
        namespace = {}
        exec(compile(suite_conftest.read_text(), str(suite_conftest), "exec"), namespace)
        namespace["pytest_configure"](config)


@pytest.fixture(autouse=True)
def _deterministic_threads():
    import torch

    torch.manual_seed(0)
    yield


def _share_the_cores_among_workers() -> None:
    """Under pytest-xdist (README's test command runs two workers), each worker's torch takes its share of the cores,
    not all of them: two workers with two threads each on a 2-core machine oversubscribe it, and OpenMP's waiting
    threads then slow both (the tests' tiny models gain little from a second thread anyway)."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers:
        import torch

        torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // int(workers)))


def module_fixture_group(item) -> str | None:
    """The module of a test that uses a module-scoped fixture (its `xdist_group`), None for any other test."""
    fixture_info = getattr(item, "_fixtureinfo", None)  # a Function's; other items request no fixtures
    if fixture_info is None:
        return None
    if any(defs[-1].scope == "module" for defs in fixture_info.name2fixturedefs.values()):
        return item.nodeid.split("::")[0]
    return None


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook reads the `xdist_group` marks
def pytest_collection_modifyitems(config, items):
    """The `slow` tests (the demos' learning runs, TRL's suite, multi-process launches: minutes each) come first, the
    longest first (`slow(minutes=N)`: about what the test takes on 2 cores), then the rest in file order.

    README's test command hands the tests to its two pytest-xdist workers one at a time, to whichever is free, in this
    order (`--dist loadgroup` and `--no-loadscope-reorder`): the long runs start on both workers at once instead of
    one worker ending the run alone with them. The exception is a module's tests that use a module-scoped fixture
    (a training run, the GPU check's CPU form: up to a minute to build): they go to one worker together, as one
    `xdist_group` at the place of the first, so the fixture is built once, not once per worker."""

    def order(item):
        slow = item.get_closest_marker("slow")
        return (0, -slow.kwargs.get("minutes", 0)) if slow is not None else (1, 0)

    for item in items:
        group = module_fixture_group(item)
        if group is not None and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(group))
    items.sort(key=order)


def _process_settings() -> tuple:
    import datasets
    import torch
    import transformers

    return transformers.logging.get_verbosity(), datasets.logging.get_verbosity(), torch.get_num_threads()


_share_the_cores_among_workers()
_BASELINE_SETTINGS = _process_settings()  # as the session starts, before any command ran in-process


@pytest.fixture(autouse=True)
def _restore_process_settings():
    """Commands run in-process (the demo quiets transformers' and datasets' logging and sets torch's thread count,
    as a command may; trainers set the logging level) must not change what later tests see: every test starts
    from the session's baseline, also after a module-scoped fixture ran a command."""
    import datasets
    import torch
    import transformers

    transformers.logging.set_verbosity(_BASELINE_SETTINGS[0])
    datasets.logging.set_verbosity(_BASELINE_SETTINGS[1])
    torch.set_num_threads(_BASELINE_SETTINGS[2])
    yield


FIXTURE_CASES = [
    ("MiniMind2", "dense"),
    ("MiniMind2", "moe"),
    ("MiniMind-3", "dense"),
    ("MiniMind-3", "moe"),
]
ERA_TO_GENERATION = {"MiniMind2": "minimind2", "MiniMind-3": "minimind3"}


def load_fixture_case(era: str, case: str) -> dict:
    """One upstream fixture case: upstream config kwargs, fp32 state dict, inputs and expected outputs."""
    import json

    import torch

    folder = require_shared(FIXTURES / era / case)
    return {
        "generation": ERA_TO_GENERATION[era],
        "config_kwargs": json.loads((folder / "config.json").read_text())["config_kwargs"],
        "state_dict_path": folder / "state_dict.pth",
        "state_dict": torch.load(folder / "state_dict.pth", weights_only=True),
        "inputs": torch.load(folder / "inputs.pt", weights_only=True),
        "expected": torch.load(folder / "expected.pt", weights_only=True),
    }


@pytest.fixture
def cpu_machine(monkeypatch):
    """`cpu_machine(bf16_native)`: the CPU every precision choice sees computes bf16 natively and fast (an AVX512-BF16
    server) or not at all (AVX2: bf16 40x slower than fp32); its once-only log lines start afresh."""
    from minimind_trl.trainer.speed import cpu_precision

    monkeypatch.delenv("ACCELERATE_MIXED_PRECISION", raising=False)
    cpu_precision._log_once.cache_clear()

    def set_machine(bf16_native: bool):
        capability = "AVX512" if bf16_native else "AVX2"
        cpu = cpu_precision.CpuInfo("AuthenticAMD", "AMD EPYC", capability, False, bf16_native, False, bf16_native)
        probe = cpu_precision.Bf16Probe(fp32_s=1e-3, bf16_s=0.5e-3 if bf16_native else 40e-3)
        choice = cpu_precision.decide(cpu, probe)
        monkeypatch.setattr(cpu_precision, "machine_choice", lambda: choice)
        return choice

    yield set_machine
    cpu_precision._log_once.cache_clear()


@pytest.fixture(params=["fp32", "bf16"])
def either_cpu_choice(request, cpu_machine):
    """The test runs twice: on a CPU that chooses fp32 (AVX2, or bf16 slower than fp32) and on one that chooses bf16
    (Zen 4, AMX), whatever this machine's own choice is. Returns the choice (`cpu_precision.CpuPrecision`)."""
    return cpu_machine(request.param == "bf16")


@pytest.fixture
def device() -> str:
    """The device the `gpu` tests (tests/gpu) run their bodies on: `MINIMIND_TEST_DEVICE` (default `cuda`), skipping,
    and saying why, where that is CUDA and no CUDA device is visible. `MINIMIND_TEST_DEVICE=cpu` runs the same bodies
    on CPU at the same sizes (how each was seen to fail with its guarded behaviour broken; `gpu_check.sh --cpu`).
    Here, not in a tests/gpu/conftest.py: the test modules import `conftest` by name (rootdir imports), and a second
    conftest module would shadow this one for every test collected after tests/gpu."""
    name = os.environ.get("MINIMIND_TEST_DEVICE", "cuda")
    if name == "cuda":
        import torch

        if not torch.cuda.is_available():
            pytest.skip("needs a CUDA device (MINIMIND_TEST_DEVICE=cpu runs this body on CPU)")
    return name
