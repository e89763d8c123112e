"""benchmarks/vllm_rollouts.py's vLLM side runs end to end at a toy size (figures: docs/benchmarks.md)."""

import subprocess
import sys

import pytest
from vllm_support import HERE, _vllm_installed  # noqa: F401  (the fixture skips or fails without vLLM)

pytestmark = pytest.mark.vllm


def test_both_sides_run_and_report():
    script = HERE.parent.parent / "benchmarks" / "vllm_rollouts.py"
    completed = subprocess.run([sys.executable, str(script), "--size", "demo", "--prompts", "1", "--generations", "2",
                                "--new-tokens", "8", "--repeats", "1"], capture_output=True, text=True, timeout=900)  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-5000:]
    summary = __import__("json").loads(completed.stdout.strip().splitlines()[-1])
    assert summary["vllm_rollouts_per_s"] > 0 and summary["lean_rollouts_per_s"] > 0 and summary["vllm_over_lean"] > 0
