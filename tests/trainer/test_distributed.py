"""`accelerate launch -m minimind_trl.grpo` for real on CPU (gloo): DDP and DeepSpeed ZeRO-3 on 2 processes,
ZeRO-2 + LoRA on 1, a 2-process checkpoint resumed on 1 process, and a batch ZeRO-3 cannot split.

Every rank writes what it sees (process layout, parameter partitioning, prompts, completion lengths, steps,
final weights) into JSON lines through `grpo_fixtures:RankProbe` / `grpo_fixtures:token_reward`; the tests
assert on those files. These are the slow tests of the suite (`-m slow`); DeepSpeed JIT-builds its CPU
communication op with ninja on first use (cached in ~/.cache/torch_extensions afterwards).
"""

import json
import re
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest
from grpo_fixtures import (
    PROBE_DIR_ENV,
    REPO_ROOT,
    build_tiny_policy,
    build_tiny_reward_model,
    subprocess_env,
    tiny_recipe,
    write_rlaif,
)
from safetensors.torch import load_file

pytestmark = pytest.mark.slow

ACCELERATE_CONFIGS = REPO_ROOT / "recipes" / "accelerate"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch(config: str, num_processes: int, recipe: Path, probe_dir: Path, *args: str) -> subprocess.CompletedProcess:
    """`accelerate launch --config_file recipes/accelerate/<config>.yaml -m minimind_trl.grpo --config recipe`,
    with the GPU recipe's process count and precision overridden for this CPU machine."""
    command = [
        sys.executable, "-m", "accelerate.commands.launch",
        "--config_file", str(ACCELERATE_CONFIGS / f"{config}.yaml"),
        "--num_processes", str(num_processes),
        "--mixed_precision", "no",
        "--main_process_port", str(free_port()),
        "-m", "minimind_trl.grpo",
        "--config", str(recipe),
        "--callbacks", "grpo_fixtures:RankProbe",
        *args,
    ]  # fmt: skip
    env = subprocess_env(**{PROBE_DIR_ENV: probe_dir, "OMP_NUM_THREADS": 1})
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)


def records(probe_dir: Path, kind: str, rank: int) -> list[dict]:
    path = probe_dir / f"{kind}-rank{rank}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("distributed")
    return SimpleNamespace(
        root=root,
        policy=build_tiny_policy(root / "policy"),
        reward_model=build_tiny_reward_model(root / "reward_model"),
        data=write_rlaif(root / "rlaif.jsonl"),
    )


def run_dir(setup, name: str) -> Path:
    folder = setup.root / name
    (folder / "probe").mkdir(parents=True)
    return folder


@pytest.fixture(scope="module")
def ddp(setup):
    """2 processes x 4 completions (1 prompt each) = the 8-completion global batch, checkpoint at every step."""
    folder = run_dir(setup, "ddp")
    recipe = tiny_recipe(
        folder, setup.policy, setup.data, per_device_train_batch_size=4, save_strategy="steps", save_steps=1
    )
    result = launch("ddp", 2, recipe, folder / "probe")
    assert result.returncode == 0, result.stderr[-4000:]
    return SimpleNamespace(folder=folder, probe=folder / "probe", out=folder / "out", recipe=recipe)


def test_ddp_two_processes(ddp):
    layouts = [records(ddp.probe, "layout", rank)[0] for rank in (0, 1)]
    for rank, layout in enumerate(layouts):
        assert layout["rank"] == rank and layout["world_size"] == 2 and layout["backend"] == "gloo"
        assert layout["distributed_type"] == "DistributedType.MULTI_CPU" and layout["partitioned_params"] == 0
        assert layout["local_numel"] == layout["full_numel"]  # DDP: every rank holds the whole model
    for rank in (0, 1):
        assert [row["step"] for row in records(ddp.probe, "steps", rank)] == [1, 2]
        rows = records(ddp.probe, "rewards", rank)
        assert [len(row["prompts"]) for row in rows] == [4, 4] and all(len(set(row["prompts"])) == 1 for row in rows)
    # The ranks generated for different prompts but end with identical weights: gradients were averaged.
    prompts = [[row["prompts"][0] for row in records(ddp.probe, "rewards", rank)] for rank in (0, 1)]
    assert all(a != b for a, b in zip(prompts[0], prompts[1]))
    finals = [records(ddp.probe, "final", rank)[0]["checksum"] for rank in (0, 1)]
    assert finals[0] == pytest.approx(finals[1], rel=1e-12)
    for step in (1, 2):
        checkpoint = ddp.out / f"checkpoint-{step}"
        assert (checkpoint / "rng_state_0.pth").is_file() and (checkpoint / "rng_state_1.pth").is_file()


