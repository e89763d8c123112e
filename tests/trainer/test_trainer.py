"""MiniMindGRPOTrainer: upstream's arithmetic through TRL's own code paths, and short real train() runs."""

import copy
import gc
import math
import os
import zlib
from types import SimpleNamespace

import pytest
import torch
from datasets import Dataset

from minimind_trl import MiniMindConfig, MiniMindForCausalLM
from minimind_trl.trainer.algorithm.advantages import minimind_advantages
from minimind_trl.models.minimind.tokenization_minimind import build_minimind_tokenizer
from minimind_trl.trainer import MiniMindGRPOConfig, MiniMindGRPOTrainer
from minimind_trl.trainer.speed import cpu_precision
from trainer_fixtures import (
    EOS,
    PAD,
    PROMPTS,
    assert_relative,
    fixed_batch,
    fixed_reward,
    grpo_config,
    seed_completion_mask,
    stub_generation,
    tiny_model,
)



@pytest.fixture(scope="module")
def tokenizer():
    return build_minimind_tokenizer()


# --- upstream's arithmetic, written in the test from the spec's formulas ------------------------------


def seed_advantages(rewards, num_generations):
    grouped = rewards.view(-1, num_generations)
    mean_r = grouped.mean(dim=1).repeat_interleave(num_generations)
    std_r = grouped.std(dim=1).repeat_interleave(num_generations)
    advantages = torch.clamp((rewards - mean_r) / (std_r + 1e-4), -10, 10)
    return (advantages - advantages.mean()) / (advantages.std() + 1e-8)


def seed_per_token_logps(model, input_ids, n_keep):
    """One full log-softmax per row over the last n_keep positions (upstream's get_per_token_logps: no mask)."""
    logits = model(input_ids, logits_to_keep=n_keep + 1).logits[:, :-1, :]
    rows = [
        torch.gather(row_logits.log_softmax(dim=-1), 1, row_ids.unsqueeze(1)).squeeze(1)
        for row_logits, row_ids in zip(logits, input_ids[:, -n_keep:], strict=True)
    ]
    return torch.stack(rows)


def seed_loss(policy, reference, input_ids, completion_ids, rewards, num_generations, beta, accumulation, loss_type):
    """Upstream's loss, literally: its forwards see no attention mask (the prompts here have equal lengths, so the
    upstream's missing prompt mask changes nothing), padding after the first EOS included, and MoE models run a second
    full forward for the aux loss."""
    n_keep = completion_ids.size(1)
    completion_mask = seed_completion_mask(completion_ids)
    per_token_logps = seed_per_token_logps(policy, input_ids, n_keep)
    aux_loss = policy(input_ids).aux_loss if policy.config.use_moe else torch.tensor(0.0)
    with torch.no_grad():
        ref_per_token_logps = seed_per_token_logps(reference, input_ids, n_keep)
    advantages = seed_advantages(rewards, num_generations)
    kl_div = ref_per_token_logps - per_token_logps
    per_token_kl = torch.exp(kl_div) - kl_div - 1
    per_token_loss = -(
        torch.exp(per_token_logps - per_token_logps.detach()) * advantages.unsqueeze(1) - beta * per_token_kl
    )
    if loss_type == "grpo":  # upstream's aggregation
        policy_loss = ((per_token_loss * completion_mask).sum(dim=1) / completion_mask.sum(dim=1)).mean()
    else:  # TRL's "dapo": one token mean over the whole batch, same advantages
        policy_loss = (per_token_loss * completion_mask).sum() / completion_mask.sum()
    return (policy_loss + aux_loss) / accumulation


# --- a deterministic batch through the trainer's own generate-and-score and loss code -----------------


