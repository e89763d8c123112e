"""The trainer's log-prob passes with each prompt computed once per group (`share_prompts`): the reference, old-log-prob
and policy passes give the unshared passes' log-probs, loss and gradients (MiniMind2, MiniMind-3, dense and MoE, LoRA,
prompts of unequal length), and the trainer computes every prompt per row, saying why once, where sharing cannot
apply."""

import logging
from types import SimpleNamespace

import pytest
import torch
from datasets import Dataset
from grpo_fixtures import UNEQUAL_PROMPTS as PROMPTS
from grpo_fixtures import fixed_generation as shared_fixed_generation
from transformers import LlamaConfig, LlamaForCausalLM

from minimind_trl import MiniMindConfig, MiniMindForCausalLM
from minimind_trl.models.minimind.tiny import tiny_minimind_model
from minimind_trl.models.minimind.tokenization_minimind import build_minimind_tokenizer
from minimind_trl.trainer import MiniMindGRPOConfig, MiniMindGRPOTrainer
from minimind_trl.trainer.speed.prompt_sharing import sharing_off_reason

GENERATIONS = 4
COMPLETION = 6
TRAINER_LOGGER = "minimind_trl.trainer.speed.prompt_sharing"
MODEL_LOGGER = "minimind_trl.models.minimind.modeling_minimind"


@pytest.fixture(scope="module")
def tokenizer():
    return build_minimind_tokenizer()


def tiny(tokenizer, **kwargs) -> MiniMindForCausalLM:
    """A tiny MiniMind with weights large enough that fp32 gradients are well conditioned."""
    model = tiny_minimind_model(len(tokenizer), seed=0, **kwargs)
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0.0, 0.3) if param.ndim == 2 else param.uniform_(0.5, 1.5)
    return model


def reward(completions, **kwargs):
    return [float(len(str(c))) % 3 for c in completions]


def build(tokenizer, tmp_path, model, peft_config=None, **overrides) -> MiniMindGRPOTrainer:
    """16 completions of 4 prompts per generation batch, split in two micro-batches of 8 (TRL's chunks of the old and
    reference passes too): TRL computes the old log-probs at generation time; beta > 0: the reference pass runs."""
    values = dict(output_dir=str(tmp_path / "out"), use_cpu=True, bf16=False, report_to="none",
                  per_device_train_batch_size=8, generation_batch_size=16, num_generations=GENERATIONS,
                  max_completion_length=COMPLETION, max_prompt_length=None, beta=0.1, dataloader_num_workers=0,
                  disable_tqdm=True, seed=0)  # fmt: skip
    values.update(overrides)
    rows = [{"prompt": [{"role": "user", "content": text}]} for text in PROMPTS]
    return MiniMindGRPOTrainer(
        model, reward, MiniMindGRPOConfig(**values), train_dataset=Dataset.from_list(rows), processing_class=tokenizer,
        peft_config=peft_config,
    )  # fmt: skip


def fixed_generation(trainer, tokenizer):
    """Sampling replaced by fixed completions (EOS at varied places), the same for every call."""
    shared_fixed_generation(trainer, tokenizer, COMPLETION)


def attention_calls(trainer) -> list:
    """Record (model, rows, tokens) of every call of the first attention layer of the policy and the reference."""
    calls = []
    policy = trainer.accelerator.unwrap_model(trainer.model)
    models = {"policy": policy.get_base_model() if hasattr(policy, "get_base_model") else policy}
    if trainer.ref_model is not None:
        models["reference"] = trainer.accelerator.unwrap_model(trainer.ref_model)
    for name, model in models.items():
        model.model.layers[0].self_attn.register_forward_pre_hook(
            lambda module, args, kwargs, name=name: calls.append((name, *kwargs["hidden_states"].shape[:2])),
            with_kwargs=True,
        )
    return calls


def batch(prompts=PROMPTS) -> list[dict]:
    return [{"prompt": [{"role": "user", "content": text}]} for text in prompts for _ in range(GENERATIONS)]


