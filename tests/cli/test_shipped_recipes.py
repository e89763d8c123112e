"""Every shipped GRPO recipe with every documented option, as the docs show them: LoRA (`--use_peft`), the run
without the reward model (`--reward_model_name_or_path null`, docs/training.md's table) and the documented data
rows (a policy of the other generation: test_model_generation.py). Each recipe is checked up to the run plan with
tiny folders (no model loads); one LoRA run without the reward model trains a step, for the merged model's native
`.pth`."""

import json
import logging
import re
from types import SimpleNamespace

import pytest
import torch
import yaml
from doc_blocks import doc_blocks, doc_section
from grpo_fixtures import REPO_ROOT, write_rows

from minimind_trl.cli import main as cli
from minimind_trl.cli.run_plan import check_run
from minimind_trl.demos.agent import AGENT_WARM_START_RECIPE
from minimind_trl.demos.default import WARM_START_RECIPE
from minimind_trl.errors import MiniMindTRLError, RecipeError, RLAIFDataError
from minimind_trl.grpo import parse_args
from minimind_trl.rewards.registry import REWARDS

RECIPES = REPO_ROOT / "recipes"
SFT_RECIPES = {WARM_START_RECIPE, AGENT_WARM_START_RECIPE}  # the demos' warm starts: TRL's SFTTrainer, not GRPO
GRPO_RECIPES = sorted(
    name for path in RECIPES.rglob("*.yaml")
    if (name := path.relative_to(RECIPES).as_posix()) not in SFT_RECIPES and not name.startswith("accelerate/")
)  # fmt: skip
# the architecture each recipe is written for (None: the agent's rewards score either generation's tool calls)
ARCHITECTURE = {
    "demo/agent.yaml": None,
    "demo/grpo.yaml": "minimind2",
    "demo/grpo_full.yaml": "minimind2",
    "demo/grpo_minimind3.yaml": "minimind3",
    "minimind2/grpo/chat.yaml": "minimind2",
    "minimind2/grpo/reasoning.yaml": "minimind2",
    "minimind3/agent/agent_rl.yaml": None,
    "minimind3/grpo/reasoning.yaml": "minimind3",
}


def test_the_table_names_every_shipped_grpo_recipe():
    assert sorted(ARCHITECTURE) == GRPO_RECIPES


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    """A tiny policy folder of each architecture, a tiny reward model, and the docs' own data rows as files."""
    from minimind_trl.models.internlm2_reward.tiny import write_tiny_internlm2_reward_model
    from minimind_trl.models.minimind.tiny import save_tiny_minimind

    root = tmp_path_factory.mktemp("shipped")
    (rlaif,) = doc_blocks("training.md", "Data", "json", 1)
    (agent,) = doc_blocks("agent.md", "Data format", "json", 1)
    return SimpleNamespace(
        root=root,
        policies={arch: save_tiny_minimind(root / arch, architecture=arch) for arch in ("minimind2", "minimind3")},
        reward_model=write_tiny_internlm2_reward_model(root / "rm"),
        rlaif=write_rows(root / "rlaif.jsonl", [json.loads(rlaif)]),
        agent=write_rows(root / "agent_rl.jsonl", [json.loads(agent)]),
    )


def recipe_values(recipe: str) -> dict:
    return yaml.safe_load((RECIPES / recipe).read_text(encoding="utf-8"))


def scores_with_reward_model(recipe: str) -> bool:
    return any(REWARDS[name].scores_with_reward_model for name in recipe_values(recipe)["reward_funcs"])


def recipe_argv(recipe: str, parts, out, *extra, architecture=None, reward_model=True) -> list[str]:
    """The recipe on the tiny folders: only where things are, and bf16 off (the CPU kind's choice is not at issue)."""
    architecture = architecture or ARCHITECTURE[recipe] or "minimind3"
    policy = parts.policies[architecture]
    data = parts.agent if recipe_values(recipe).get("rollout") == "agent" else parts.rlaif
    argv = ["--config", str(RECIPES / recipe), "--model_name_or_path", str(policy), "--tokenizer_name_or_path",
            str(policy), "--dataset_name", str(data), "--output_dir", str(out), "--use_cpu", "true", "--bf16", "false"]
    if reward_model and scores_with_reward_model(recipe):
        argv += ["--reward_model_name_or_path", str(parts.reward_model)]
    return argv + [str(arg) for arg in extra]


def planned(argv):
    script_args, training_args, model_args, recipe = parse_args(argv)
    return check_run(script_args, training_args, model_args, recipe=recipe), script_args, training_args


