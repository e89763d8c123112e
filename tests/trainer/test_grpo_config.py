"""`MiniMindGRPOConfig.__post_init__` checks what the command line, recipes and the Python API all pass through:
finite reward weights, a known sampling dtype, one meaning of `top_k`."""

import pytest
import torch
from grpo_fixtures import build_tiny_policy, tiny_recipe, write_rlaif

from minimind_trl.cli import run_command
from minimind_trl.errors import RecipeError, RewardSpecError
from minimind_trl.trainer.grpo_config import MiniMindGRPOConfig


def config(**values):
    return MiniMindGRPOConfig("out", use_cpu=True, bf16=False, **values)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("config")
    return build_tiny_policy(root / "policy"), write_rlaif(root / "rlaif.jsonl")


@pytest.fixture
def no_model_loading(monkeypatch):
    from minimind_trl.cli import build

    monkeypatch.setattr(build, "MiniMindGRPOTrainer", lambda *a, **k: pytest.fail("a model was loaded"))


@pytest.mark.parametrize("weights", [[float("nan"), 1.0], [1.0, float("inf")], [float("-inf")]])
def test_non_finite_reward_weights_are_refused(weights):
    with pytest.raises(RewardSpecError, match="reward_weights must be finite numbers"):
        config(reward_weights=weights)
    assert config(reward_weights=[0.0, 2.5]).reward_weights == [0.0, 2.5]


def test_non_finite_reward_weights_from_the_command_line_are_one_line(tiny, tmp_path, capsys, no_model_loading):
    recipe = tiny_recipe(tmp_path, *tiny)
    assert run_command("grpo", ["--config", str(recipe), "--reward_weights", "nan", "nan", "nan"]) == 2
    err = capsys.readouterr().err
    assert "reward_weights must be finite numbers, got [nan, nan, nan]" in err and "Traceback" not in err


@pytest.mark.parametrize("value", ["bf16", "int8", "fp32"])
def test_an_unknown_sampling_weights_dtype_is_refused_in_the_config(value):
    expected = f"sampling_weights_dtype must be one of auto, bfloat16, float16 or None .*{value}"
    with pytest.raises(RecipeError, match=expected):
        config(sampling_weights_dtype=value)


def test_an_unknown_sampling_weights_dtype_in_a_recipe_is_refused_early(tiny, tmp_path, capsys, no_model_loading):
    recipe = tiny_recipe(tmp_path, *tiny, sampling_weights_dtype="int8")
    assert run_command("grpo", ["--config", str(recipe)]) == 2
    err = capsys.readouterr().err
    assert "sampling_weights_dtype must be one of auto, bfloat16, float16 or None" in err and "Traceback" not in err


def test_none_is_a_sampling_weights_dtype_on_the_command_line(tiny, tmp_path):
    from minimind_trl.cli.recipe import parse_args

    recipe = tiny_recipe(tmp_path, *tiny)
    _, training_args, _, _ = parse_args(["--config", str(recipe), "--sampling_weights_dtype", "None"])
    assert training_args.sampling_weights_dtype is None
    assert config(sampling_weights_dtype=None).sampling_weights_dtype is None


def test_top_k_minus_one_means_disabled_on_every_path():
    assert config(top_k=-1).top_k == 0  # what stock `generate`, the lean sampler and vLLM all read as "disabled"
    with pytest.raises(RecipeError, match="top_k must be at least 0 or -1"):
        config(top_k=-2)


def test_the_lean_sampler_treats_a_negative_top_k_as_stock_generate_does():
    from transformers import GenerationConfig

    from minimind_trl import MiniMindConfig, MiniMindForCausalLM
    from minimind_trl.trainer.speed.fast_sampling import FastSampler

    model = MiniMindForCausalLM(
        MiniMindConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                       intermediate_size=64, vocab_size=64)
    )  # fmt: skip
    settings = GenerationConfig(do_sample=True, top_k=-1, max_new_tokens=2, pad_token_id=0)
    prompt = torch.ones(1, 3, dtype=torch.long)
    with pytest.raises(ValueError) as stock:
        model.generate(prompt, generation_config=settings)
    with FastSampler().patch(model), pytest.raises(ValueError) as lean:
        model.generate(prompt, generation_config=settings)
    assert str(lean.value) == str(stock.value)


# --- trl_defaults(): every default TRL's (docs/parity.md#as-a-grpotrainer) --------------------------------------


def _field_values(args) -> dict:
    import dataclasses

    from trl import GRPOConfig

    return {f.name: getattr(args, f.name) for f in dataclasses.fields(GRPOConfig)}


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"gradient_accumulation_steps": 4}, {"loss_type": "grpo", "beta": 0.04, "gradient_checkpointing": False}],
    ids=["defaults", "accumulation", "set-fields"],
)
def test_trl_defaults_is_grpo_config_field_for_field(kwargs):
    """Built with the same keywords, every field of TRL's own `GRPOConfig` has the same value: the departures of
    `MiniMindGRPOConfig`'s defaults (lr, schedule, beta, loss, sampling, ...) and TRL's derived ones alike
    (`steps_per_generation` from the accumulation steps, gradient checkpointing)."""
    from trl import GRPOConfig

    ours = MiniMindGRPOConfig.trl_defaults("out", use_cpu=True, bf16=False, **kwargs)
    theirs = GRPOConfig("out", use_cpu=True, bf16=False, **kwargs)
    assert _field_values(ours) == _field_values(theirs)
    assert ours.upstream == "trl"
    mine = MiniMindGRPOConfig("out", use_cpu=True, bf16=False, **kwargs)
    assert _field_values(mine) != _field_values(theirs)  # without the switch the defaults are MiniMind's


def test_trl_defaults_switch_minimind_behaviour_to_trls():
    """The settings TRL has no field for: TRL's advantages, log-probs at the sampling temperature, whole prompts, no
    MoE load-balancing loss (TRL adds one only from router logits, which MiniMind does not return)."""
    args = MiniMindGRPOConfig.trl_defaults("out", use_cpu=True, bf16=False)
    assert (args.advantage_estimator, args.tempered_logprobs, args.max_prompt_length) == ("trl", True, None)
    assert args.moe_aux_loss_weight == 0.0
    assert (args.fast_sampling, args.dynamic_sampling) == (True, False)  # our sampler stays: same distribution
    kept = MiniMindGRPOConfig.trl_defaults("out", use_cpu=True, bf16=False, advantage_estimator="minimind")
    assert kept.advantage_estimator == "minimind"  # any field can still be set
