"""PEFT's default LoRA targets for MiniMind: a bare `LoraConfig()` (no `target_modules`, as TRL's tests and many
users write it) adapts every linear layer of attention and MLP, experts included, and neither the head nor a router."""

import pytest
import torch
from peft import LoraConfig, get_peft_model
from peft.tuners.lora import LoraLayer

from minimind_trl import MiniMindConfig, MiniMindForCausalLM

VARIANTS = {
    "minimind2-dense": dict(),
    "minimind3-dense": dict(minimind_generation="minimind3"),
    "minimind2-moe": dict(use_moe=True, num_experts=4, num_experts_per_tok=2),
    "minimind3-moe": dict(minimind_generation="minimind3", use_moe=True, num_experts=4, num_experts_per_tok=2,
                          moe_intermediate_size=32),
}  # fmt: skip
NOT_ADAPTED = {"lm_head", "gate"}  # the head (tied to the embeddings) and the MoE router


@pytest.mark.parametrize("variant", VARIANTS)
def test_a_bare_lora_config_adapts_minimind_linear_layers(variant):
    config = MiniMindConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                            vocab_size=300, **VARIANTS[variant])  # fmt: skip
    model = MiniMindForCausalLM(config)
    linear = {name for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)}
    wanted = {name for name in linear if name.split(".")[-1] not in NOT_ADAPTED}
    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8))
    adapted = {name.removeprefix("base_model.model.") for name, module in peft_model.named_modules()
               if isinstance(module, LoraLayer)}  # fmt: skip
    assert adapted == wanted
    if "moe" in variant:
        assert any(".experts." in name for name in adapted)
    peft_model(torch.tensor([[1, 2, 3]])).logits.sum().backward()  # the adapted model runs and trains
    assert all(param.grad is not None for name, param in peft_model.named_parameters() if "lora_" in name)