# --------------------------------------------------------------------------- LoRA


@pytest.mark.parametrize("recipe", GRPO_RECIPES)
def test_every_recipe_takes_use_peft_as_the_docs_show_it(recipe, parts, tmp_path):
    """The shipped recipes set `save_native_pth: true`, which refused `--use_peft`; the run plan now takes it, the
    adapter on MiniMind's default targets."""
    plan, _, training_args = planned(recipe_argv(recipe, parts, tmp_path / "out", "--use_peft", "true"))
    assert plan.peft_config is not None and plan.peft_config.peft_type.value == "LORA"
    assert training_args.save_native_pth == recipe_values(recipe).get("save_native_pth", False)


# --------------------------------------------------------------------------- without the reward model


def documented_rules_only() -> dict[str, str]:
    """docs/training.md's table: recipe -> what it trains with under `--reward_model_name_or_path null`."""
    text = doc_section("training.md", "Without the reward model")
    rows = re.findall(r"^\| `([^`]+\.yaml)` \| (.+) \|$", text, re.M)
    return dict(rows)


def test_the_documented_command_is_the_flag_on_a_shipped_recipe():
    (block,) = doc_blocks("training.md", "Without the reward model", "bash", 1)
    words = block.replace("\\\n", " ").split()
    assert words[words.index("--config") + 1].removeprefix("recipes/") in GRPO_RECIPES
    assert words[-2:] == ["--reward_model_name_or_path", "null"]
    assert sorted(documented_rules_only()) == GRPO_RECIPES


@pytest.mark.parametrize("recipe", GRPO_RECIPES)
def test_every_recipe_runs_without_its_reward_model_as_documented(recipe, parts, tmp_path, caplog):
    """One flag, read from the docs' table per recipe: the reward-model rewards dropped with their weights (or the
    agent's replaced by its rule-only form), said once; a recipe scored by the reward model alone is refused."""
    documented = documented_rules_only()[recipe]
    argv = recipe_argv(recipe, parts, tmp_path / "out", "--reward_model_name_or_path", "null", reward_model=False)
    if documented.startswith("refused"):
        with pytest.raises(RecipeError, match="scores with the reward model alone"):
            parse_args(argv)
        return
    expected = re.match(r"`([^`]+)`", documented).group(1).split(", ")
    with caplog.at_level(logging.WARNING, logger="minimind_trl.cli.recipe"):
        plan, script_args, training_args = planned(argv)
    assert script_args.reward_funcs == expected and script_args.reward_model_name_or_path is None
    values = recipe_values(recipe)
    if values.get("reward_weights"):
        weight = dict(zip(values["reward_funcs"], values["reward_weights"]))
        assert training_args.reward_weights == [weight.get(name, 1.0) for name in expected]
    assert ("runs without its reward model" in caplog.text) == scores_with_reward_model(recipe)
    assert plan.run_card.reward_funcs == expected  # the card says what the run trained with


def test_rewards_given_on_the_command_line_are_taken_as_given(parts, tmp_path):
    argv = recipe_argv("minimind3/grpo/reasoning.yaml", parts, tmp_path / "out", "--reward_model_name_or_path",
                       "null", "--reward_funcs", "length", "answer_reward_model", "--reward_weights", "1", "1",
                       reward_model=False)  # fmt: skip
    with pytest.raises(MiniMindTRLError, match="answer_reward_model' but reward_model_name_or_path is not set"):
        planned(argv)


# --------------------------------------------------------------------------- data rows


def documented_roles() -> dict[str, str]:
    """docs/training.md's Data table: recipe -> its `dataset_roles` (or '—' for agent rows)."""
    rows = re.findall(r"^\| (`[^|]+`) \| (`\w+`|—)[^|]* \|", doc_section("training.md", "Data"), re.M)
    return {name: roles.strip("`") for names, roles in rows for name in re.findall(r"`([^`]+\.yaml)`", names)}


@pytest.mark.parametrize("recipe", GRPO_RECIPES)
def test_the_documented_rows_load_with_every_recipe(recipe, parts, tmp_path):
    """The docs' data row for the recipe's rollout loads with the recipe's settings; the Data table states each
    recipe's `dataset_roles` as the recipe sets it."""
    from minimind_trl.cli.build import load_train_dataset

    script_args, training_args, _, _ = parse_args(recipe_argv(recipe, parts, tmp_path / "out"))
    documented = documented_roles()[recipe]
    assert documented == ("—" if script_args.rollout == "agent" else script_args.dataset_roles)
    (row,) = load_train_dataset(script_args, training_args)
    assert row["prompt"][-1]["role"] == "user" and row["prompt"][-1]["content"]


