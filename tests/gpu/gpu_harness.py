"""Helpers of the `gpu` tests (tests/gpu): the device they run on, small MiniMind policies, a trainer on that device in
fp32 or bf16, fixed completions in place of sampling, one micro-batch's loss and gradients, and launches that end within
the check's part."""

import copy
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from conftest import free_port
from grpo_fixtures import PROBE_DIR_ENV, REPO_ROOT, subprocess_env
from grpo_fixtures import UNEQUAL_PROMPTS as PROMPTS
from grpo_fixtures import fixed_generation as shared_fixed_generation

DEVICE_ENV = "MINIMIND_TEST_DEVICE"
DEADLINE_ENV = "GPU_CHECK_DEADLINE"  # the part's end, epoch seconds (benchmarks/gpu_check.py exports it)
GENERATIONS = 4
COMPLETION = 12
# MiniMind2 / MiniMind-3, dense / MoE, at a size where bf16 rounding is what it is at MiniMind's own sizes per layer
# (hidden 64: dot products of 64 terms; real models' 768 give errors of the same order per element, see each test)
CASES = {
    "minimind2-dense": dict(),
    "minimind3-dense": dict(minimind_generation="minimind3"),
    "minimind3-moe": dict(minimind_generation="minimind3", use_moe=True, num_experts=4, num_experts_per_tok=2),
}


def chosen_device() -> str:
    return os.environ.get(DEVICE_ENV, "cuda")


def seconds_left(default: float = 600.0, margin: float = 20.0) -> float:
    """A test's own subprocess timeout: what is left of the check's part less `margin`, so that a hung launch times out
    in the test, which reports its output, before the check stops the part and the output is lost."""
    deadline = os.environ.get(DEADLINE_ENV)
    if deadline is None:
        return default
    return max(float(deadline) - time.time() - margin, 1.0)


def run_launch(command: list[str], env: dict, timeout: float) -> subprocess.CompletedProcess:
    """Run a launcher (`accelerate launch`) and its workers in a process group of their own; past `timeout` the whole
    group is killed (a worker waiting on a collective too, which would otherwise hold the GPU and its port) and the
    test fails with what the launch printed."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                               start_new_session=True)  # fmt: skip
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        pytest.fail(f"the launch stopped after {timeout:.0f} s; it printed:\n{(stdout + stderr)[-4000:]}")
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def launch_grpo(config: str, recipe, probe, device: str) -> list:
    """`accelerate launch --config_file recipes/accelerate/<config>.yaml` of `minimind-trl grpo --config recipe` in one
    process on `device` (bf16 on CUDA, the configs' mixed precision), with `grpo_fixtures:RankProbe` writing into
    `probe`; fails the test with the launch's output if it fails. Returns the reader of the probe's records by kind."""
    probe.mkdir()
    command = [
        sys.executable, "-m", "accelerate.commands.launch",
        "--config_file", str(REPO_ROOT / "recipes" / "accelerate" / f"{config}.yaml"),
        "--num_processes", "1", "--mixed_precision", "bf16" if device == "cuda" else "no",
        "--main_process_port", str(free_port()),
        "-m", "minimind_trl.grpo", "--config", str(recipe), "--callbacks", "grpo_fixtures:RankProbe",
    ]  # fmt: skip
    result = run_launch(command, subprocess_env(**{PROBE_DIR_ENV: probe}), timeout=seconds_left())
    assert result.returncode == 0, result.stderr[-4000:]

    def records(kind: str) -> list[dict]:
        return [json.loads(line) for line in (probe / f"{kind}-rank0.jsonl").read_text().splitlines()]

    return records


def tiny_policy(tokenizer, seed: int = 0, **config):
    """A small MiniMind (hidden 64, 2 layers) with MiniMind's own initialisation, in fp32."""
    from minimind_trl import MiniMindConfig, MiniMindForCausalLM

    values = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  intermediate_size=128, vocab_size=len(tokenizer))  # fmt: skip
    torch.manual_seed(seed)
    return MiniMindForCausalLM(MiniMindConfig(**{**values, **config}))


def reward(completions, **kwargs):
    return [float(len(str(c))) % 3 for c in completions]


def build_trainer(tokenizer, tmp_path, model, device: str, bf16: bool, peft_config=None, **overrides):
    """16 completions of 4 prompts per generation batch in one micro-batch of 16, beta > 0 (the reference pass runs),
    on `device` in fp32 or bf16 (autocast over fp32 master weights: accelerate's mixed precision)."""
    from datasets import Dataset

    from minimind_trl.trainer import MiniMindGRPOConfig, MiniMindGRPOTrainer

    values = dict(output_dir=str(tmp_path / f"out-{'bf16' if bf16 else 'fp32'}"), use_cpu=device == "cpu", bf16=bf16,
                  report_to="none", per_device_train_batch_size=16, num_generations=GENERATIONS,
                  max_completion_length=COMPLETION, max_prompt_length=None, beta=0.04, dataloader_num_workers=0,
                  disable_tqdm=True, seed=0, share_prompts=False)  # fmt: skip
    values.update(overrides)
    rows = [{"prompt": [{"role": "user", "content": text}]} for text in PROMPTS]
    trainer = MiniMindGRPOTrainer(
        copy.deepcopy(model), reward, MiniMindGRPOConfig(**values), train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer, peft_config=peft_config,
    )  # fmt: skip
    assert trainer.accelerator.device.type == device, (trainer.accelerator.device, device)
    return trainer


def move_away_from_reference(trainer, scale: float = 0.02, seed: int = 5) -> None:
    """Add the same fixed noise to the policy of every trainer built from one model, so that the KL term is not 0."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in trainer.model.parameters():
            noise = torch.randn(parameter.shape, generator=generator) * scale
            parameter.add_(noise.to(parameter.device, parameter.dtype))


def fixed_generation(trainer, tokenizer, seed: int = 3):
    """Sampling replaced by the same fixed completions (EOS at varied places) in every trainer."""
    shared_fixed_generation(trainer, tokenizer, COMPLETION, seed)


def batch() -> list[dict]:
    return [{"prompt": [{"role": "user", "content": text}]} for text in PROMPTS for _ in range(GENERATIONS)]


def one_step(trainer, tokenizer, shared: bool | None = None, seed: int = 3):
    """The generation batch scored (reference log-probs, advantages), its loss and the gradients, on the CPU in fp32
    for comparison; `shared` forces the prompt-sharing switch."""
    if shared is not None:
        trainer._shares_prompts = shared
    if not getattr(trainer, "_prepared_by_harness", False):  # as `train()` prepares it: accelerate's autocast in bf16
        trainer.model = trainer.model_wrapped = trainer.accelerator.prepare_model(trainer.model)
        trainer._prepared_by_harness = True
    fixed_generation(trainer, tokenizer, seed)
    trainer.model.train()
    trainer.model.zero_grad()
    trainer.current_gradient_accumulation_steps = 1
    torch.manual_seed(0)
    inputs = trainer._generate_and_score_completions(batch())
    with trainer.compute_loss_context_manager():  # as Trainer.training_step calls it
        loss = trainer.compute_loss(trainer.model, inputs)
    trainer.accelerator.backward(loss)
    grads = {name: p.grad.detach().float().cpu() for name, p in trainer.model.named_parameters() if p.grad is not None}
    host = {k: v.detach().float().cpu() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    return host, loss.detach().float().cpu(), grads


def relative(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return ((actual - expected).norm() / expected.norm().clamp(min=1e-30)).item()


def flat(grads: dict) -> torch.Tensor:
    return torch.cat([grads[name].flatten() for name in sorted(grads)])