@pytest.mark.parametrize(
    "use_moe, masked, accumulation, loss_type, seed",
    [
        (False, True, 2, "grpo", 1),
        (True, True, 2, "grpo", 1),
        (True, True, 1, "grpo", 2),
        (False, False, 1, "grpo", 1),
        (True, False, 1, "grpo", 1),
        (False, True, 2, "dapo", 1),
    ],
    ids=["dense-eos", "moe-eos", "moe-eos-seed2", "dense-full", "moe-full", "dense-eos-dapo"],
)
def test_loss_and_gradients_equal_seed_arithmetic(
    tokenizer, tmp_path, use_moe, masked, accumulation, loss_type, seed
):
    model = tiny_model(tokenizer, use_moe, seed=seed)
    reference = copy.deepcopy(model).eval()
    rows, completions, rewards = fixed_batch(tokenizer, masked, seed=seed)
    args = grpo_config(tmp_path, gradient_accumulation_steps=accumulation, temperature=0.8, loss_type=loss_type)
    trainer = MiniMindGRPOTrainer(
        model, fixed_reward, args, train_dataset=Dataset.from_list(rows), processing_class=tokenizer
    )
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
    expected = seed_loss(policy, reference, input_ids, completion_ids, rewards, 4, 0.02, accumulation, loss_type)
    expected.backward()

    assert torch.equal(inputs["prompt_ids"], prompt_ids) and torch.equal(inputs["completion_ids"], completion_ids)
    assert torch.equal(inputs["advantages"], seed_advantages(rewards, 4))
    assert list(trainer._logs["advantages"]) == seed_advantages(rewards, 4).tolist()  # the completions table
    assert abs(loss.item() - expected.item()) <= 1e-6 * abs(expected.item()), (loss.item(), expected.item())
    expected_grads = dict(policy.named_parameters())
    for name, parameter in trainer.model.named_parameters():
        assert_relative(parameter.grad, expected_grads[name].grad, 1e-6, name)


# --- one whole run through trainer.train(): HF's loss scaling, accumulation, TRL's shuffle and split ----------

TRAIN_PROMPTS = [f"Please think step by step. Question {i}: what is {i} plus {i}?" for i in range(8)]


def fixed_completions(prompt_ids, num_generations, seed, vocab_size):
    """Deterministic completions per prompt (EOS at varied places, one row without EOS), cut after the first EOS
    like TRL's generation path, and the full rows padded after EOS as upstream's loss sees them."""
    rows = []
    for start in range(0, len(prompt_ids), num_generations):
        key = zlib.crc32(repr((seed, prompt_ids[start])).encode())
        generator = torch.Generator().manual_seed(key)
        completions = torch.randint(3, vocab_size, (num_generations, 7), generator=generator)
        for row, eos_at in enumerate(torch.randint(0, 9, (num_generations,), generator=generator).tolist()):
            if eos_at < 7:
                completions[row, eos_at] = EOS
        rows.append(completions)
    return torch.cat(rows)


def recording_generation(trainer, record, seed, vocab_size):
    """Generation replaced by `fixed_completions`; every call's prompts and completions kept for the test."""

    def generate(prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        completions = fixed_completions(prompt_ids, num_generations, seed, vocab_size)
        mask = seed_completion_mask(completions).bool()
        record.append((torch.tensor(prompt_ids), completions.masked_fill(~mask, PAD)))
        return [row[m].tolist() for row, m in zip(completions, mask, strict=True)], None

    trainer._generate_single_turn = generate


def seed_run(initial, reference, generations, *, lr, steps, generations_per_step, accumulation, beta, num_generations):
    """Upstream's training arithmetic written out: per generation batch its loss / accumulation, backward; per
    optimizer step the gradient clipped to norm 1, torch AdamW (decay 0.01 on all but norm weights: the
    transformers optimizer's one documented difference) and CosineAnnealingLR(T_max=steps, eta_min=lr / 10)."""
    policy = copy.deepcopy(initial).train()
    decay = [p for name, p in policy.named_parameters() if "norm" not in name]
    no_decay = [p for name, p in policy.named_parameters() if "norm" in name]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}], lr=lr
    )
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=steps, eta_min=lr / 10)
    logs = []
    for step in range(steps):
        step_loss = 0.0
        for prompt_ids, completion_ids in generations[step * generations_per_step : (step + 1) * generations_per_step]:
            rewards = torch.tensor(even_token_reward([row[row != PAD].tolist() for row in completion_ids]))
            input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
            loss = seed_loss(
                policy, reference, input_ids, completion_ids, rewards, num_generations, beta, accumulation, "grpo"
            )
            loss.backward()
            step_loss += loss.item()
        grad_norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0).item()
        logs.append({"loss": step_loss, "grad_norm": grad_norm, "learning_rate": optimizer.param_groups[0]["lr"]})
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
    return policy, logs


