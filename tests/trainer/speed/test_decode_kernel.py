"""DecodeKernel: the packed MiniMind decoding step must compute what the model's modules compute.

The kernel re-implements a MiniMind decoding step by hand (fused q|k|v and gate|up GEMMs, batched MoE experts,
a static KV cache with an additive padding mask, RoPE from a gathered table, grouped-query attention without
repeated heads). None of that is checked by the model's own tests, and a slip in any of it (a wrong sign in
RoPE, padding keys attended, query heads grouped with the wrong kv head, unrenormalised top-k weights) would
silently change every GRPO rollout. These tests run the kernel step by step next to the module path and compare
logits, then check the sampler and trainer wiring around it (which models use it, in which weight dtype).
"""

import pytest
import torch
from datasets import Dataset
from torch import nn
from transformers import DynamicCache, GenerationConfig, LlamaConfig, LlamaForCausalLM

from minimind_trl import MiniMindConfig, MiniMindForCausalLM
from minimind_trl.trainer.speed.decode_kernel import DecodeKernel
from minimind_trl.trainer.speed.fast_sampling import FastSampler

VOCAB = 300
STEPS = 12
BASE = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=VOCAB)
MOE = dict(use_moe=True, num_experts=4, num_experts_per_tok=2, n_shared_experts=1)
MINIMIND3 = dict(minimind_generation="minimind3", head_dim=16)
VARIANTS = {
    "dense": {},
    "moe": MOE,
    "moe_top1": dict(MOE, num_experts_per_tok=1),  # MiniMind2 top-1: no renormalisation
    "minimind3": MINIMIND3,
    "minimind3_moe_top1": dict(MINIMIND3, use_moe=True, num_experts=4, num_experts_per_tok=1),
    "untied": dict(tie_word_embeddings=False),
    "yarn": dict(inference_rope_scaling=True),  # upstream's YaRN (attention factor 1)
    "yarn_scaled": dict(rope_parameters={"rope_type": "yarn", "attention_factor": 1.3}),  # cos/sin scaled
    "linear_rope": dict(rope_parameters={"rope_type": "linear", "factor": 2.0}),
}


def tiny(seed=0, **overrides) -> MiniMindForCausalLM:
    """A tiny MiniMind with weights large enough that attention is far from uniform and routing far from even,
    so that errors in RoPE, masking, head grouping or routing move the logits well beyond rounding."""
    torch.manual_seed(seed)
    model = MiniMindForCausalLM(MiniMindConfig(**{**BASE, **overrides})).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if parameter.dim() == 1:  # RMSNorm weights (q/k norms included): not all ones, so each one counts
                parameter.copy_(1 + 0.2 * torch.randn_like(parameter))
            else:
                parameter.normal_(0, 0.15)
    return model


def padded_prompts(batch=3, length=7, pads=(0, 2, 4), seed=1):
    """Left-padded prompts, a different pad length per row (as TRL pads them)."""
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(3, VOCAB, (batch, length), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    for row, pad in enumerate(pads):
        attention_mask[row, :pad] = 0
    return input_ids.masked_fill(attention_mask == 0, 0), attention_mask


def decode_both(model, kernel, steps=STEPS, seed=2):
    """Prefill through the model, hand the cache to `kernel`, then feed the same tokens to both paths.

    Returns `[(kernel_logits, module_logits)]`, one pair per step."""
    input_ids, attention_mask = padded_prompts()
    batch, length = input_ids.shape
    positions = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    tokens = torch.randint(3, VOCAB, (steps, batch), generator=torch.Generator().manual_seed(seed))
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions, cache=cache, use_cache=True)
        kernel.start(cache, attention_mask, steps)  # before the module path extends (and so changes) the cache
        position = positions[:, -1] + 1
        mask = torch.cat([attention_mask, attention_mask.new_ones(batch, steps)], dim=1)
        pairs = []
        for step in range(steps):
            expected = model(
                input_ids=tokens[step, :, None],
                attention_mask=mask[:, : length + step + 1],
                position_ids=position[:, None],
                cache=cache,
                use_cache=True,
            ).logits[:, -1]
            pairs.append((kernel.step(tokens[step], position), expected))
            position = position + 1
    return pairs


def assert_parity(pairs, rel=1e-5):
    for step, (got, expected) in enumerate(pairs):
        scale = expected.abs().max().item()
        assert got.dtype == expected.dtype and got.shape == expected.shape
        torch.testing.assert_close(got, expected, rtol=0, atol=rel * scale, msg=lambda m, s=step: f"step {s}: {m}")


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_fp32_kernel_matches_the_module_path_at_every_step(variant):
    """The kernel is the sampler's decoding step for every MiniMind flavour: its logits must be the model's, to
    fp32 rounding, on a left-padded batch (padding masked, positions counted over real tokens) for a dozen steps
    (the static cache and RoPE table indexed at the right column)."""
    model = tiny(**VARIANTS[variant])
    assert_parity(decode_both(model, DecodeKernel(model)))