@pytest.mark.parametrize("recipe", [name for name in GRPO_RECIPES if recipe_values(name).get("rollout") != "agent"])
def test_a_row_without_roles_loads_or_the_error_names_the_setting(recipe, parts, tmp_path):
    """`dataset_roles: data` (MiniMind-3's recipes) needs each turn's role: the error names the file, the line and
    the setting (it said only `turn 0 has role None`); by position the same row loads."""
    from minimind_trl.cli.build import load_train_dataset

    data = write_rows(tmp_path / "no_roles.jsonl", [{"conversations": [{"content": "2 + 3?"}, {"content": "5"}]}])
    argv = recipe_argv(recipe, parts, tmp_path / "out", "--dataset_name", data)
    script_args, training_args, _, _ = parse_args(argv)
    if script_args.dataset_roles == "data":
        with pytest.raises(RLAIFDataError, match=r"no_roles.jsonl:1: turn 0 has role None.*dataset_roles: data"):
            load_train_dataset(script_args, training_args)
        script_args, training_args, _, _ = parse_args(argv + ["--dataset_roles", "position"])  # the error's remedy
    (row,) = load_train_dataset(script_args, training_args)
    assert row["prompt"] == [{"role": "user", "content": "2 + 3?"}]


# --------------------------------------------------------------------------- one LoRA run without the reward model


@pytest.fixture(scope="module")
def lora_rules_only_run(parts):
    """The MiniMind-3 recipe with the two documented flags, one step, a checkpoint at it."""
    from minimind_trl.demos.model import PROMPTS_FILE

    out = parts.root / "lora-rules-only"
    argv = recipe_argv("minimind3/grpo/reasoning.yaml", parts, out, "--use_peft", "true", "--reward_model_name_or_path",
                       "null", "--dataset_name", PROMPTS_FILE, "--max_steps", 1, "--save_steps", 1,
                       "--max_completion_length", 8, reward_model=False)  # fmt: skip
    assert cli(["grpo", *argv]) == 0
    return out


def test_a_lora_run_writes_the_merged_models_native_pth(lora_rules_only_run, parts, tmp_path):
    """`save_native_pth` with `--use_peft`: the `.pth` at the end and in the checkpoint is the merged model, equal to
    what `merge-lora` folds (in upstream's fp16)."""
    from safetensors.torch import load_file

    out = lora_rules_only_run
    assert (out / "adapter_config.json").is_file() and not (out / "model.safetensors").exists()
    assert cli(["merge-lora", str(out), str(tmp_path / "merged")]) == 0
    merged = load_file(tmp_path / "merged" / "model.safetensors")
    base = load_file(parts.policies["minimind3"] / "model.safetensors")
    for folder in (out, out / "checkpoint-1"):
        (path,) = folder.glob("grpo_*.pth")
        native = torch.load(path, weights_only=True)
        for key, value in merged.items():
            assert torch.equal(native[key], value.to(torch.float16)), (folder, key)
    moved = [key for key in merged if not torch.equal(merged[key], base[key])]
    assert moved and all(".self_attn." in key or ".mlp." in key for key in moved)  # the adapter's layers only


def test_the_run_trained_on_the_rule_rewards_only(lora_rules_only_run):
    state = json.loads((lora_rules_only_run / "checkpoint-1" / "trainer_state.json").read_text())
    (logged,) = [entry for entry in state["log_history"] if "reward" in entry]
    rewards = sorted(key for key in logged if key.startswith("rewards/") and key.endswith("/mean"))
    assert rewards == [f"rewards/{name}/mean" for name in
                       sorted(["length", "thinking_length", "think_close_count", "repetition_penalty"])]  # fmt: skip


# --------------------------------------------------------------------------- evaluation


@pytest.mark.parametrize("recipe", GRPO_RECIPES)
def test_every_recipe_evaluates_as_the_docs_show_it(recipe, parts, tmp_path):
    """TRL's eval batch (8) does not hold whole groups of 6: a recipe sets its eval batch to its training batch, so
    the documented evaluation flags plan on every shipped recipe."""
    flags = ("--eval_strategy", "steps", "--eval_steps", "2", "--dataset_test_split", "train")
    _, _, training_args = planned(recipe_argv(recipe, parts, tmp_path / "out", *flags))
    assert training_args.per_device_eval_batch_size == recipe_values(recipe)["per_device_train_batch_size"]