@pytest.mark.parametrize("steps_per_generation", [1, 2], ids=["generate-per-micro-batch", "generate-once-split-in-2"])
def test_optimizer_steps_through_train_equal_seed_arithmetic(tokenizer, tmp_path, steps_per_generation):
    """Two optimizer steps of 2 accumulated micro-batches through `trainer.train()` end with the weights upstream's
    arithmetic gives on the same completions. With `steps_per_generation: 2` TRL generates once per step,
    normalises the advantages over the 16 rows, shuffles them and splits them into the 2 micro-batches; the
    upstream's per-row mean then equals one loss over the 16 rows (the two halves have equal size)."""
    initial = tiny_model(tokenizer, seed=3)
    reference = copy.deepcopy(initial).eval()
    args = grpo_config(
        tmp_path,
        learning_rate=2e-3,
        gradient_accumulation_steps=2,
        steps_per_generation=steps_per_generation,
        num_train_epochs=1,
        save_strategy="no",
        beta=0.02,
    )
    dataset = Dataset.from_list([{"prompt": text} for text in TRAIN_PROMPTS])
    trainer = MiniMindGRPOTrainer(
        copy.deepcopy(initial), even_token_reward, args, train_dataset=dataset, processing_class=tokenizer
    )
    generations = []
    recording_generation(trainer, generations, steps_per_generation, len(tokenizer))
    trainer.train()

    assert trainer.state.global_step == 2
    assert len(generations) == 4 // steps_per_generation
    prompts_seen = [tuple(ids) for prompt_ids, _ in generations for ids in prompt_ids[::4].tolist()]
    expected_prompts = [tuple(tokenizer(text)["input_ids"][-6:]) for text in TRAIN_PROMPTS]
    assert sorted(prompts_seen) == sorted(expected_prompts)  # every prompt once, each time 4 completions
    assert prompts_seen != expected_prompts and len(set(expected_prompts)) == 8  # TRL shuffled the prompt order

    expected, expected_logs = seed_run(
        initial,
        reference,
        generations,
        lr=2e-3,
        steps=2,
        generations_per_step=2 // steps_per_generation,
        accumulation=2 // steps_per_generation,
        beta=0.02,
        num_generations=4,
    )
    start = dict(initial.named_parameters())
    trained = dict(trainer.model.named_parameters())
    moved = 0
    for name, parameter in expected.named_parameters():
        expected_delta = parameter.detach() - start[name].detach()
        delta = trained[name].detach() - start[name].detach()
        assert_relative(delta, expected_delta, 1e-4, name)
        moved += int(expected_delta.abs().max() > 1e-4)
    assert moved == len(start)  # every parameter really moved (decay alone would be ~4e-5)
    # AdamW and clipping hide a uniform scale of the gradients; the logged pre-clip norm and loss do not
    logs = [entry for entry in trainer.state.log_history if "grad_norm" in entry]
    for entry, seed_entry in zip(logs, expected_logs, strict=True):
        assert entry["grad_norm"] == pytest.approx(seed_entry["grad_norm"], rel=1e-5)
        assert entry["loss"] == pytest.approx(seed_entry["loss"], rel=1e-5, abs=1e-7)
        assert entry["learning_rate"] == pytest.approx(seed_entry["learning_rate"], rel=1e-9)


# --- scoring temperature, reference model ----------------------------------------------------------------


def logps_of(trainer, model, input_ids, n_keep):
    attention_mask = torch.ones_like(input_ids)
    with torch.no_grad():
        logps, _, _ = trainer._get_per_token_logps_and_entropies(model, input_ids, attention_mask, n_keep)
    return logps


def full_softmax_logps(model, input_ids, n_keep, temperature=1.0):
    with torch.no_grad():
        logits = model(input_ids, logits_to_keep=n_keep + 1).logits[:, :-1, :] / temperature
    return torch.gather(logits.log_softmax(-1), 2, input_ids[:, -n_keep:, None]).squeeze(-1)


@pytest.mark.parametrize("tempered", [False, True])
def test_scoring_temperature_of_policy_and_reference(tokenizer, tmp_path, tempered):
    """Untempered by default; `tempered_logprobs` restores TRL's logits / temperature, for both models.

    The policy is given as a saved folder here, so TRL builds the reference itself from the path."""
    tiny_model(tokenizer).save_pretrained(tmp_path / "policy")
    args = grpo_config(tmp_path, temperature=0.5, tempered_logprobs=tempered)
    rows, completions, _ = fixed_batch(tokenizer, masked=False)
    trainer = MiniMindGRPOTrainer(
        str(tmp_path / "policy"), fixed_reward, args, train_dataset=Dataset.from_list(rows), processing_class=tokenizer
    )
    assert isinstance(trainer.ref_model, MiniMindForCausalLM) and trainer.ref_model is not trainer.model
    plain = MiniMindForCausalLM.from_pretrained(tmp_path / "policy").eval()
    input_ids = torch.cat([torch.randint(3, len(tokenizer), (8, 5)), completions], dim=1)
    expected = full_softmax_logps(plain, input_ids, 7, temperature=0.5 if tempered else 1.0)
    trainer.model.eval()
    for model in (trainer.model, trainer.ref_model):
        torch.testing.assert_close(logps_of(trainer, model, input_ids, 7), expected, rtol=1e-5, atol=1e-5)


