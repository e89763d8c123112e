"""minimind_trl/trainer/rollouts/vllm_rollouts.py and the colocated engine's settings, without vLLM (tests/vllm_engine runs them in
vLLM's engine): the rollout dtype follows the recipe, vLLM's log-probs are on the trainer's scale, and what vLLM
cannot do is refused before it starts."""

import pytest
from trl.generation import vllm_generation

from minimind_trl import MiniMindConfig, MiniMindForCausalLM
from minimind_trl.errors import RecipeError, VLLMModelError
from minimind_trl.trainer import MiniMindGRPOConfig
from minimind_trl.trainer.trl_overrides import trl_init_overrides
from minimind_trl.trainer.rollouts.vllm_rollouts import (
    check_server_logprobs_mode,
    check_vllm_policy,
    colocated_engine_kwargs,
    logprobs_mode,
    rollout_dtype,
)

SMALL = dict(hidden_size=128, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, vocab_size=64)


def config(tmp_path, **kwargs) -> MiniMindGRPOConfig:
    return MiniMindGRPOConfig(output_dir=str(tmp_path), use_cpu=True, **kwargs)


def test_rollout_dtype_follows_the_recipe(tmp_path, cpu_machine):
    cpu_machine(True)  # bf16 unset on a CPU with native bf16 (as on GPUs): bf16
    assert rollout_dtype(config(tmp_path)) == "bfloat16"
    assert rollout_dtype(config(tmp_path, bf16=False)) == "float32"
    cpu_machine(False)  # bf16 unset on an AVX2 CPU: the training's fp32, for the rollouts too
    assert rollout_dtype(config(tmp_path)) == "float32"
    assert rollout_dtype(config(tmp_path, bf16=True)) == "bfloat16"  # insisted on


def test_vllm_log_probs_are_taken_where_the_trainer_scores(tmp_path):
    assert logprobs_mode(config(tmp_path, bf16=False)) == "raw_logprobs"  # temperature 1, whole vocabulary
    assert logprobs_mode(config(tmp_path, bf16=False, tempered_logprobs=True)) == "processed_logprobs"


def test_importance_sampling_correction_is_accepted_with_untempered_log_probs(tmp_path):
    """TRL's default correction compares vLLM's log-probs with the trainer's: both untempered now."""
    args = config(tmp_path, bf16=False, use_vllm=True)
    assert args.vllm_importance_sampling_correction and not args.tempered_logprobs


def test_only_a_colocated_engine_gets_settings(tmp_path):
    assert colocated_engine_kwargs(config(tmp_path, bf16=False)) == {}
    assert colocated_engine_kwargs(config(tmp_path, bf16=False, use_vllm=True)) == {
        "dtype": "float32", "logprobs_mode": "raw_logprobs"}  # fmt: skip
    assert colocated_engine_kwargs(config(tmp_path, use_vllm=True, vllm_mode="server")) == {}


def test_the_colocated_engine_is_built_with_them(monkeypatch):
    """TRL builds `vllm.LLM(...)` with `logprobs_mode="processed_logprobs"` and no dtype; inside the trainer's
    construction ours win, and TRL's class is back afterwards."""
    built = []
    monkeypatch.setattr(vllm_generation, "LLM", lambda **kwargs: built.append(kwargs), raising=False)
    trl_llm = vllm_generation.LLM
    with trl_init_overrides(1.0, None, {"dtype": "float32", "logprobs_mode": "raw_logprobs"}):
        vllm_generation.LLM(model="folder", logprobs_mode="processed_logprobs", seed=0)
    assert built == [{"model": "folder", "logprobs_mode": "raw_logprobs", "seed": 0, "dtype": "float32"}]
    assert vllm_generation.LLM is trl_llm


def test_minimind2_moe_is_refused_before_vllm_starts(tmp_path):
    policy = MiniMindForCausalLM(MiniMindConfig(**SMALL, use_moe=True))
    policy.save_pretrained(tmp_path / "m2moe")
    for model in (policy, str(tmp_path / "m2moe")):
        with pytest.raises(VLLMModelError, match="MiniMind2 MoE cannot run in vLLM"):
            check_vllm_policy(model, config(tmp_path, bf16=False, use_vllm=True))
    check_vllm_policy(policy, config(tmp_path, bf16=False))  # without vLLM: nothing to refuse
    check_vllm_policy(MiniMindForCausalLM(MiniMindConfig(**SMALL)), config(tmp_path, bf16=False, use_vllm=True))


