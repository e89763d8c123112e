"""`accelerate launch` with FSDP2 (recipes/accelerate/fsdp.yaml) on one device, a few steps of `minimind-trl grpo`: FSDP
in force (every parameter a DTensor), generation every step, a checkpoint, and the whole weights gathered at the end into
a MiniMind folder with its native .pth. On CUDA in bf16 (the config's mixed precision); the CPU body runs gloo and fp32
(the two-process run on CPU, with its exact resume, is tests/trainer/test_fsdp_launch.py)."""

import json

import pytest
import torch
from gpu_harness import launch_grpo
from grpo_fixtures import build_tiny_policy, tiny_recipe, write_rlaif
from safetensors.torch import load_file

pytestmark = pytest.mark.gpu

STEPS = 3


def test_fsdp_on_one_device_trains_generates_and_saves_whole_weights(tmp_path, device):
    policy = build_tiny_policy(tmp_path / "policy")
    recipe = tiny_recipe(tmp_path, policy, write_rlaif(tmp_path / "rlaif.jsonl"), max_steps=STEPS,
                         use_cpu=device == "cpu", bf16=device == "cuda", save_strategy="steps", save_steps=2,
                         save_native_pth=True)  # fmt: skip
    records = launch_grpo("fsdp", recipe, tmp_path / "probe", device)

    (layout,) = records("layout")
    assert layout["distributed_type"] == "DistributedType.FSDP" and layout["partitioned_params"] == 20
    assert [row["step"] for row in records("steps")] == list(range(1, STEPS + 1))
    rewards = records("rewards")  # generation ran every step, the parameters gathered by FSDP
    assert len(rewards) == STEPS and all(len(row["lengths"]) == 8 and min(row["lengths"]) >= 1 for row in rewards)
    initial = load_file(policy / "model.safetensors")
    for folder in (tmp_path / "out", tmp_path / "out" / "checkpoint-2"):
        saved = load_file(folder / "model.safetensors")
        assert {k: v.shape for k, v in saved.items()} == {k: v.shape for k, v in initial.items()}, folder
        auto_map = json.loads((folder / "config.json").read_text())["auto_map"]
        assert auto_map["AutoModelForCausalLM"] == "modeling_minimind.MiniMindForCausalLM", folder
        native = torch.load(folder / "grpo_32.pth", weights_only=True)
        assert all(torch.equal(native[key], value.half()) for key, value in saved.items()), folder
    saved = load_file(tmp_path / "out" / "model.safetensors")
    assert (tmp_path / "out" / "checkpoint-2" / "pytorch_model_fsdp.bin").is_file()
    # moved by training, not by rounding (bf16 rounding alone moves these by up to ~2.4e-4)
    assert max((saved[k].float() - initial[k].to(saved[k].dtype).float()).abs().max().item() for k in initial) > 1e-3