def test_reference_of_an_in_memory_model_is_a_frozen_copy_of_the_object(tokenizer, tmp_path):
    model = tiny_model(tokenizer)
    assert model.config._name_or_path == ""  # unsaved: TRL alone would have nothing to load the reference from
    with torch.no_grad():
        model.lm_head.weight.mul_(1.5)  # in-memory edits must reach the reference
    rows, completions, _ = fixed_batch(tokenizer, masked=False)
    dataset = Dataset.from_list(rows)
    input_ids = torch.cat([torch.randint(3, len(tokenizer), (8, 5)), completions], dim=1)
    expected = full_softmax_logps(model, input_ids, 7)

    first = MiniMindGRPOTrainer(
        model, fixed_reward, grpo_config(tmp_path), train_dataset=dataset, processing_class=tokenizer
    )
    # a second trainer on the same, already patched, object: its reference must not compute with the live policy
    second = MiniMindGRPOTrainer(
        model, fixed_reward, grpo_config(tmp_path), train_dataset=dataset, processing_class=tokenizer
    )
    for trainer in (first, second):
        reference = trainer.ref_model
        assert reference is not model and not reference.training
        assert not any(parameter.requires_grad for parameter in reference.parameters())
        assert reference.lm_head.weight.data_ptr() != model.lm_head.weight.data_ptr()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(1.0)  # training moves the policy; the references must stay where they started
    for trainer in (first, second):
        torch.testing.assert_close(logps_of(trainer, trainer.ref_model, input_ids, 7), expected, rtol=1e-5, atol=1e-5)


# --- short real runs --------------------------------------------------------------------------------------


def even_token_reward(completion_ids, **kwargs):
    """A rule reward with spread on random text: the share of even token ids."""
    return [sum(1 for token in ids if token % 2 == 0) / max(len(ids), 1) for ids in completion_ids]


def prompt_dataset(count=8):
    return Dataset.from_list(
        [{"prompt": [{"role": "user", "content": f"Question {i}: what is {i} plus {i}?"}]} for i in range(count)]
    )


def record_policy_forwards(backbone):
    """(training mode, grad enabled) of every forward of the policy backbone."""
    calls = []
    backbone.register_forward_hook(lambda module, *_: calls.append((module.training, torch.is_grad_enabled())))
    return calls


SEED_METRICS = (  # upstream's wandb keys -> TRL's names (avg_response_len -> completions/mean_length)
    "reward",
    "rewards/even_token_reward/mean",
    "completions/mean_length",
    "aux_loss",
    "learning_rate",
    "kl",
    "advantages/mean",
    "advantages/std",
)


def policy_backbone(trainer):
    policy = trainer.model.get_base_model() if hasattr(trainer.model, "get_base_model") else trainer.model
    return policy.model


def run_and_check(trainer, steps, micro_batches_per_step):
    initial = {name: tensor.clone() for name, tensor in trainer.model.state_dict().items()}
    calls = record_policy_forwards(policy_backbone(trainer))
    trainer.train()
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert len(logs) == steps
    for entry in logs:
        missing = [key for key in SEED_METRICS if key not in entry]
        assert not missing, f"metrics not logged: {missing}"
        assert all(math.isfinite(entry[key]) for key in SEED_METRICS)
    checkpoint = os.path.join(trainer.args.output_dir, f"checkpoint-{steps}")
    assert os.path.isfile(os.path.join(checkpoint, "trainer_state.json"))
    grad_forwards = [call for call in calls if call[1]]
    assert grad_forwards == [(True, True)] * (steps * micro_batches_per_step)  # one policy forward per micro-batch
    sampling = [call for call in calls if not call[1]]
    return initial, sampling, logs


