"""pytest plugin that runs TRL's own `tests/test_grpo_trainer.py` (in ../shared/trl-tests) offline on MiniMind
stand-ins, with TRL's `GRPOTrainer` and `GRPOConfig` ("stock") and with `MiniMindGRPOTrainer` and
`MiniMindGRPOConfig.trl_defaults` in their place ("minimind"): every test once per trainer named in
`TRL_SUITE_TRAINERS` (both by default), in the share `TRL_SUITE_SHARD` names (all by default).
`test_trl_grpo_suite.py` runs it in subprocesses (`-p trl_suite_plugin`) and compares the outcomes each writes to
`TRL_SUITE_REPORT`.

All the adaptation is here and in `standins.py`; TRL's test bodies run as they are:
* the Hub: `HF_HUB_CACHE` (set by the caller, with `HF_HUB_OFFLINE=1`) gets the stand-in models under TRL's ids,
  in the vocabulary layout the test needs (`vocabulary_layout`); a test that needs an id without a stand-in is
  skipped, naming it (`SKIPPED_IDS`);
* `load_dataset("trl-internal-testing/zen", ...)` reads the local stand-in of that dataset;
* the class swap: the test module's `GRPOTrainer` / `GRPOConfig` names, per test (the `trl_trainer` fixture);
* one precision for both trainers: where a test leaves `bf16` unset, the stock config gets this CPU's choice
  (`stock_config`), as `MiniMindGRPOConfig.trl_defaults` does, instead of TRL's `bf16=True` on every CPU;
* trl 1.16 lacks `trl.import_utils.is_joblib_available`, which the suite's helpers (a newer TRL's) import.
"""

import importlib.util
import inspect
import json
import os
import re
from pathlib import Path

import pytest
import standins

import minimind_trl  # noqa: F401  (registers MiniMind with transformers' Auto classes, as for any user)

TRAINERS = ("stock", "minimind")
REPORT_ENV = "TRL_SUITE_REPORT"  # where the outcomes go (JSON)
TRAINERS_ENV = "TRL_SUITE_TRAINERS"  # which of TRAINERS run here (comma-separated; all by default)
SHARD_ENV = "TRL_SUITE_SHARD"  # "i/n": only every n-th TRL test from the i-th (with each trainer), for parallel runs
QWEN_IDS = re.compile(r"\b1516[4-6]\d\b")  # Qwen2.5's special ids (151643-151668), written by tests that inject ids
ZEN_ID = "trl-internal-testing/zen"
HUB_ID = re.compile(r"trl-internal-testing/[\w.-]+")

# ids MiniMind does not stand in for, and why (the tests needing them are skipped)
SKIPPED_IDS = {
    "VLM": "a vision-language model (MiniMind is text-only)",
    "zen-image": "an image dataset for vision-language models",
    "zen-multi-image": "an image dataset for vision-language models",
    "tiny-RemoteForCausalLM": "a remote-code model class named RemoteForCausalLM",
    "architecture": "one architecture's own tokenizer or layers; test_train runs on the Qwen2/Qwen3-MoE stand-ins",
}
VLM_NAMES = ("VL", "Gemma3", "Gemma4", "Llava", "SmolVLM", "Qwen3_5", "ConditionalGeneration")


def skip_reason(repo_id: str) -> str:
    name = repo_id.split("/", 1)[1]
    if name in SKIPPED_IDS:
        return SKIPPED_IDS[name]
    if any(part in name for part in VLM_NAMES):
        return SKIPPED_IDS["VLM"]
    return SKIPPED_IDS["architecture"]


def hub_cache() -> Path:
    return Path(os.environ["HF_HUB_CACHE"])


def pytest_configure(config):
    from trl import import_utils

    if not hasattr(import_utils, "is_joblib_available"):
        import_utils.is_joblib_available = lambda: importlib.util.find_spec("joblib") is not None
    if not (hub_cache() / "zen").is_dir():  # built once per cache (one per process: tests switch its layout)
        standins.build_hub_cache(hub_cache())
        standins.write_zen(hub_cache() / "zen")


def source_of(item) -> str:
    return inspect.getsource(item.function) if getattr(item, "function", None) else ""


def needed_ids(item) -> set[str]:
    """The Hub ids a test names: in its parameters and in its body."""
    ids = {value for value in getattr(getattr(item, "callspec", None), "params", {}).values() if isinstance(value, str)}
    return {repo_id for repo_id in ids | set(HUB_ID.findall(source_of(item))) if HUB_ID.fullmatch(repo_id)}


def split_nodeid(nodeid: str) -> tuple[str, str | None]:
    """(the TRL test's own id, the trainer it runs with) of a collected test id."""
    match = re.fullmatch(r"(.*)\[(.*)\]", nodeid)
    params = match.group(2).split("-") if match else []
    trainer = next((param for param in params if param in TRAINERS), None)
    rest = "-".join(param for param in params if param != trainer)
    return (match.group(1) + (f"[{rest}]" if rest else "")) if match else nodeid, trainer


