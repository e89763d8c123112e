"""minimind_trl/vllm_plugin.py without vLLM: what vLLM is told a MiniMind folder is, the refusals and the entry
point (vLLM itself runs the plugin in tests/vllm_engine)."""

import tomllib
from importlib.metadata import entry_points

import pytest
import torch
from conftest import REPO_ROOT

from minimind_trl import MiniMindConfig
from minimind_trl.formats.architectures import transformers_config
from minimind_trl.errors import VLLMModelError
from minimind_trl.vllm_plugin import native_config

SMALL = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=300)
CASES = {  # name -> (MiniMindConfig kwargs, class vLLM runs, export format)
    "minimind2-dense": ({}, "LlamaForCausalLM", "llama"),
    "minimind3-dense-untied": (dict(minimind_generation="minimind3", head_dim=32, tie_word_embeddings=False),
                               "Qwen3ForCausalLM", "qwen3"),
    "minimind3-moe": (dict(minimind_generation="minimind3", use_moe=True, num_experts=4, num_experts_per_tok=2,
                           moe_intermediate_size=32), "Qwen3MoeForCausalLM", "qwen3_moe"),
}  # fmt: skip


@pytest.mark.parametrize("name", CASES)
def test_vllm_reads_a_minimind_config_as_the_export_would_write_it(name):
    kwargs, class_name, fmt = CASES[name]
    config = MiniMindConfig(**SMALL, **kwargs, dtype=torch.bfloat16)
    config._name_or_path = "/models/minimind"
    native = native_config(config)
    assert native.architectures == [class_name]
    assert native.dtype == torch.bfloat16 and native._name_or_path == "/models/minimind"
    exported = transformers_config(config, fmt).to_dict()
    assert {k: v for k, v in native.to_dict().items() if k not in ("architectures", "dtype", "_name_or_path")} == {
        k: v for k, v in exported.items() if k not in ("architectures", "dtype", "_name_or_path")
    }
    assert native.tie_word_embeddings == config.tie_word_embeddings


def test_minimind2_moe_is_refused_naming_the_folder_and_why():
    config = MiniMindConfig(**SMALL, use_moe=True)
    config._name_or_path = "/models/minimind2-moe"
    with pytest.raises(VLLMModelError, match=r"^/models/minimind2-moe: MiniMind2 MoE cannot run in vLLM.*shared expert"):
        native_config(config)


def test_a_yarn_transformers_computes_differently_is_refused():
    """Upstream caps YaRN's ramp differently from transformers: small head_dim / low theta give other logits."""
    config = MiniMindConfig(hidden_size=64, num_hidden_layers=1, num_attention_heads=16, num_key_value_heads=4,
                            vocab_size=100, rope_theta=1e4, inference_rope_scaling=True)  # head_dim 4
    with pytest.raises(VLLMModelError, match="LlamaForCausalLM.*YaRN gives other RoPE frequencies"):
        native_config(config)


def test_the_plugin_is_vllms_general_plugin_entry_point():
    declared = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["entry-points"]
    assert declared["vllm.general_plugins"] == {"minimind": "minimind_trl.vllm_plugin:register"}
    installed = {ep.name: ep for ep in entry_points(group="vllm.general_plugins")}
    assert installed["minimind"].value == "minimind_trl.vllm_plugin:register"
    from minimind_trl.vllm_plugin import register

    assert installed["minimind"].load() is register