@pytest.mark.parametrize("variant", ["dense", "moe", "minimind3"])
def test_bf16_weights_round_only_the_gemms(variant):
    """`weights_dtype=bfloat16` (the trainer's default under bf16) must really decode with bf16 GEMM weights, yet
    stay within bf16 rounding of the fp32 model; norms, routing and the KV cache stay fp32."""
    model = tiny(**VARIANTS[variant])
    kernel = DecodeKernel(model, torch.bfloat16)
    packed = [kernel.lm_head, *(w[n] for w in kernel.weights for n in w if n in ("qkv", "o", "gate_up", "down"))]
    packed += [w[n] for w in kernel.weights for n in ("experts_gate_up", "experts_down") if n in w]
    packed += [t for w in kernel.weights for pair in w.get("shared", ()) for t in pair]
    assert packed and all(t.dtype == torch.bfloat16 for t in packed)
    assert all(p.dtype == torch.float32 for p in model.parameters())  # the policy itself is untouched
    pairs = decode_both(model, kernel)
    assert all(k.dtype == torch.float32 for k in kernel.keys)
    assert all(got.dtype == torch.float32 for got, _ in pairs)
    errors = torch.stack([(got - expected).abs().max() / expected.abs().max() for got, expected in pairs])
    assert (errors > 0).all(), errors  # zero would mean the fp32 weights were used
    # A bf16-rounded hidden state may flip a near-tied MoE routing choice: a real (and legitimate) difference of
    # the bf16 policy, so MoE models are held to the typical step, dense ones to every step.
    typical = errors.median() if model.config.use_moe else errors.max()
    assert typical < 3e-2, errors


def test_refresh_repacks_changed_weights():
    """The optimizer changes the policy between generation rounds; the kernel holds copies of (fused) weights,
    so it must decode with the old ones until `refresh` and with the new ones after it."""
    model = tiny(**MOE)
    kernel = DecodeKernel(model)
    with torch.no_grad():  # in place, as the optimizer does; all of these are packed into fused copies
        model.model.layers[0].self_attn.k_proj.weight.mul_(-1.5)
        model.model.layers[1].mlp.experts[0].up_proj.weight.add_(0.3)
        model.model.layers[1].mlp.shared_experts[0].gate_proj.weight.mul_(2)
    stale = decode_both(model, kernel)
    assert not all(torch.allclose(got, expected, atol=1e-3) for got, expected in stale)
    kernel.refresh(model)
    assert_parity(decode_both(model, kernel))


def llama():
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2,
    )
    return LlamaForCausalLM(config)