def pytest_collection_modifyitems(config, items):
    for item in items:
        missing = sorted(i for i in needed_ids(item) if i != ZEN_ID and i not in standins.STANDINS)
        if missing:
            item.add_marker(pytest.mark.skip(reason=f"needs {missing[0]}: {skip_reason(missing[0])}"))
    if os.environ.get(SHARD_ENV):
        index, count = map(int, os.environ[SHARD_ENV].split("/"))
        tests = list(dict.fromkeys(split_nodeid(item.nodeid)[0] for item in items))
        mine = set(tests[index::count])
        config.hook.pytest_deselected(items=[item for item in items if split_nodeid(item.nodeid)[0] not in mine])
        items[:] = [item for item in items if split_nodeid(item.nodeid)[0] in mine]


def pytest_generate_tests(metafunc):
    if "trl_trainer" in metafunc.fixturenames:
        chosen = os.environ.get(TRAINERS_ENV)
        metafunc.parametrize("trl_trainer", chosen.split(",") if chosen else TRAINERS, indirect=True)


def local_load_dataset(path, name=None, *args, split=None, streaming=False, **kwargs):
    """`datasets.load_dataset`, with the zen dataset read from the stand-in files."""
    from datasets import load_dataset

    if path != ZEN_ID:
        return load_dataset(path, name, *args, split=split, streaming=streaming, **kwargs)
    folder = hub_cache() / "zen" / name
    files = {split_name: str(folder / f"{split_name}.jsonl") for split_name in ("train", "test")}
    return load_dataset("json", data_files=files, split=split, streaming=streaming)


@pytest.fixture(autouse=True)
def vocabulary_layout(request):
    """Qwen2.5's id layout for a test that writes Qwen's ids, MiniMind's tokenizer for every other."""
    layout = "qwen" if QWEN_IDS.search(source_of(request.node)) else "minimind"
    standins.use_layout(hub_cache(), layout)
    return layout


def stock_config(*args, **kwargs):
    """TRL's `GRPOConfig`, with `bf16` left unset by the test chosen for this CPU (`choose_bf16`, the rule
    `MiniMindGRPOConfig` applies) instead of TRL's `True`. Where bf16 is native the stock config is TRL's as it is;
    where it is not (AVX2, a Xeon without AMX), the stock trainer runs fp32 as the MiniMind one does there, so both
    are compared in one precision, and the stock side does not crawl: with the kernels capped at AVX2, TRL's CPU
    log-prob head made the stock `test_train_with_tools[tools0]` take 163 s in bf16 and 58 s in fp32 (64 s in bf16
    on this Xeon's AMX kernels); the suite's counts were the same (116 passed, 6 failed, 53 skipped each)."""
    from trl import GRPOConfig

    from minimind_trl.trainer.speed.cpu_precision import choose_bf16, runs_on_cpu

    if "bf16" not in kwargs and not kwargs.get("fp16"):
        kwargs["bf16"] = choose_bf16(None, False, runs_on_cpu(kwargs.get("use_cpu", False)))
    return GRPOConfig(*args, **kwargs)


@pytest.fixture(autouse=True)
def trl_trainer(request, monkeypatch):
    """The trainer a test runs with: the module's names are swapped for the "minimind" run, its config's precision
    default for the "stock" run (`stock_config`)."""
    module = request.module
    monkeypatch.setattr(module, "load_dataset", local_load_dataset)
    if request.param == "stock":
        monkeypatch.setattr(module, "GRPOConfig", stock_config)
    if request.param == "minimind":
        from minimind_trl.trainer import MiniMindGRPOConfig, MiniMindGRPOTrainer

        monkeypatch.setattr(module, "GRPOTrainer", MiniMindGRPOTrainer)
        monkeypatch.setattr(module, "GRPOConfig", MiniMindGRPOConfig.trl_defaults)
    return request.param


_outcomes: dict[str, dict] = {}


def pytest_runtest_logreport(report):
    """One entry per TRL test id and trainer: passed, failed, skipped (with why), xfailed or xpassed."""
    test, trainer = split_nodeid(report.nodeid)
    if trainer is None:
        return
    entry = _outcomes.setdefault(test, {})
    if hasattr(report, "wasxfail"):
        outcome = "xpassed" if report.passed else "xfailed"
    elif report.when == "call" or not report.passed:
        outcome = report.outcome
    else:
        return
    if trainer in entry and entry[trainer] == "failed":
        return  # a teardown after a failed call
    entry[trainer] = outcome
    if report.skipped:
        entry["reason"] = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    if report.failed:
        entry[f"{trainer}_error"] = report.longreprtext.strip().splitlines()[-1][:300] if report.longreprtext else ""


def pytest_sessionfinish(session):
    path = os.environ.get(REPORT_ENV)
    if path:
        Path(path).write_text(json.dumps(_outcomes, indent=1, sort_keys=True))