def one_micro_batch(trainer, tokenizer, shared: bool):
    """The generation batch's reference and old log-probs, then the first micro-batch's loss and gradients."""
    trainer._shares_prompts = shared
    fixed_generation(trainer, tokenizer)
    trainer.model.train()
    trainer.model.zero_grad()
    trainer.current_gradient_accumulation_steps = 1
    torch.manual_seed(0)
    inputs = trainer._generate_and_score_completions(batch())
    micro_batch = {key: value[::2] if isinstance(value, torch.Tensor) and value.dim() else value
                   for key, value in inputs.items()}  # rows 0, 2, ...: two of each group  # fmt: skip
    loss = trainer.compute_loss(trainer.model, micro_batch)
    loss.backward()
    grads = {name: p.grad.clone() for name, p in trainer.model.named_parameters() if p.grad is not None}
    return inputs, loss.detach(), grads


CASES = [
    pytest.param(dict(), None, id="MiniMind2-dense"),
    pytest.param(dict(minimind_generation="minimind3"), None, id="MiniMind-3-dense"),
    pytest.param(dict(use_moe=True, num_experts=4, router_aux_loss_coef=0.1), None, id="MiniMind2-moe"),
    pytest.param(
        dict(minimind_generation="minimind3", use_moe=True, num_experts=4, num_experts_per_tok=2), None,
        id="MiniMind-3-moe",
    ),  # fmt: skip
    pytest.param(dict(), "lora", id="MiniMind2-dense-lora"),
    pytest.param(
        dict(minimind_generation="minimind3", use_moe=True, num_experts_per_tok=2), "lora", id="MiniMind-3-moe-lora"
    ),
]


@pytest.mark.parametrize("config, lora", CASES)
def test_reference_old_and_policy_passes_equal_the_unshared_passes(tokenizer, tmp_path, config, lora):
    from peft import LoraConfig

    peft_config = None
    if lora:
        peft_config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "gate_proj"],
                                 task_type="CAUSAL_LM", init_lora_weights=False)  # fmt: skip
    trainer = build(tokenizer, tmp_path, tiny(tokenizer, **config), peft_config)
    assert trainer._shares_prompts and (trainer.ref_model is None) == bool(lora)
    calls = attention_calls(trainer)
    plain = one_micro_batch(trainer, tokenizer, shared=False)
    unshared_calls, calls[:] = list(calls), []
    shared = one_micro_batch(trainer, tokenizer, shared=True)

    prompt = plain[0]["prompt_ids"].shape[1]
    reference = "policy" if lora else "reference"  # LoRA: the policy with its adapters disabled
    # unshared: old log-probs and reference over the 16 rows in chunks of 8, the policy over its 8 rows; shared: the 2
    # (4 in the micro-batch) distinct prompts of a chunk once, then its completions
    whole = [("policy", 8, prompt + COMPLETION)] * 2 + [(reference, 8, prompt + COMPLETION)] * 2
    assert unshared_calls == whole + [("policy", 8, prompt + COMPLETION)]
    chunk = [(2, prompt), (8, COMPLETION)]
    assert calls == [("policy", *c) for c in chunk * 2] + [(reference, *c) for c in chunk * 2] + [
        ("policy", 4, prompt), ("policy", 8, COMPLETION)
    ]
    assert plain[0]["prompt_mask"].sum(1).unique().numel() == 4  # four prompt lengths: three are left-padded
    real = plain[0]["completion_mask"].bool()
    for key in ("old_per_token_logps", "ref_per_token_logps"):
        torch.testing.assert_close(shared[0][key][real], plain[0][key][real], atol=1e-5, rtol=0, msg=key)
    torch.testing.assert_close(shared[1], plain[1], atol=1e-6, rtol=1e-5)
    assert plain[2].keys() == shared[2].keys() and plain[2]
    for name, grad in plain[2].items():
        relative = (shared[2][name] - grad).norm() / grad.norm()
        assert relative <= 1e-4, f"{name}: {relative:.2e}"
    if lora:
        assert all(".lora_" in name for name in plain[2])


# --- where the trainer cannot share prompts ------------------------------------------------------------------


@pytest.fixture()
def log(caplog):
    logging.Logger.info_once.cache_clear()
    with caplog.at_level(logging.INFO):
        yield caplog
    logging.Logger.info_once.cache_clear()


def said(log, logger: str) -> list[str]:
    return [r.getMessage() for r in log.records if r.name == logger]


