"""A recipe of the other MiniMind generation than its policy is said before training, naming both generations and
the setting to change: every shipped recipe on a policy of each generation, and the upstream case, a native `.pth`
of the other generation through the command's own building stage."""

import json
import logging
from types import SimpleNamespace

import pytest
from test_shipped_recipes import ARCHITECTURE, GRPO_RECIPES, parts, recipe_argv  # noqa: F401  (parts: a fixture)

from minimind_trl.cli.model_generation import policy_architecture, recipe_generation_warning
from minimind_trl.grpo import parse_args


@pytest.mark.parametrize("architecture", ["minimind2", "minimind3"])
@pytest.mark.parametrize("recipe", GRPO_RECIPES)
def test_a_recipe_of_the_other_generation_is_said_naming_both(recipe, architecture, parts, tmp_path):
    argv = recipe_argv(recipe, parts, tmp_path / "out", architecture=architecture)
    script_args, training_args, _, _ = parse_args(argv)
    policy = parts.policies[architecture]
    assert policy_architecture(str(policy)) == architecture
    warning = recipe_generation_warning(script_args, training_args, str(policy), architecture)
    if ARCHITECTURE[recipe] in (None, architecture):
        assert warning is None, warning
        return
    own, other = {"minimind2": ("MiniMind2", "MiniMind-3"), "minimind3": ("MiniMind-3", "MiniMind2")}[architecture]
    assert f"is a {own} model, but reward_funcs lists {other}'s" in warning
    assert f"recipes/{architecture}/grpo/reasoning.yaml" in warning and "change reward_funcs" in warning


@pytest.mark.parametrize("recipe, native", [("minimind2/grpo/reasoning.yaml", "minimind3"),
                                            ("minimind3/grpo/reasoning.yaml", "minimind2")])  # fmt: skip
def test_the_warning_comes_before_training_for_a_native_checkpoint(recipe, native, parts, tmp_path, monkeypatch,
                                                                   caplog):  # fmt: skip
    """The upstream case: a native `.pth` of the other generation, its head count matching the recipe's, converts
    and would train; the warning is on stderr before the trainer is built."""
    from minimind_trl.cli.build import build_trainer
    from minimind_trl.demos.model import PROMPTS_FILE
    from minimind_trl.formats.export_native import export_native
    from minimind_trl.models.minimind.modeling_minimind import MiniMindForCausalLM
    from minimind_trl.trainer import grpo_trainer

    checkpoint = tmp_path / f"full_sft_{native}.pth"
    export_native(MiniMindForCausalLM.from_pretrained(parts.policies[native]), checkpoint)

    class NotBuilt(Exception):
        pass

    def refuse(*args, **kwargs):
        raise NotBuilt

    monkeypatch.setattr(grpo_trainer.MiniMindGRPOTrainer, "__init__", refuse)
    heads = json.loads((parts.policies[native] / "config.json").read_text())["num_attention_heads"]
    argv = recipe_argv(recipe, parts, tmp_path / "out", "--model_name_or_path", checkpoint,
                       "--native_num_attention_heads", heads, "--dataset_name", PROMPTS_FILE)  # fmt: skip

    script_args, training_args, model_args, parsed = parse_args(argv)
    with caplog.at_level(logging.WARNING, logger="minimind_trl.cli.model_generation"), pytest.raises(NotBuilt):
        build_trainer(script_args, training_args, model_args, recipe=parsed)
    labels = {"minimind2": "MiniMind2", "minimind3": "MiniMind-3"}
    assert f"the policy {checkpoint} is a {labels[native]} model" in caplog.text


def test_a_recipe_of_only_your_own_rewards_is_judged_by_its_upstream():
    """No built-in reward to tell: the generation the recipe declares (`upstream:`) against the policy's."""
    script_args = SimpleNamespace(reward_funcs=["myrewards:score"])
    warning = recipe_generation_warning(script_args, SimpleNamespace(upstream="minimind3"), "p", "minimind2")
    assert "is a MiniMind2 model, but the recipe declares upstream: minimind3" in warning
    assert "change upstream" in warning
    assert recipe_generation_warning(script_args, SimpleNamespace(upstream="minimind3"), "p", "minimind3") is None
    for upstream in (None, "minimind3_agent", "trl"):  # nothing to tell, or either generation's
        assert recipe_generation_warning(script_args, SimpleNamespace(upstream=upstream), "p", "minimind2") is None
    assert recipe_generation_warning(script_args, SimpleNamespace(upstream="minimind3"), "p", None) is None
