"""MiniMindGRPOTrainer: the seed's arithmetic through TRL's own code paths, and short real train() runs."""

import copy
import gc
import math

import pytest
import torch
from datasets import Dataset

from minimind_trl import MiniMindConfig, MiniMindForCausalLM
from minimind_trl.tokenization import build_minimind_tokenizer
from minimind_trl.trainer import MiniMindGRPOConfig, MiniMindGRPOTrainer

PAD, EOS = 0, 2
PROMPTS = ("What is the capital of France? Please think step by step.", "Explain why the sky is blue, then write a short poem.")


@pytest.fixture(scope="module")
def tokenizer():
    return build_minimind_tokenizer()


def tiny_model(tokenizer, use_moe=False, seed=0):
    torch.manual_seed(seed)
    config = MiniMindConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        vocab_size=len(tokenizer),
        use_moe=use_moe,
        num_experts=4,
        num_experts_per_tok=2,
        router_aux_loss_coef=0.1,  # large enough that a missing or doubled aux loss shows in the loss
    )
    return MiniMindForCausalLM(config)


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


# --- the seed's arithmetic, written in the test from the spec's formulas ------------------------------


def seed_advantages(rewards, num_generations):
    grouped = rewards.view(-1, num_generations)
    mean_r = grouped.mean(dim=1).repeat_interleave(num_generations)
    std_r = grouped.std(dim=1).repeat_interleave(num_generations)
    advantages = torch.clamp((rewards - mean_r) / (std_r + 1e-4), -10, 10)
    return (advantages - advantages.mean()) / (advantages.std() + 1e-8)


def seed_completion_mask(completion_ids):
    is_eos = completion_ids == EOS
    eos_idx = torch.full((is_eos.size(0),), is_eos.size(1), dtype=torch.long)
    eos_idx[is_eos.any(dim=1)] = is_eos.int().argmax(dim=1)[is_eos.any(dim=1)]
    return (torch.arange(is_eos.size(1)).expand(is_eos.size(0), -1) <= eos_idx.unsqueeze(1)).int()


def seed_per_token_logps(model, input_ids, n_keep, attention_mask):
    """One full log-softmax per row over the last n_keep positions (the seed's get_per_token_logps)."""
    logits = model(input_ids, attention_mask=attention_mask, logits_to_keep=n_keep + 1).logits[:, :-1, :]
    rows = [
        torch.gather(row_logits.log_softmax(dim=-1), 1, row_ids.unsqueeze(1)).squeeze(1)
        for row_logits, row_ids in zip(logits, input_ids[:, -n_keep:])
    ]
    return torch.stack(rows)


def seed_loss(policy, reference, input_ids, completion_ids, rewards, num_generations, beta, accumulation, masked):
    n_keep = completion_ids.size(1)
    completion_mask = seed_completion_mask(completion_ids)
    # The seed passes no attention mask; it only matters where padding follows the first EOS, and there we
    # apply the seed's arithmetic to correctly masked log-probs (a documented deviation).
    attention_mask = torch.cat([torch.ones_like(input_ids[:, :-n_keep]), completion_mask], dim=1) if masked else None
    per_token_logps = seed_per_token_logps(policy, input_ids, n_keep, attention_mask)
    aux_loss = policy(input_ids, attention_mask=attention_mask).aux_loss if policy.config.use_moe else torch.tensor(0.0)
    with torch.no_grad():
        ref_per_token_logps = seed_per_token_logps(reference, input_ids, n_keep, attention_mask)
    advantages = seed_advantages(rewards, num_generations)
    kl_div = ref_per_token_logps - per_token_logps
    per_token_kl = torch.exp(kl_div) - kl_div - 1
    per_token_loss = -(torch.exp(per_token_logps - per_token_logps.detach()) * advantages.unsqueeze(1) - beta * per_token_kl)
    policy_loss = ((per_token_loss * completion_mask).sum(dim=1) / completion_mask.sum(dim=1)).mean()
    return (policy_loss + aux_loss) / accumulation


# --- a deterministic batch through the trainer's own generate-and-score and loss code -----------------


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
        return [row[m].tolist() for row, m in zip(completions, mask)], None

    trainer._generate_single_turn = generate


def assert_relative(actual, expected, tolerance, what):
    error = (actual - expected).norm() / expected.norm().clamp(min=1e-30)
    assert error <= tolerance, f"{what}: relative error {error.item():.3g}"


@pytest.mark.parametrize(
    "use_moe, masked, accumulation",
    [(False, True, 2), (True, True, 2), (False, False, 1), (True, False, 1)],
    ids=["dense-eos", "moe-eos", "dense-full", "moe-full"],
)
def test_loss_and_gradients_equal_seed_arithmetic(tokenizer, tmp_path, use_moe, masked, accumulation):
    model = tiny_model(tokenizer, use_moe)
    reference = copy.deepcopy(model).eval()
    rows, completions, rewards = fixed_batch(tokenizer, masked)
    args = grpo_config(tmp_path, gradient_accumulation_steps=accumulation, temperature=0.8)
    trainer = MiniMindGRPOTrainer(model, fixed_reward, args, train_dataset=Dataset.from_list(rows), processing_class=tokenizer)
    with torch.no_grad():  # move the policy away from the reference so the KL term is not zero
        for parameter in trainer.model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.02)
    stub_generation(trainer, completions, expected_prompt_length=6)

    forwards = []
    trainer.model.model.register_forward_hook(lambda *_: forwards.append(torch.is_grad_enabled()))
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = accumulation  # set per window by Trainer's training loop
    inputs = trainer._generate_and_score_completions(rows)
    assert forwards == []  # no old-log-prob forward of the policy (num_iterations=1, one generation per step)
    loss = trainer.compute_loss(trainer.model, inputs)
    loss.backward()
    assert forwards == [True]  # one policy forward gives the log-probs and the MoE aux loss

    policy = MiniMindForCausalLM(model.config)
    policy.load_state_dict(trainer.model.state_dict())
    policy.train()
    prompt_ids = torch.tensor([tokenizer(text)["input_ids"][-6:] for text in PROMPTS]).repeat_interleave(4, dim=0)
    completion_ids = completions.masked_fill(seed_completion_mask(completions) == 0, PAD)
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
    expected = seed_loss(policy, reference, input_ids, completion_ids, rewards, 4, 0.02, accumulation, masked)
    expected.backward()

    assert torch.equal(inputs["prompt_ids"], prompt_ids) and torch.equal(inputs["completion_ids"], completion_ids)
    assert torch.equal(inputs["advantages"], seed_advantages(rewards, 4))
    assert abs(loss.item() - expected.item()) <= 1e-6 * abs(expected.item()), (loss.item(), expected.item())
    expected_grads = dict(policy.named_parameters())
    for name, parameter in trainer.model.named_parameters():
        assert_relative(parameter.grad, expected_grads[name].grad, 1e-6, name)