def test_two_process_checkpoint_resumes_on_one_process(ddp, setup, capsys):
    """The seed's resume handled a changed world size; here the global batch stays 8 completions, so the single
    process continues with exactly the prompts the two processes would have drawn at step 2."""
    from minimind_trl.grpo import main

    folder = run_dir(setup, "resumed-on-one")
    common = ["--config", str(ddp.recipe), "--output_dir", str(folder / "out")]
    checkpoint = str(ddp.out / "checkpoint-1")

    assert main([*common, "--resume_from_checkpoint", checkpoint]) == 2  # per-device batch unchanged: refused
    assert "set per_device_train_batch_size=8" in capsys.readouterr().err

    patch = pytest.MonkeyPatch()
    patch.setenv(PROBE_DIR_ENV, str(folder / "probe"))
    try:
        args = [*common, "--resume_from_checkpoint", checkpoint, "--per_device_train_batch_size", "8"]
        assert main(args) == 0
    finally:
        patch.undo()

    (resumed_row,) = records(folder / "probe", "rewards", 0)  # one step left after the checkpoint
    assert resumed_row["step"] == 1
    both_ranks = [records(ddp.probe, "rewards", rank)[1]["prompts"] for rank in (0, 1)]
    assert Counter(resumed_row["prompts"]) == Counter(both_ranks[0] + both_ranks[1])
    state = json.loads((folder / "out" / "checkpoint-2" / "trainer_state.json").read_text())
    assert state["global_step"] == 2 and [entry.get("step") for entry in state["log_history"][:2]] == [1, 2]
    start = load_file(ddp.out / "checkpoint-1" / "model.safetensors")
    end = load_file(folder / "out" / "model.safetensors")
    assert max((end[k] - start[k]).abs().max().item() for k in start) > 1e-4


@pytest.fixture(scope="module")
def zero3(setup):
    """2 processes under ZeRO-3, with a (whole, unpartitioned) reward model, a checkpoint at every step and the
    seed's native .pth at every save (zero3_save_16bit_model in recipes/accelerate/zero3.yaml allows it)."""
    folder = run_dir(setup, "zero3")
    recipe = tiny_recipe(
        folder,
        setup.policy,
        setup.data,
        per_device_train_batch_size=4,
        reward_funcs=["format", "grpo_fixtures:token_reward", "reward_model"],
        reward_model_name_or_path=str(setup.reward_model),
        save_strategy="steps",
        save_steps=1,
        save_native_pth=True,
    )
    result = launch("zero3", 2, recipe, folder / "probe")
    assert result.returncode == 0, result.stderr[-4000:]
    return SimpleNamespace(folder=folder, probe=folder / "probe", out=folder / "out", recipe=recipe)


def test_zero3_two_processes_partition_and_generate(setup, zero3):
    folder, probe = zero3.folder, zero3.probe
    layouts = [records(probe, "layout", rank)[0] for rank in (0, 1)]
    from minimind_trl import MiniMindForCausalLM

    full = sum(p.numel() for p in MiniMindForCausalLM.from_pretrained(setup.policy).parameters())
    for rank, layout in enumerate(layouts):
        assert layout["world_size"] == 2 and layout["zero_stage"] == 3
        assert layout["distributed_type"] == "DistributedType.DEEPSPEED"
        assert layout["partitioned_params"] > 0 and layout["full_numel"] == full
        # each rank holds about half of the parameters (ZeRO-3 pads each tensor to a multiple of the world size)
        assert full / 2 <= layout["local_numel"] <= full / 2 + layout["partitioned_params"]
    for rank in (0, 1):
        assert [row["step"] for row in records(probe, "steps", rank)] == [1, 2]
        rows = records(probe, "rewards", rank)  # generation ran under ZeRO-3 (parameters gathered)
        assert len(rows) == 2 and all(len(row["lengths"]) == 4 and min(row["lengths"]) >= 1 for row in rows)

    out = folder / "out"
    saved = load_file(out / "model.safetensors")  # whole weights gathered at save (zero3_save_16bit_model)
    initial = load_file(setup.policy / "model.safetensors")
    assert {k: v.shape for k, v in saved.items()} == {k: v.shape for k, v in initial.items()}
    assert max((saved[k].float() - initial[k]).abs().max().item() for k in initial) > 1e-4
    card = (out / "README.md").read_text()
    assert "| reward_model (`" in card


def test_zero3_native_pth_holds_the_whole_saved_weights(zero3):
    """The .pth is read back from the gathered safetensors on one process: not ZeRO-3 partitioned (empty)."""
    import torch

    for folder in (zero3.out, zero3.out / "checkpoint-2"):
        saved = load_file(folder / "model.safetensors")
        native = torch.load(folder / "grpo_32.pth", weights_only=True)
        assert native["lm_head.weight"].shape == saved["model.embed_tokens.weight"].shape  # tied, written twice
        for key, value in saved.items():
            assert native[key].shape == value.shape and native[key].numel() > 0, key
            assert torch.equal(native[key], value.half()), key