def test_train_dense_bf16_default_with_rule_rewards(tokenizer, tmp_path):
    from minimind_trl.rewards import tag_count_reward

    batch_sizes = []

    def even_token_reward(completion_ids, **kwargs):  # same name, so the logged metric keeps its key
        batch_sizes.append(len(completion_ids))
        return globals()["even_token_reward"](completion_ids)

    model = tiny_model(tokenizer)
    args = grpo_config(
        tmp_path,
        bf16=True,
        learning_rate=1e-3,
        max_steps=2,
        save_steps=2,
        max_completion_length=8,
        max_prompt_length=16,
    )
    trainer = MiniMindGRPOTrainer(
        model, [even_token_reward, tag_count_reward], args, train_dataset=prompt_dataset(), processing_class=tokenizer
    )
    reference = {name: tensor.clone() for name, tensor in trainer.ref_model.state_dict().items()}
    initial, sampling, logs = run_and_check(trainer, steps=2, micro_batches_per_step=1)
    assert sampling and all(not training for training, _ in sampling)  # generation ran in eval mode, and nothing else
    assert "rewards/tag_count_reward/mean" in logs[0]
    assert batch_sizes == [8, 8]  # rewards are scored once per generation batch, not one completion at a time
    changed = [name for name, tensor in trainer.model.state_dict().items() if not torch.equal(tensor, initial[name])]
    assert "model.layers.0.self_attn.q_proj.weight" in changed
    assert all(torch.equal(tensor, reference[name]) for name, tensor in trainer.ref_model.state_dict().items())
    assert os.path.isfile(os.path.join(args.output_dir, "checkpoint-2", "model.safetensors"))


def test_train_moe_one_forward_per_micro_batch(tokenizer, tmp_path):
    model = tiny_model(tokenizer, use_moe=True)
    args = grpo_config(
        tmp_path,
        learning_rate=1e-3,
        max_steps=1,
        save_steps=1,
        gradient_accumulation_steps=2,
        per_device_train_batch_size=4,
        max_completion_length=6,
        max_prompt_length=16,
    )
    trainer = MiniMindGRPOTrainer(
        model, even_token_reward, args, train_dataset=prompt_dataset(), processing_class=tokenizer
    )
    assert not trainer.aux_loss_enabled  # TRL's Mixtral-style router-logit path stays off for MiniMind
    initial, sampling, logs = run_and_check(trainer, steps=1, micro_batches_per_step=2)
    assert all(not training for training, _ in sampling)
    assert logs[0]["aux_loss"] > 0
    changed = [name for name, tensor in trainer.model.state_dict().items() if not torch.equal(tensor, initial[name])]
    assert any(".mlp.gate." in name for name in changed)  # the router learns: the aux loss reached the gradients


def test_train_lora_trains_adapters_against_the_disabled_adapter_reference(tokenizer, tmp_path):
    from peft import LoraConfig

    gc.collect()
    before = {id(obj) for obj in gc.get_objects() if type(obj) is MiniMindForCausalLM}
    model = tiny_model(tokenizer)
    base_weights = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    args = grpo_config(
        tmp_path, learning_rate=1e-2, max_steps=2, save_steps=2, max_completion_length=6, max_prompt_length=16
    )
    peft_config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    trainer = MiniMindGRPOTrainer(
        model,
        even_token_reward,
        args,
        train_dataset=prompt_dataset(),
        processing_class=tokenizer,
        peft_config=peft_config,
    )
    assert trainer.ref_model is None
    trainable = [name for name, parameter in trainer.model.named_parameters() if parameter.requires_grad]
    assert trainable and all(".lora_" in name for name in trainable)
    initial, sampling, logs = run_and_check(trainer, steps=2, micro_batches_per_step=1)
    # no-grad policy forwards: sampling (eval mode) and the reference log-probs with adapters disabled
    assert any(not training for training, _ in sampling)

    gc.collect()
    held = [obj for obj in gc.get_objects() if type(obj) is MiniMindForCausalLM and id(obj) not in before]
    assert held == [model]  # no second copy of the base model anywhere
    state = trainer.model.state_dict()
    lora_changed = [name for name in state if ".lora_B." in name and not torch.equal(state[name], initial[name])]
    assert lora_changed
    base_model = trainer.model.get_base_model()
    with trainer.model.disable_adapter():
        for name, tensor in base_model.state_dict().items():
            if ".lora_" not in name:
                assert torch.equal(tensor, base_weights[name.replace(".base_layer", "")]), name
    # the reference log-probs are the initial model's: adapters disabled give back the untouched base
    input_ids = torch.randint(3, len(tokenizer), (4, 12))
    initial_model = MiniMindForCausalLM(model.config)
    initial_model.load_state_dict(base_weights)
    with trainer.model.disable_adapter():
        trainer.model.eval()
        torch.testing.assert_close(
            logps_of(trainer, trainer.model, input_ids, 6),
            full_softmax_logps(initial_model.eval(), input_ids, 6),
            rtol=1e-5,
            atol=1e-5,
        )


