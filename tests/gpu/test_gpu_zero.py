"""`accelerate launch` with DeepSpeed ZeRO-2 and ZeRO-3 (recipes/accelerate/zero2.yaml, zero3.yaml) on one device, a few
steps of `minimind-trl grpo` each: the stage in force, ZeRO-3's parameters partitioned and gathered for generation,
every step trained, the saved weights moved. On CUDA in bf16 (the configs' mixed precision); the CPU body runs gloo and
fp32 (DeepSpeed's CPU path, as tests/trainer/test_distributed.py)."""

import pytest
from gpu_harness import launch_grpo
from grpo_fixtures import build_tiny_policy, tiny_recipe, write_rlaif
from safetensors.torch import load_file

pytestmark = pytest.mark.gpu

STEPS = 3


@pytest.mark.parametrize("stage", [2, 3])
def test_zero_on_one_device_trains_and_generates(tmp_path, device, stage):
    policy = build_tiny_policy(tmp_path / "policy")
    recipe = tiny_recipe(tmp_path, policy, write_rlaif(tmp_path / "rlaif.jsonl"), max_steps=STEPS,
                         use_cpu=device == "cpu", bf16=device == "cuda", save_strategy="no")  # fmt: skip
    records = launch_grpo(f"zero{stage}", recipe, tmp_path / "probe", device)

    (layout,) = records("layout")
    assert layout["zero_stage"] == stage and layout["distributed_type"] == "DistributedType.DEEPSPEED"
    assert (layout["partitioned_params"] > 0) == (stage == 3)  # ZeRO-3 holds its parameters as DeepSpeed shards
    assert [row["step"] for row in records("steps")] == list(range(1, STEPS + 1))
    rewards = records("rewards")  # generation ran every step (under ZeRO-3 with its parameters gathered)
    assert len(rewards) == STEPS and all(len(row["lengths"]) == 8 and min(row["lengths"]) >= 1 for row in rewards)
    saved, initial = load_file(tmp_path / "out" / "model.safetensors"), load_file(policy / "model.safetensors")
    assert all(saved[k].shape == v.shape for k, v in initial.items())  # whole weights (a tied head may be written too)
    # moved by training, not by rounding: in bf16 DeepSpeed saves its bf16 copy, so against the initial weights rounded
    # the same way (bf16 rounding alone moves these by up to ~2.4e-4)
    assert max((saved[k].float() - initial[k].to(saved[k].dtype).float()).abs().max().item() for k in initial) > 1e-4
