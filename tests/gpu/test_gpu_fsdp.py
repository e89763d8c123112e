"""`accelerate launch` with FSDP2 (recipes/accelerate/fsdp.yaml) on one device, a few steps of `minimind-trl grpo`: FSDP
in force (every parameter a DTensor), generation every step, a checkpoint, and the whole weights gathered at the end into
a MiniMind folder with its native .pth. On CUDA in bf16 (the config's mixed precision); the CPU body runs gloo and fp32
(the two-process run on CPU, with its exact resume, is tests/trainer/test_fsdp_launch.py)."""

import json
import sys

import pytest
import torch
from conftest import free_port
from gpu_harness import run_launch, seconds_left
from grpo_fixtures import PROBE_DIR_ENV, REPO_ROOT, build_tiny_policy, subprocess_env, tiny_recipe, write_rlaif
from safetensors.torch import load_file

pytestmark = pytest.mark.gpu

STEPS = 3


def records(probe, kind: str) -> list[dict]:
    return [json.loads(line) for line in (probe / f"{kind}-rank0.jsonl").read_text().splitlines()]


def test_fsdp_on_one_device_trains_generates_and_saves_whole_weights(tmp_path, device):
    policy = build_tiny_policy(tmp_path / "policy")
    recipe = tiny_recipe(tmp_path, policy, write_rlaif(tmp_path / "rlaif.jsonl"), max_steps=STEPS,
                         use_cpu=device == "cpu", bf16=device == "cuda", save_strategy="steps", save_steps=2,
                         save_native_pth=True)  # fmt: skip
    probe = tmp_path / "probe"
    probe.mkdir()
    command = [
        sys.executable, "-m", "accelerate.commands.launch",
        "--config_file", str(REPO_ROOT / "recipes" / "accelerate" / "fsdp.yaml"),
        "--num_processes", "1", "--mixed_precision", "bf16" if device == "cuda" else "no",
        "--main_process_port", str(free_port()),
        "-m", "minimind_trl.grpo", "--config", str(recipe), "--callbacks", "grpo_fixtures:RankProbe",
    ]  # fmt: skip
    result = run_launch(command, subprocess_env(**{PROBE_DIR_ENV: probe}), timeout=seconds_left())
    assert result.returncode == 0, result.stderr[-4000:]

    (layout,) = records(probe, "layout")
    assert layout["distributed_type"] == "DistributedType.FSDP" and layout["partitioned_params"] == 20
    assert [row["step"] for row in records(probe, "steps")] == list(range(1, STEPS + 1))
    rewards = records(probe, "rewards")  # generation ran every step, the parameters gathered by FSDP
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