def test_a_policy_that_is_not_minimind_computes_every_prompt(tokenizer, tmp_path, log):
    config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id)
    trainer = build(tokenizer, tmp_path, LlamaForCausalLM(config))
    assert not trainer._shares_prompts
    (line,) = said(log, TRAINER_LOGGER)
    assert "not once per group: the policy is LlamaConfig's model, not MiniMind" in line
    forwards = []
    trainer.model.register_forward_pre_hook(lambda m, args, kwargs: forwards.append(kwargs), with_kwargs=True)
    fixed_generation(trainer, tokenizer)
    trainer._generate_and_score_completions(batch())
    assert forwards and all("shared_prefix_length" not in kwargs for kwargs in forwards)


def test_share_prompts_false_computes_every_prompt_silently(tokenizer, tmp_path, log):
    trainer = build(tokenizer, tmp_path, tiny(tokenizer), share_prompts=False)
    assert not trainer._shares_prompts and said(log, TRAINER_LOGGER) == []
    calls = attention_calls(trainer)
    fixed_generation(trainer, tokenizer)
    trainer._generate_and_score_completions(batch())
    assert len(calls) == 4 and all(rows == 8 for _, rows, _ in calls)  # old and reference passes, 2 chunks each


def fake_trainer(share_prompts=None, device="cpu", zero_stage=None, fsdp=False):
    """What `sharing_off_reason` reads of a trainer."""
    plugin = SimpleNamespace(zero_stage=zero_stage) if zero_stage else None
    policy = SimpleNamespace(config=MiniMindConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4))
    accelerator = SimpleNamespace(
        unwrap_model=lambda model: model, state=SimpleNamespace(deepspeed_plugin=plugin), device=torch.device(device)
    )
    return SimpleNamespace(args=SimpleNamespace(share_prompts=share_prompts), model=policy, accelerator=accelerator,
                           is_deepspeed_enabled=plugin is not None, is_fsdp_enabled=fsdp)  # fmt: skip


@pytest.mark.parametrize("backend", ["zero3", "fsdp"])
def test_zero3_and_fsdp_compute_every_prompt(backend):
    """Both gather each layer's weights at every call, and a shared pass calls each layer twice: not verified."""
    trainer = fake_trainer(True, zero_stage=3 if backend == "zero3" else None, fsdp=backend == "fsdp")
    assert sharing_off_reason(trainer).startswith("DeepSpeed ZeRO-3" if backend == "zero3" else "FSDP")
    assert sharing_off_reason(fake_trainer(True, zero_stage=2)) is None  # ZeRO-2 keeps whole weights on every rank


def test_unset_share_prompts_shares_on_cpu_only():
    """On GPUs two passes per layer double the kernel launches, which set the time at MiniMind's sizes."""
    assert sharing_off_reason(fake_trainer(None, "cpu")) is None
    assert "share_prompts unset on cuda" in sharing_off_reason(fake_trainer(None, "cuda"))
    assert sharing_off_reason(fake_trainer(True, "cuda")) is None
    assert sharing_off_reason(fake_trainer(False, "cpu")) == "share_prompts: false"


def test_rollouts_whose_prompts_differ_within_a_group_are_computed_row_by_row(tokenizer, tmp_path, log):
    """A multi-turn (agent) rollout_func whose rows carry their own prompt tokens (a per-rollout thinking prefix): no
    two rows share a prompt, so every pass computes each row's prompt, says so once, and trains as unshared."""
    base = tokenizer.apply_chat_template(
        [{"role": "user", "content": PROMPTS[0]}], add_generation_prompt=True, return_dict=False
    )
    generator = torch.Generator().manual_seed(5)

    def rollout(prompts, trainer):
        rows = len(prompts)
        prompt_ids = [[3 + row] + base for row in range(rows)]  # each rollout's own first token
        completion_ids = torch.randint(3, len(tokenizer), (rows, COMPLETION), generator=generator).tolist()
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": [[0.0] * COMPLETION] * rows}

    trainer = build(tokenizer, tmp_path, tiny(tokenizer))
    trainer.rollout_func = rollout
    calls = attention_calls(trainer)
    trainer.model.train()
    inputs = trainer._generate_and_score_completions(batch())
    assert [rows for _, rows, _ in calls] == [8] * 4  # old log-probs and reference passes, row by row
    assert {tokens for _, _, tokens in calls} == {inputs["prompt_ids"].shape[1] + COMPLETION}
    (line,) = [line for line in said(log, MODEL_LOGGER) if "shared_prefix_length" in line]
    assert "no two rows of a batch share their prefix ids and mask" in line