def test_unsupported_is_empty_exactly_where_the_kernel_is_exact():
    """The sampler trusts `unsupported` to decide between the kernel and the module path: it must accept every
    MiniMind flavour the parity test covers, and name a reason for models whose arithmetic it does not replicate
    (the kernel would otherwise decode them with the wrong weights or RoPE)."""
    from peft import LoraConfig, get_peft_model

    for overrides in VARIANTS.values():
        model = tiny(**overrides)
        assert DecodeKernel.unsupported(model) == []
        assert FastSampler().kernel_applies(model)
        assert not FastSampler(use_kernel=False).kernel_applies(model)

    lora = get_peft_model(tiny(), LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    with_bias = tiny()
    with_bias.model.layers[1].mlp.down_proj = nn.Linear(with_bias.config.intermediate_size, 64, bias=True)
    refused = {
        "peft wrapper": lora,
        "LoRA linears inside": lora.base_model.model,  # a MiniMindForCausalLM whose q_proj is a lora.Linear
        "rope dynamic": tiny(rope_parameters={"rope_type": "dynamic", "factor": 2.0}),
        "linear with bias": with_bias,
        "llama": llama(),
        "not on CPU": tiny().to("meta"),  # GPU decoding stays on the module path (the kernel is CPU-measured)
    }
    for name, model in refused.items():
        assert DecodeKernel.unsupported(model), name
        assert not FastSampler().kernel_applies(model), name
        with pytest.raises(ValueError, match="cannot run"):
            DecodeKernel(model)


@pytest.mark.parametrize("variant", ["dense", "moe"])
@pytest.mark.parametrize(
    "settings",
    [dict(do_sample=False), dict(do_sample=True, top_k=1, num_return_sequences=2)],  # top-1 draws: argmax, repeated
    ids=["greedy", "top1-sampled-x2"],
)
def test_fast_sampler_through_the_kernel_equals_modules_and_stock_generate(variant, settings, monkeypatch):
    """End to end: deterministic rollouts through the kernel are token for token those of the module path and of
    stock `generate` (left padding, num_return_sequences), and the kernel path is really the one taken."""
    model = tiny(**VARIANTS[variant])
    input_ids, attention_mask = padded_prompts()
    config = GenerationConfig(max_new_tokens=STEPS, pad_token_id=0, bos_token_id=1, eos_token_id=None, **settings)
    repeats = settings.get("num_return_sequences", 1)
    steps = []
    original_step = DecodeKernel.step
    monkeypatch.setattr(DecodeKernel, "step", lambda self, *args: steps.append(1) or original_step(self, *args))

    def sample(sampler):
        return sampler.generate(model, input_ids=input_ids, attention_mask=attention_mask, generation_config=config)

    stock = model.generate(input_ids=input_ids, attention_mask=attention_mask, generation_config=config)
    assert not steps
    modules = sample(FastSampler(use_kernel=False))
    assert not steps  # use_kernel=False never touches the kernel
    kernel = sample(FastSampler())
    assert len(steps) == STEPS - 1  # every token after the prompt's first one comes from a kernel step
    assert kernel.shape == (input_ids.shape[0] * repeats, input_ids.shape[1] + STEPS)
    assert torch.equal(kernel, modules)
    assert torch.equal(kernel, stock)
    assert len(set(map(tuple, kernel[:, input_ids.shape[1] :].tolist()))) > 1  # rows really differ

    # bf16 weights through the kernel: no bf16 copy of the whole model is made, and the policy stays fp32
    sampler = FastSampler(weights_dtype=torch.bfloat16)
    steps.clear()
    sample(sampler)
    assert len(steps) == STEPS - 1 and sampler._shadow is None
    assert sampler._kernel.lm_head.dtype == torch.bfloat16
    assert all(p.dtype == torch.float32 for p in model.parameters())


# --- the trainer's "auto" sampling dtype --------------------------------------------------------------------


def trainer_for(tmp_path, model_overrides=None, **args):
    from minimind_trl.models.minimind.tokenization_minimind import build_minimind_tokenizer
    from minimind_trl.trainer import MiniMindGRPOConfig, MiniMindGRPOTrainer

    tokenizer = build_minimind_tokenizer()
    torch.manual_seed(0)
    model = MiniMindForCausalLM(
        MiniMindConfig(
            hidden_size=32, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
            vocab_size=len(tokenizer), **(model_overrides or {}),
        )
    )
    config = MiniMindGRPOConfig(
        output_dir=str(tmp_path / "out"), use_cpu=True, report_to="none", per_device_train_batch_size=4,
        num_generations=4, max_completion_length=4, dataloader_num_workers=0, disable_tqdm=True, seed=0, **args,
    )
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": f"Question {i}"}]} for i in range(4)])
    return MiniMindGRPOTrainer(
        model, lambda completion_ids, **kwargs: [0.0] * len(completion_ids), config, train_dataset=dataset,
        processing_class=tokenizer,
    )


@pytest.mark.parametrize(
    ("args", "model_overrides", "native", "expected"),
    [
        (dict(bf16=True), None, True, torch.bfloat16),  # "auto" is the default
        (dict(), None, True, torch.bfloat16),  # bf16 unset: this CPU's choice, bf16 here
        (dict(), None, False, None),  # bf16 unset on a CPU without native bf16: fp32 training and decoding
        (dict(bf16=True), None, False, None),  # bf16 insisted on where it is slow: decoding stays fp32
        (dict(bf16=False), None, True, None),  # fp32 training samples in exact fp32
        (dict(bf16=True, sampling_weights_dtype=None), None, True, None),  # explicit None: the policy's dtype
        (dict(bf16=True), dict(rope_parameters={"rope_type": "dynamic", "factor": 2.0}), True, None),  # no kernel
    ],
    ids=["bf16-auto", "unset-native", "unset-avx2", "bf16-avx2", "fp32-auto", "bf16-explicit-none", "bf16-auto-no-kernel"],
)
def test_trainer_resolves_auto_sampling_dtype(tmp_path, cpu_machine, args, model_overrides, native, expected):
    """`sampling_weights_dtype="auto"` must give bf16 decode GEMMs only when training in bf16, the kernel applies
    (elsewhere a bf16 copy of the whole model would change the rollouts far more) and the CPU computes bf16
    natively (elsewhere bf16 GEMMs are many times slower), and honour None."""
    cpu_machine(native)
    trainer = trainer_for(tmp_path, model_overrides, **args)
    assert trainer._sampler is not None
    assert trainer._sampler.weights_dtype is expected