# --- configuration ---------------------------------------------------------------------------------------


@pytest.mark.cpu_kind
def test_config_defaults_are_the_seeds(tmp_path):
    args = MiniMindGRPOConfig(output_dir=str(tmp_path), use_cpu=True)
    assert args.learning_rate == 8e-8 and args.lr_scheduler_kwargs == {"min_lr_rate": 0.1}
    assert args.lr_scheduler_type == "cosine_with_min_lr" and args.warmup_steps == 0
    assert (args.max_grad_norm, args.weight_decay, args.num_train_epochs) == (1.0, 0.01, 1.0)
    assert (args.temperature, args.top_k, args.top_p) == (0.8, 50, 1.0)
    assert (args.num_generations, args.per_device_train_batch_size) == (8, 16)
    assert (args.max_prompt_length, args.max_completion_length) == (66, 1536)
    assert (args.beta, args.loss_type, args.num_iterations, args.use_bias_correction_kl) == (0.02, "grpo", 1, False)
    assert (args.advantage_estimator, args.tempered_logprobs, args.moe_aux_loss_weight) == ("minimind", False, 1.0)
    # bf16 unset: on CPU the machine's choice (tests/trainer/speed/test_cpu_precision.py), upstream's bf16 on GPUs
    assert args.bf16 is cpu_precision.machine_choice().bf16
    assert (args.gradient_checkpointing, args.steps_per_generation) == (False, 1)
    assert (args.save_steps, args.logging_steps, args.seed) == (10, 1, 42)


def test_cosine_with_min_lr_is_the_seeds_cosine_annealing():
    from transformers import get_scheduler

    parameter = torch.nn.Parameter(torch.zeros(1))
    ours = torch.optim.AdamW([parameter], lr=8e-8)
    seeds = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=8e-8)
    scheduler = get_scheduler(
        "cosine_with_min_lr",
        ours,
        num_warmup_steps=0,
        num_training_steps=37,
        scheduler_specific_kwargs={"min_lr_rate": 0.1},
    )
    annealing = torch.optim.lr_scheduler.CosineAnnealingLR(seeds, T_max=37, eta_min=8e-8 / 10)
    for _ in range(37):
        assert ours.param_groups[0]["lr"] == pytest.approx(seeds.param_groups[0]["lr"], rel=1e-9)
        ours.step(), seeds.step(), scheduler.step(), annealing.step()


def test_config_refuses_options_that_would_be_silently_ignored(tmp_path):
    with pytest.raises(ValueError, match="scale_rewards"):
        MiniMindGRPOConfig(output_dir=str(tmp_path), use_cpu=True, scale_rewards="batch")
    with pytest.raises(ValueError, match="multi_objective_aggregation"):
        MiniMindGRPOConfig(output_dir=str(tmp_path), use_cpu=True, multi_objective_aggregation="normalize_then_sum")
    with pytest.raises(ValueError, match="max_prompt_length"):
        MiniMindGRPOConfig(output_dir=str(tmp_path), use_cpu=True, max_prompt_length=0)
    args = MiniMindGRPOConfig(output_dir=str(tmp_path), use_cpu=True, advantage_estimator="trl", scale_rewards="batch")
    assert args.scale_rewards == "batch"


def test_trainer_refuses_plain_grpo_config_and_mixtral_aux_coef(tokenizer, tmp_path):
    from trl import GRPOConfig

    rows, _, _ = fixed_batch(tokenizer, masked=False)
    dataset = Dataset.from_list(rows)
    with pytest.raises(TypeError, match="MiniMindGRPOConfig"):
        MiniMindGRPOTrainer(
            tiny_model(tokenizer),
            fixed_reward,
            GRPOConfig(str(tmp_path), use_cpu=True),
            train_dataset=dataset,
            processing_class=tokenizer,
        )
    with pytest.raises(ValueError, match="router_aux_loss_coef"):  # TRL's coefficient is Mixtral's, not MiniMind's
        MiniMindGRPOTrainer(
            tiny_model(tokenizer, use_moe=True),
            fixed_reward,
            grpo_config(tmp_path, router_aux_loss_coef=0.5),
            train_dataset=dataset,
            processing_class=tokenizer,
        )