def test_zero3_resume_from_a_deepspeed_checkpoint_is_exact(setup, zero3):
    folder = run_dir(setup, "zero3-resumed")
    checkpoint = zero3.out / "checkpoint-1"
    assert (checkpoint / "rng_state_0.pth").is_file() and list(checkpoint.glob("global_step1/*optim_states.pt"))
    args = ["--resume_from_checkpoint", str(checkpoint), "--output_dir", str(folder / "out")]
    result = launch("zero3", 2, zero3.recipe, folder / "probe", *args)
    assert result.returncode == 0, result.stderr[-4000:]
    resumed, straight = load_file(folder / "out" / "model.safetensors"), load_file(zero3.out / "model.safetensors")
    assert max((resumed[k] - straight[k]).abs().max().item() for k in straight) <= 1e-6
    for rank in (0, 1):  # the resumed ranks sampled exactly what the uninterrupted ranks sampled at step 2
        assert records(folder / "probe", "rewards", rank) == records(zero3.probe, "rewards", rank)[1:]


def test_zero2_one_process_with_lora(setup):
    from minimind_trl.cli import run_command

    folder = run_dir(setup, "zero2-lora")
    recipe = tiny_recipe(folder, setup.policy, setup.data)
    lora = ["--use_peft", "true", "--lora_r", "4", "--lora_alpha", "8", "--lora_target_modules", "q_proj", "v_proj"]
    result = launch("zero2", 1, recipe, folder / "probe", *lora)
    assert result.returncode == 0, result.stderr[-4000:]

    (layout,) = records(folder / "probe", "layout", 0)
    assert layout["zero_stage"] == 2 and layout["world_size"] == 1 and layout["peft"] == "PeftModelForCausalLM"
    rank, hidden, q_out, v_out = 4, 32, 32, 16  # v_proj: 2 key/value heads x head_dim 8
    lora_params = 2 * (rank * hidden + q_out * rank + rank * hidden + v_out * rank)  # 2 layers x (A + B) x (q, v)
    assert layout["trainable"] == lora_params
    assert [row["step"] for row in records(folder / "probe", "steps", 0)] == [1, 2]
    adapter = folder / "out"
    assert (adapter / "adapter_model.safetensors").is_file()
    assert run_command("merge-lora", [str(adapter), str(folder / "merged")]) == 0
    assert (folder / "merged" / "model.safetensors").is_file()


def test_zero3_batch_that_two_processes_cannot_split(setup):
    folder = run_dir(setup, "zero3-bad-batch")
    recipe = tiny_recipe(folder, setup.policy, setup.data, model_name_or_path="./never/loaded")
    result = launch("zero3", 2, recipe, folder / "probe", "--per_device_train_batch_size", "3")
    assert result.returncode != 0  # the launcher's own code; the ranks' is in its report
    assert re.search(r"Root Cause.*?exitcode\s*:\s*2\b", result.stderr, re.S), result.stderr[-2000:]
    assert "minimind-trl grpo: error: invalid arguments" in result.stderr
    assert "generation_batch_size (6) must be divisible by num_generations (4)" in result.stderr
    assert "[2 process(es):" in result.stderr
    # refused at parsing: the policy path (which does not exist) was never even checked, let alone loaded
    assert "never/loaded" not in result.stderr
    assert not list((folder / "probe").iterdir())  # no rank got as far as training


def test_slurm_script_launches_accelerate_on_every_node(tmp_path):
    """recipes/slurm/grpo.sbatch with stand-ins for srun/scontrol/accelerate that print what they would run."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text('#!/bin/bash\nprintf "node-a\\nnode-b\\n"\n')
    (bin_dir / "srun").write_text('#!/bin/bash\nshift\nfor id in 0 1; do SLURM_NODEID=$id "$@"; done\n')
    (bin_dir / "accelerate").write_text('#!/bin/bash\necho "accelerate $*"\n')
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "SLURM_JOB_NODELIST": "node-[a-b]", "SLURM_NNODES": "2"}
    script = REPO_ROOT / "recipes" / "slurm" / "grpo.sbatch"
    result = subprocess.run(
        ["bash", str(script), "recipes/minimind2/grpo/reasoning.yaml", "--learning_rate", "1e-6"],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO_ROOT,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 2
    for node, line in enumerate(lines):
        assert line == (
            "accelerate launch --config_file recipes/accelerate/zero2.yaml --num_machines 2 --num_processes 16 "
            f"--machine_rank {node} --main_process_ip node-a --main_process_port 29500 --rdzv_backend c10d "
            "-m minimind_trl.grpo --config recipes/minimind2/grpo/reasoning.yaml --learning_rate 1e-6"
        )
