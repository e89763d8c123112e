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
    from minimind_trl.trainer.fast_sampling import FastSampler

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
