"""What the trainer's tests share: a tiny MiniMind policy and config, a fixed batch fed through the trainer's own
generate-and-score code, and the accelerate configs of the launched runs (their free port: conftest.free_port). Here,
at the tests' root, so any test folder imports it (the test modules are imported by name, not as a package)."""

import torch
from grpo_fixtures import REPO_ROOT

from minimind_trl.models.minimind.tiny import tiny_minimind_model
from minimind_trl.trainer import MiniMindGRPOConfig

PAD, EOS = 0, 2
PROMPTS = (
    "What is the capital of France? Please think step by step.",
    "Explain why the sky is blue, then write a short poem.",
)


def tiny_model(tokenizer, use_moe=False, seed=0):
    """The package's tiny MiniMind2, with a MoE of 4 experts when asked."""
    return tiny_minimind_model(
        len(tokenizer), seed=seed, use_moe=use_moe, num_experts=4, num_experts_per_tok=2,
        router_aux_loss_coef=0.1,  # large enough that a missing or doubled aux loss shows in the loss
    )


def grpo_config(tmp_path, **overrides):
    values = dict(
        output_dir=str(tmp_path / "out"),
        use_cpu=True,
        bf16=False,
        report_to="none",
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=7,
        max_prompt_length=6,
        dataloader_num_workers=0,
        disable_tqdm=True,
        seed=0,
    )
    values.update(overrides)
    return MiniMindGRPOConfig(**values)


def seed_completion_mask(completion_ids):
    is_eos = completion_ids == EOS
    eos_idx = torch.full((is_eos.size(0),), is_eos.size(1), dtype=torch.long)
    eos_idx[is_eos.any(dim=1)] = is_eos.int().argmax(dim=1)[is_eos.any(dim=1)]
    return (torch.arange(is_eos.size(1)).expand(is_eos.size(0), -1) <= eos_idx.unsqueeze(1)).int()


def fixed_batch(tokenizer, masked, num_generations=4, length=7, seed=1):
    generator = torch.Generator().manual_seed(seed)
    num_rows = len(PROMPTS) * num_generations
    completions = torch.randint(3, len(tokenizer), (num_rows, length), generator=generator)
    if masked:  # first EOS at varied positions (and one row without EOS); what follows is padding
        for row, eos_at in enumerate([2, 6, 0, 4, 3, 5, 1]):
            completions[row, eos_at] = EOS
    rewards = torch.tensor([0.0, 0.25, 1.5, 0.5, 0.75, 0.75, 2.0, -1.0])
    rows = [{"prompt": PROMPTS[i // num_generations], "fixed_reward": rewards[i].item()} for i in range(num_rows)]
    return rows, completions, rewards


def fixed_reward(completions, fixed_reward, **kwargs):
    return list(fixed_reward)


def stub_generation(trainer, completions, expected_prompt_length):
    """Replace sampling by the fixed completions, cut after the first EOS as TRL's generate path does."""

    def generate(prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        assert {len(ids) for ids in prompt_ids} == {expected_prompt_length}
        mask = seed_completion_mask(completions).bool()
        return [row[m].tolist() for row, m in zip(completions, mask, strict=True)], None

    trainer._generate_single_turn = generate


def assert_relative(actual, expected, tolerance, what):
    error = (actual - expected).norm() / expected.norm().clamp(min=1e-30)
    assert error <= tolerance, f"{what}: relative error {error.item():.3g}"


ACCELERATE_CONFIGS = REPO_ROOT / "recipes" / "accelerate"