def test_output_router_logits_left_by_sft_does_not_switch_on_trls_mixtral_path(tokenizer, tmp_path):
    """TRL's SFTTrainer stamps `output_router_logits` on configs with a `router_aux_loss_coef`; MiniMind's own
    aux-loss path must stay the one used (TRL's would read `router_logits`, which MiniMind does not return)."""
    rows, _, _ = fixed_batch(tokenizer, masked=False)
    model = tiny_model(tokenizer, use_moe=True)
    model.config.output_router_logits = False  # what SFTTrainer leaves behind
    trainer = MiniMindGRPOTrainer(
        model, fixed_reward, grpo_config(tmp_path), train_dataset=Dataset.from_list(rows), processing_class=tokenizer
    )
    assert not trainer.aux_loss_enabled and trainer._adds_model_aux_loss
    model.save_pretrained(tmp_path / "saved")
    reloaded = type(model).from_pretrained(tmp_path / "saved")
    assert not hasattr(reloaded.config, "output_router_logits")


def test_whole_prompts_without_max_prompt_length(tokenizer, tmp_path):
    rows, _, _ = fixed_batch(tokenizer, masked=False)
    trainer = MiniMindGRPOTrainer(
        tiny_model(tokenizer),
        fixed_reward,
        grpo_config(tmp_path, max_prompt_length=None),
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
    )
    prompt_ids, _, _ = trainer._tokenize_prompts(list(PROMPTS))
    assert [len(ids) for ids in prompt_ids] == [len(tokenizer(text)["input_ids"]) for text in PROMPTS]
    assert min(len(ids) for ids in prompt_ids) > 6


