"""`accelerate launch` with DeepSpeed ZeRO-2 and ZeRO-3 (recipes/accelerate/zero2.yaml, zero3.yaml) on one device, a few
steps of `minimind-trl grpo` each: the stage in force, ZeRO-3's parameters partitioned and gathered for generation,
every step trained, the saved weights moved. On CUDA in bf16 (the configs' mixed precision); the CPU body runs gloo and
fp32 (DeepSpeed's CPU path, as tests/trainer/test_distributed.py)."""

import json
import sys

import pytest
from conftest import free_port
from gpu_harness import run_launch, seconds_left
from grpo_fixtures import PROBE_DIR_ENV, REPO_ROOT, build_tiny_policy, subprocess_env, tiny_recipe, write_rlaif
from safetensors.torch import load_file

pytestmark = pytest.mark.gpu

STEPS = 3


def records(probe, kind: str) -> list[dict]:
    return [json.loads(line) for line in (probe / f"{kind}-rank0.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("stage", [2, 3])
def test_zero_on_one_device_trains_and_generates(tmp_path, device, stage):
    policy = build_tiny_policy(tmp_path / "policy")
    recipe = tiny_recipe(tmp_path, policy, write_rlaif(tmp_path / "rlaif.jsonl"), max_steps=STEPS,
                         use_cpu=device == "cpu", bf16=device == "cuda", save_strategy="no")  # fmt: skip
    probe = tmp_path / "probe"
    probe.mkdir()
    command = [
        sys.executable, "-m", "accelerate.commands.launch",
        "--config_file", str(REPO_ROOT / "recipes" / "accelerate" / f"zero{stage}.yaml"),
        "--num_processes", "1", "--mixed_precision", "bf16" if device == "cuda" else "no",
        "--main_process_port", str(free_port()),
        "-m", "minimind_trl.grpo", "--config", str(recipe), "--callbacks", "grpo_fixtures:RankProbe",
    ]  # fmt: skip
    result = run_launch(command, subprocess_env(**{PROBE_DIR_ENV: probe}), timeout=seconds_left())
    assert result.returncode == 0, result.stderr[-4000:]

    (layout,) = records(probe, "layout")
    assert layout["zero_stage"] == stage and layout["distributed_type"] == "DistributedType.DEEPSPEED"
    assert (layout["partitioned_params"] > 0) == (stage == 3)  # ZeRO-3 holds its parameters as DeepSpeed shards
    assert [row["step"] for row in records(probe, "steps")] == list(range(1, STEPS + 1))
    rewards = records(probe, "rewards")  # generation ran every step (under ZeRO-3 with its parameters gathered)
    assert len(rewards) == STEPS and all(len(row["lengths"]) == 8 and min(row["lengths"]) >= 1 for row in rewards)
    saved, initial = load_file(tmp_path / "out" / "model.safetensors"), load_file(policy / "model.safetensors")
    assert all(saved[k].shape == v.shape for k, v in initial.items())  # whole weights (a tied head may be written too)
    # moved by training, not by rounding: in bf16 DeepSpeed saves its bf16 copy, so against the initial weights rounded
    # the same way (bf16 rounding alone moves these by up to ~2.4e-4)
    assert max((saved[k].float() - initial[k].to(saved[k].dtype).float()).abs().max().item() for k in initial) > 1e-4
