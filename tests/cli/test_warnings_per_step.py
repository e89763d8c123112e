"""Every shipped recipe, a few steps on the demo's tiny models with a checkpoint at each step: no warning is given twice
(a warning raised at every step is noise however Python prints it: `warning_counts`), and the agent recipe does not
pass on TRL's notice that `rollout_func` is experimental (the package chose it). The demos' runs are checked in
tests/demos."""

import pytest
from grpo_fixtures import agent_rows, write_rows
from warning_counts import recorded_warnings

from minimind_trl.cli import main as cli
from minimind_trl.cli.build import TRL_ROLLOUT_FUNC_NOTICE
from minimind_trl.cli.recipe import shipped_recipes


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    """The demo's tiny MiniMind2 and MiniMind-3 (with their tokenizers), a tiny InternLM2 reward model, agent rows."""
    from minimind_trl.demos.model import build_model, build_tokenizer, save_folder
    from minimind_trl.models.internlm2_reward.tiny import write_tiny_internlm2_reward_model

    root = tmp_path_factory.mktemp("warnings")
    folders = {}
    for architecture in ("minimind2", "minimind3"):
        tokenizer = build_tokenizer(architecture)
        model = build_model(len(tokenizer), generation=architecture)
        folders[architecture] = save_folder(model, tokenizer, root / architecture)
    folders["reward_model"] = write_tiny_internlm2_reward_model(root / "rm")
    folders["agent_data"] = write_rows(root / "agent_rl.jsonl", agent_rows(4))
    return folders


def recipe_argv(recipe: str, folders: dict, out) -> list[str]:
    from minimind_trl.demos.model import PROMPTS_FILE

    agent = recipe.startswith("minimind3/agent/")
    policy = folders["minimind3" if recipe.startswith("minimind3/") else "minimind2"]
    argv = [
        "grpo", "--config", recipe, "--model_name_or_path", policy, "--tokenizer_name_or_path", policy,
        "--reward_model_name_or_path", folders["reward_model"],
        "--dataset_name", folders["agent_data"] if agent else PROMPTS_FILE, "--output_dir", out,
        "--max_steps", 2, "--save_steps", 1, "--max_completion_length", 8, "--use_cpu", "true", "--bf16", "false",
        *(["--agent_max_total_length", 160] if agent else []),
    ]  # fmt: skip
    return [str(arg) for arg in argv]


@pytest.mark.parametrize("recipe", shipped_recipes())
def test_no_warning_is_given_twice_in_a_run_of_a_shipped_recipe(recipe, tiny_models, tmp_path):
    with recorded_warnings() as recorded:
        assert cli(recipe_argv(recipe, tiny_models, tmp_path / "out")) == 0
    assert (tmp_path / "out" / "checkpoint-2").is_dir()
    assert not recorded.repeated(), "\n".join(recorded.repeated())
    notices = [line for line in recorded.lines() if TRL_ROLLOUT_FUNC_NOTICE in line]
    assert not notices, notices


def test_no_warning_is_given_twice_with_activation_checkpointing(tiny_models, tmp_path):
    """TRL turns checkpointing off and on around every rollout by transformers' former names (a FutureWarning each)."""
    argv = recipe_argv("minimind2/grpo/reasoning.yaml", tiny_models, tmp_path / "out") + [
        "--activation_checkpointing", "true"
    ]
    with recorded_warnings() as recorded:
        assert cli(argv) == 0
    assert not recorded.repeated(), "\n".join(recorded.repeated())