def test_log_probs_attend_with_the_mask(tokenizer, tmp_path):
    """Upstream's log-prob forward passes no attention mask, so left padding leaks into a row; ours does not."""
    rows, _, _ = fixed_batch(tokenizer, masked=False)
    trainer = MiniMindGRPOTrainer(
        tiny_model(tokenizer),
        fixed_reward,
        grpo_config(tmp_path),
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
    )
    trainer.model.eval()
    short, long = torch.randint(3, len(tokenizer), (1, 9)), torch.randint(3, len(tokenizer), (1, 13))
    padded = torch.cat([torch.cat([torch.full((1, 4), PAD), short], dim=1), long])
    mask = (torch.arange(13) >= torch.tensor([[4], [0]])).long()
    with torch.no_grad():
        batched, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, padded, mask, 5)
        alone, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, short, torch.ones_like(short), 5)
    torch.testing.assert_close(batched[:1], alone, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "num_generations, num_local",
    [(4, 8), (8, 4), (8, 12)],
    ids=["groups-within-processes", "half-a-group-per-process", "middle-group-spans-2-processes"],
)
def test_advantages_group_over_the_gathered_batch_and_renormalise_per_process(num_generations, num_local):
    generator = torch.Generator().manual_seed(3)
    rewards_per_func = torch.rand(24, 2, generator=generator)
    rewards_per_func[5] = torch.nan  # unscorable by every function -> advantage 0
    rewards_per_func[9, 1] = torch.nan  # unscored by one function -> TRL's nansum of the others
    weights = torch.tensor([1.0, 0.5])
    total = (rewards_per_func * weights).nansum(dim=1)
    total[5] = torch.nan
    per_process = []
    for process_index in range(24 // num_local):
        per_process.append(
            trainer_advantages(rewards_per_func, weights, num_generations, process_index, 24 // num_local)
        )
    assert per_process[5 // num_local][5 % num_local] == 0.0
    for process_index, advantages in enumerate(per_process):
        local = slice(process_index * num_local, (process_index + 1) * num_local)
        if num_local % num_generations == 0:  # groups are process-local: each process gets upstream's advantages
            torch.testing.assert_close(advantages, minimind_advantages(total[local], num_generations), rtol=0, atol=0)
        else:  # z-scored over the whole group (gathered), then renormalised over this process's rows only
            stage_one = torch.cat([_zscore(group) for group in total.split(num_generations)])
            expected = _renormalise(stage_one[local])
            torch.testing.assert_close(advantages, expected, rtol=1e-6, atol=1e-6)
            if num_local > num_generations:  # parts of two groups: z-scoring only its own rows would differ
                pieces = total[local].split([8, 4] if process_index == 0 else [4, 8])
                own = _renormalise(torch.cat([_zscore(piece) for piece in pieces]))
                assert (advantages - own).abs().max() > 1e-2
    for advantages in per_process:  # the second normalisation is per process
        scorable = advantages[advantages != 0]
        assert abs(scorable.mean().item()) < 1e-6 and abs(scorable.std().item() - 1) < 1e-5


def trainer_advantages(rewards_per_func, weights, num_generations, process_index, num_processes):
    """One process's advantages the way `_generate_and_score_completions` gets them: the weighted rewards of the
    gathered batch, the configured estimator ("minimind"), this process's slice."""
    fake = SimpleNamespace(
        accelerator=SimpleNamespace(process_index=process_index, num_processes=num_processes),
        args=SimpleNamespace(advantage_estimator="minimind"),
        num_generations=num_generations,
        num_generations_eval=num_generations,
        reward_weights=weights,
    )
    rewards = MiniMindGRPOTrainer._weighted_rewards(fake, rewards_per_func)
    local = MiniMindGRPOTrainer._local_rows(fake, len(rewards) // num_processes)
    return MiniMindGRPOTrainer._advantages(fake, rewards, "train")[local]


def _zscore(group):
    scorable = group[~torch.isnan(group)]
    return torch.clamp((group - scorable.mean()) / (scorable.std() + 1e-4), -10, 10)


def _renormalise(values):
    scorable = values[~torch.isnan(values)]
    return torch.nan_to_num((values - scorable.mean()) / (scorable.std() + 1e-8), nan=0.0)


@pytest.mark.parametrize("value", [0.1, 2.1, -0.7])
def test_a_constant_group_spanning_processes_gets_exact_zeros(value):
    """Three constant groups of 8 gathered from 2 processes of 12 rows (the middle group spans both): upstream's
    arithmetic turns the groups' rounding noise into unit-size advantages; every process gets exact zeros."""
    rewards_per_func = torch.tensor([value, value + 0.2, value + 0.4]).repeat_interleave(8).unsqueeze(1)
    stage_one = _zscore_all(rewards_per_func[:, 0])
    upstream = [(a - a.mean()) / (a.std() + 1e-8) for a in stage_one.split(12)]
    assert max(a.abs().max().item() for a in upstream) > 0.5  # the defect this guards against
    for process_index in range(2):
        advantages = trainer_advantages(rewards_per_func, torch.ones(1), 8, process_index, 2)
        assert torch.equal(advantages, torch.zeros(12))


def _zscore_all(rewards):
    """Upstream's stage one over groups of 8 (no clamp binds at G = 8)."""
    grouped = rewards.view(-1, 8)
    return ((grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-4)).reshape(-1)


def test_estimator_output_is_checked_and_unscorable_rows_get_zero(monkeypatch):
    from minimind_trl.trainer.algorithm.advantages import ADVANTAGE_ESTIMATORS

    fake = SimpleNamespace(
        accelerator=SimpleNamespace(num_processes=1),
        args=SimpleNamespace(advantage_estimator="test_estimator"),
        num_generations=2,
        num_generations_eval=2,
    )
    rewards = torch.tensor([1.0, float("nan"), 3.0, 4.0])
    monkeypatch.setitem(ADVANTAGE_ESTIMATORS, "test_estimator", lambda inputs: inputs.rewards * 2)
    assert torch.equal(MiniMindGRPOTrainer._advantages(fake, rewards, "train"), torch.tensor([2.0, 0.0, 6.0, 8.0]))
    monkeypatch.setitem(ADVANTAGE_ESTIMATORS, "test_estimator", lambda inputs: inputs.rewards[:2])
    with pytest.raises(ValueError, match="returned shape"):
        MiniMindGRPOTrainer._advantages(fake, rewards, "train")
    monkeypatch.setitem(ADVANTAGE_ESTIMATORS, "test_estimator", lambda inputs: inputs.rewards / 0)
    with pytest.raises(ValueError, match="non-finite advantage for a scored row"):
        MiniMindGRPOTrainer._advantages(fake, rewards, "train")