@pytest.mark.parametrize("shape, head_size", [(dict(hidden_size=64), 16), (dict(hidden_size=32), 8),
                                              (dict(minimind_generation="minimind3", hidden_size=128, head_dim=48), 48)])
def test_a_head_size_vllms_cpu_attention_lacks_is_refused_before_the_engine_starts(tmp_path, shape, head_size):
    """Head size 16 (the demo's tiny folders) would fail after a minute of engine start-up with vLLM's raw
    traceback."""
    policy = MiniMindForCausalLM(MiniMindConfig(**{**SMALL, **shape}))
    policy.save_pretrained(tmp_path / "tiny")
    for model in (policy, str(tmp_path / "tiny")):
        with pytest.raises(RecipeError, match=f"supports \\(32, 64, 80, .*, 256\\); this policy's is {head_size}"):
            check_vllm_policy(model, config(tmp_path, bf16=False, use_vllm=True))
    check_vllm_policy(policy, config(tmp_path, bf16=False))  # without vLLM: nothing to refuse


def test_server_mode_without_cuda_is_refused(tmp_path):
    dense = MiniMindForCausalLM(MiniMindConfig(**SMALL))
    with pytest.raises(RecipeError, match="vllm_mode: server needs a CUDA device.*NCCL"):
        check_vllm_policy(dense, config(tmp_path, bf16=False, use_vllm=True, vllm_mode="server"))


def test_a_server_returning_other_log_probs_is_refused(tmp_path):
    args = config(tmp_path, bf16=False, use_vllm=True, vllm_mode="server")
    check_server_logprobs_mode("raw_logprobs", logprobs_mode(args))
    with pytest.raises(RecipeError, match="--logprobs-mode raw_logprobs"):
        check_server_logprobs_mode("processed_logprobs", logprobs_mode(args))  # what `trl vllm-serve` starts with


def test_a_registered_loss_with_vllm_takes_no_second_correction(tmp_path):
    """MiniMind-3's CISPO weighs tokens by exp(logp - vLLM's logp) itself; TRL's correction on top would weigh twice."""
    minimind3 = dict(bf16=False, use_vllm=True, loss_type="minimind3_cispo", advantage_estimator="group_zscore",
                     epsilon_high=5.0)
    with pytest.raises(RecipeError, match="Set vllm_importance_sampling_correction: false"):
        config(tmp_path, **minimind3)
    config(tmp_path, **minimind3, vllm_importance_sampling_correction=False)


def test_a_registered_loss_takes_vllms_log_probs_as_the_old_ones():
    """As upstream MiniMind-3 takes SGLang's; where vLLM gave none (NaN), TRL's or the current ones stand in."""
    import torch

    from minimind_trl.trainer import MiniMindGRPOTrainer

    current = torch.tensor([[-1.0, -2.0, -3.0]], requires_grad=True)
    sampling = torch.tensor([[-1.1, float("nan"), -2.9]])
    old_of = MiniMindGRPOTrainer._old_per_token_logps
    def trainer(use_vllm, rollout_func=None):
        return type("T", (), {"use_vllm": use_vllm, "rollout_func": rollout_func})()

    with_vllm, without = trainer(True), trainer(False)
    torch.testing.assert_close(old_of(with_vllm, {"sampling_per_token_logps": sampling}, current),
                               torch.tensor([[-1.1, -2.0, -2.9]]))  # fmt: skip
    trl_old = torch.tensor([[-0.5, -0.6, -0.7]])
    inputs = {"sampling_per_token_logps": sampling, "old_per_token_logps": trl_old}
    torch.testing.assert_close(old_of(with_vllm, inputs, current), torch.tensor([[-1.1, -0.6, -2.9]]))
    assert old_of(without, inputs, current) is trl_old
    assert not old_of(with_vllm, {}, current).requires_grad
    # A rollout_func (the agent rollout) is a rollout engine too: its log-probs are the old ones.
    with_rollout_func = trainer(False, rollout_func=lambda *args: None)
    torch.testing.assert_close(old_of(with_rollout_func, inputs, current), torch.tensor([[-1.1, -0.6, -2.9]]))
