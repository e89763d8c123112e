"""docs/architecture.md's "Adding to it", as a newcomer follows it: each extension's file written as the doc shows
it, the recipe lines that name them, and a short `minimind-trl grpo` run that trains with the loss, the estimator
and the reward (and the tool run through the toolbox the agent recipe line builds)."""

import subprocess
import sys

import pytest
import yaml
from doc_blocks import doc_blocks
from grpo_fixtures import build_tiny_policy, subprocess_env, tiny_recipe, write_rlaif

from minimind_trl.agent.tools import load_toolbox

PAGE = "architecture.md"
FILES = {"A policy loss": "my_loss", "An advantage estimator": "my_estimator", "A reward": "my_reward",
         "A tool": "my_tool"}  # fmt: skip


def write_extensions(folder):
    """Each section's one python block, written to the file its first line names."""
    folder.mkdir()
    for title, module in FILES.items():
        (block,) = doc_blocks(PAGE, title, "python", 1)
        assert block.startswith(f"# {module}.py\n"), f"'{title}' must start with '# {module}.py'"
        (folder / f"{module}.py").write_text(block, encoding="utf-8")
    return folder


def recipe_lines():
    grpo, agent = (yaml.safe_load(block) for block in doc_blocks(PAGE, "Naming them from a recipe", "yaml", 2))
    return grpo, agent


@pytest.mark.slow
def test_the_documented_loss_estimator_and_reward_train_from_a_recipe(tmp_path):
    user_code = write_extensions(tmp_path / "user_code")
    grpo, _ = recipe_lines()
    assert {key.split(":")[0] for key in [grpo["loss_type"], grpo["advantage_estimator"], *grpo["reward_funcs"]]
            if ":" in key} == {"my_loss", "my_estimator", "my_reward"}  # fmt: skip
    policy = build_tiny_policy(tmp_path / "policy")
    data = write_rlaif(tmp_path / "data.jsonl")
    recipe = tiny_recipe(tmp_path, policy, data, **grpo, save_strategy="no")
    env = subprocess_env(PYTHONPATH=str(user_code))
    result = subprocess.run([sys.executable, "-m", "minimind_trl.cli", "grpo", "--config", str(recipe)],
                            capture_output=True, text=True, env=env, cwd=tmp_path, timeout=900)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    logged = result.stdout + result.stderr
    assert "reinforce/logp" in logged, "the loss's own metric is not logged"
    assert "rewards/short_answer/mean" in logged, "the reward is not logged"
    card = (tmp_path / "out" / "README.md").read_text(encoding="utf-8")
    for name in ("my_loss:reinforce", "my_estimator:rank_advantages"):
        assert name in card, f"the model card does not name {name}"


def test_the_documented_tool_runs_from_the_agent_recipe_line(tmp_path, monkeypatch):
    user_code = write_extensions(tmp_path / "user_code")
    monkeypatch.syspath_prepend(str(user_code))
    _, agent = recipe_lines()
    assert agent["rollout"] == "agent"
    toolbox = load_toolbox(agent["agent_tools"], timeout=None)
    outcome = toolbox.run_call({"name": "add", "arguments": {"a": 2, "b": 3}})
    assert outcome.error is None and outcome.result == 5
