"""tests/conftest.py's share of the suite's running: the slow tests are collected first, the longest first, the users
of a module-scoped fixture go to one pytest-xdist worker together, and each worker's torch takes its share of the
cores (README's test command runs two workers)."""

import os
import subprocess
import sys

from conftest import REPO_ROOT


def collected(*paths: str) -> list[str]:
    """The test ids `pytest --collect-only` lists for `paths`, in order, in a process of its own."""
    env = {key: value for key, value in os.environ.items() if key != "PYTEST_ADDOPTS"}
    completed = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *paths],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    return [line for line in completed.stdout.splitlines() if "::" in line]


def test_the_slow_tests_come_first_the_longest_first():
    ids = collected("tests/demos/test_default.py", "tests/trl_suite/test_trl_grpo_suite.py")
    names = [test_id.split("::")[-1] for test_id in ids]
    assert names[:4] == [
        "test_minimind_trainer_passes_every_trl_grpo_test_stock_trl_passes",  # slow(minutes=8)
        "test_the_minimind3_demo_learns_minimind3s_reward",  # 5
        "test_the_default_demo_learns_the_reward_models_preference",  # 3
        "test_the_rules_demo_learns_the_format",  # 2
    ]
    assert names[4] == "test_reward_model_prefers_the_property_on_held_out_prompts"  # slow, no minutes given
    fast = names[5:]  # the others follow, in file order
    assert fast.index("test_a_run_too_short_to_learn_exits_1_and_its_summary_says_why") < fast.index(
        "test_bad_arguments_are_rejected"
    )


def test_the_users_of_a_module_fixture_are_one_xdist_group():
    """Under `--dist loadgroup` the tests of one `xdist_group` run on one worker: the module-scoped `cpu_check` (the
    GPU check's CPU form, about a minute) is then built once, not once per worker."""
    grouped = collected("-m", "xdist_group", "tests/test_gpu_check.py")
    users = {f"tests/test_gpu_check.py::{name}" for name in (
        "test_the_cpu_form_runs_the_parts_asked_and_reports_them",
        "test_the_benchmark_reports_both_sides",
        "test_the_compiled_variants_run_on_cpu_through_the_static_cache_and_a_compiled_forward",
    )}  # fmt: skip
    assert set(grouped) == users


GROUPED_MODULE = """
import os
import pytest

@pytest.fixture(scope="module")
def built():
    return os.environ["PYTEST_XDIST_WORKER"]

@pytest.mark.parametrize("i", range(6))
def test_user(built, i):
    pass

@pytest.mark.parametrize("i", range(6))
def test_other(i):
    pass
"""


def test_one_worker_runs_every_user_of_a_module_fixture(tmp_path):
    """The grouping as pytest-xdist applies it (README's options, this conftest's hook): every user of the module
    fixture runs on one worker. pytest 9.2 with pytest-xdist 3.8 ran them on both (the group was dropped)."""
    suite_conftest = str(REPO_ROOT / "tests" / "conftest.py")
    (tmp_path / "conftest.py").write_text(
        "import importlib.util\n"
        f"spec = importlib.util.spec_from_file_location('suite_conftest', {suite_conftest!r})\n"
        "suite = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(suite)\n"
        "pytest_collection_modifyitems = suite.pytest_collection_modifyitems\n"
    )
    (tmp_path / "test_grouped.py").write_text(GROUPED_MODULE)
    env = {key: value for key, value in os.environ.items() if key != "PYTEST_ADDOPTS"}
    completed = subprocess.run(
        [sys.executable, "-m", "pytest", "-v", "-n", "2", "--dist", "loadgroup", "--no-loadscope-reorder",
         "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    workers = {}
    for line in completed.stdout.splitlines():
        if " PASSED " in line:
            worker, test = line.split()[0], line.split()[-1]
            workers.setdefault("user" if "::test_user" in test else "other", []).append(worker)
    assert len(workers["user"]) == 6 and len(set(workers["user"])) == 1, completed.stdout
    assert len(workers["other"]) == 6, completed.stdout


def test_each_xdist_worker_takes_its_share_of_the_cores():
    code = "import conftest, torch; print(torch.get_num_threads())"
    cores = len(os.sched_getaffinity(0))
    for workers, expected in (("2", max(1, cores // 2)), (str(cores + 1), 1)):
        env = {**os.environ, "PYTEST_XDIST_WORKER_COUNT": workers, "PYTHONPATH": str(REPO_ROOT / "tests")}
        printed = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        assert int(printed.stdout.strip()) == expected, (workers, printed.stdout)
