"""TRL's own GRPOTrainer tests on MiniMind: every test of TRL's `tests/test_grpo_trainer.py` that passes with TRL's
`GRPOTrainer` passes with `MiniMindGRPOTrainer` configured by `MiniMindGRPOConfig.trl_defaults()`
(docs/parity.md#as-a-grpotrainer).

The suite is TRL's code, kept in ../shared/trl-tests (see its README) and run from there, never copied here: pytest
runs it in `SHARDS` subprocesses side by side, each a share of the tests with both trainers and one torch thread (the
models are tiny: two processes keep both cores of a CI machine busy, and each test's two runs share one process's
start-up). The adaptation (stand-in models, the local zen dataset, the class swap, one precision for both trainers
where a test leaves it unset: this CPU's choice) is `trl_suite_plugin.py` and `standins.py`. Fails under CI=true when
the suite is missing, skips elsewhere.
"""

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from conftest import SHARED, require_shared

HERE = Path(__file__).resolve().parent
TRL_TESTS = SHARED / "trl-tests"
TRAINERS = ("stock", "minimind")
SHARDS = 2
MODULE = "tests/test_grpo_trainer.py::TestGRPOTrainer::"

# The TRL tests that go through what MiniMindGRPOTrainer changes around TRL's generation: rewards from environments,
# TRL's tool loop on MiniMind's tool calls, a `generate` the tests patch. Both trainers must pass them.
THROUGH_MINIMIND_GENERATION = (
    "test_train_with_mask_truncated_completions",
    "test_train_with_tools[tools0]",
    "test_train_with_tools[tools1]",
    "test_train_with_environment_factory",
    "test_train_with_environment_owned_reward",
    "test_environment_owned_reward_coexists_with_reward_funcs",
    "test_train_with_multiple_environments",
    "test_train_with_environment_owned_data",
    "test_train_with_malformed_tool_calls",
)
# TRL's PEFT tests pass `LoraConfig()` without target_modules: they run on MiniMind once the package registers its
# default LoRA targets with PEFT (`models/minimind/peft_defaults.py`; without them both trainers fail them).
NEED_MINIMIND_LORA_DEFAULTS = (
    "test_train_peft_config",
    "test_train_peft_model",
    "test_train_peft_with_gradient_checkpointing",
)


def start_suite(shard: int, workdir: Path) -> subprocess.Popen:
    """One share of TRL's test file under `trl_suite_plugin`, offline; its own Hub cache (built by the plugin)."""
    workdir.mkdir(parents=True)
    env = {key: value for key, value in os.environ.items() if key != "PYTEST_ADDOPTS"}
    env.update(
        HF_HUB_CACHE=str(workdir / "hub"),
        HF_HOME=str(workdir / "home"),
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TRL_SUITE_SHARD=f"{shard}/{SHARDS}",
        TRL_SUITE_REPORT=str(workdir / "report.json"),
        OMP_NUM_THREADS="1",
        # glibc hands every large tensor's pages back to the kernel when it is freed, and the next step faults them
        # in again: TRL's CPU log-prob head spent more time in the kernel than computing. Kept in the heap instead.
        MALLOC_MMAP_MAX_="0",
        MALLOC_TRIM_THRESHOLD_=str(1 << 40),
        TOKENIZERS_PARALLELISM="false",
        PYTHONDONTWRITEBYTECODE="1",
        PYTHONPATH=os.pathsep.join(filter(None, [str(HERE), env.get("PYTHONPATH")])),
    )
    command = [
        sys.executable, "-m", "pytest", str(TRL_TESTS / "tests" / "test_grpo_trainer.py"), "--rootdir", str(TRL_TESTS),
        "-p", "trl_suite_plugin", "-p", "no:cacheprovider", "-q", "-rs", "--durations=10",
        "--basetemp", str(workdir / "tmp"),  # not beside this session's own, which pytest would rotate away
    ]  # fmt: skip
    with open(workdir / "pytest.log", "w") as log:  # the child keeps its own handle
        return subprocess.Popen(command, cwd=TRL_TESTS, env=env, stdout=log, stderr=subprocess.STDOUT)


def summary(report: dict) -> str:
    """Counts per trainer, the tests only stock passes or fails, and why tests were skipped."""
    lines = [f"{trainer}: {dict(Counter(entry[trainer] for entry in report.values()))}" for trainer in TRAINERS]
    for test, entry in sorted(report.items()):
        if entry["stock"] != entry["minimind"] or entry["stock"] == "failed":
            errors = "; ".join(entry.get(f"{t}_error", "") for t in TRAINERS if entry.get(f"{t}_error"))
            lines.append(f"{entry['stock']} (stock) / {entry['minimind']} (minimind): {test} {errors}")
    reasons = Counter(entry.get("reason", "") for entry in report.values() if entry["stock"] == "skipped")
    lines += [f"skipped {count}x: {reason}" for reason, count in reasons.most_common()]
    return "\n".join(lines)


@pytest.mark.slow(minutes=8)  # its two shards keep both cores busy for 8-12 minutes
def test_minimind_trainer_passes_every_trl_grpo_test_stock_trl_passes(tmp_path):
    require_shared(TRL_TESTS / "tests" / "test_grpo_trainer.py")
    runs = {shard: start_suite(shard, tmp_path / f"shard{shard}") for shard in range(SHARDS)}
    report = {}
    for shard, run in runs.items():
        returncode = run.wait(timeout=3600)
        log = (tmp_path / f"shard{shard}" / "pytest.log").read_text()
        assert returncode in (0, 1), f"shard {shard} did not complete (exit {returncode}):\n{log[-3000:]}"
        report.update(json.loads((tmp_path / f"shard{shard}" / "report.json").read_text()))
    print(summary(report))

    assert all(trainer in entry for entry in report.values() for trainer in TRAINERS)
    regressions = [test for test, entry in report.items() if entry["stock"] == "passed" != entry["minimind"]]
    assert not regressions, f"pass with TRL's GRPOTrainer, not with MiniMindGRPOTrainer:\n{summary(report)}"
    for test in THROUGH_MINIMIND_GENERATION + NEED_MINIMIND_LORA_DEFAULTS:
        assert (report[MODULE + test]["stock"], report[MODULE + test]["minimind"]) == ("passed", "passed"), test
    skipped = {trainer: {test for test, entry in report.items() if entry[trainer] == "skipped"} for trainer in TRAINERS}
    assert skipped["stock"] == skipped["minimind"]  # the same tests run for both
