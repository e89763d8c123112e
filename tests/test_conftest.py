"""tests/conftest.py's share of the suite's running: the slow tests are collected first, the longest first, and under
pytest-xdist each worker's torch takes its share of the cores (README's test command runs two workers)."""

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
    assert fast.index("test_demo_exits_cleanly") < fast.index("test_bad_arguments_are_rejected")


def test_each_xdist_worker_takes_its_share_of_the_cores():
    code = "import conftest, torch; print(torch.get_num_threads())"
    cores = len(os.sched_getaffinity(0))
    for workers, expected in (("2", max(1, cores // 2)), (str(cores + 1), 1)):
        env = {**os.environ, "PYTEST_XDIST_WORKER_COUNT": workers, "PYTHONPATH": str(REPO_ROOT / "tests")}
        printed = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        assert int(printed.stdout.strip()) == expected, (workers, printed.stdout)
