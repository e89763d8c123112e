"""`recipes/minimind3/grpo/reasoning.yaml`: it is d65ef2c's `train_grpo.py` (every value the MiniMind-3 record's, the
run plan lists no departure, every comment names the flag), and `minimind-trl grpo --config` on it, overriding only
paths, size and CPU flags, trains a demo-sized MiniMind-3 with MiniMind-3's five reward terms and CISPO loss."""

import json
import logging
import math
from pathlib import Path

import pytest
import yaml
from grpo_fixtures import REPO_ROOT

from minimind_trl.cli import main as cli
from minimind_trl.generations import GENERATIONS, compare
from minimind_trl.grpo import parse_args

RECIPE = REPO_ROOT / "recipes" / "minimind3" / "grpo" / "reasoning.yaml"
TERMS = ("length", "thinking_length", "think_close_count", "repetition_penalty", "answer_reward_model")


def recipe_comments(path: Path) -> dict[str, str]:
    """Each top-level key of a recipe and the comment on its line."""
    comments = {}
    for line in path.read_text().splitlines():
        if line and not line.startswith((" ", "#")):
            key, _, rest = line.partition(":")
            comments[key] = rest.partition("#")[2]
    return comments


@pytest.mark.cpu_kind
def test_the_recipe_is_the_minimind3_record_and_departs_in_nothing(either_cpu_choice):
    """Every row of the MiniMind-3 record (script rows included) has the record's value, the run plan lists no
    departure, and each value's comment names the upstream flag the record gives for it: on a CPU that chooses bf16
    and on one that chooses fp32 (the recipe leaves `bf16` unset, so the hardware chooses, as for upstream)."""
    from minimind_trl.cli.run_plan import upstream_departures

    generation = GENERATIONS["minimind3"]
    # bf16 as shipped: on a CPU-only machine transformers wants use_cpu for it (not a setting of the record)
    script_args, training_args, model_args, _ = parse_args(["--config", str(RECIPE), "--use_cpu", "true"])
    assert training_args.upstream == "minimind3"
    assert upstream_departures(script_args, training_args) == []
    rows = compare(generation, training_args, script_args)
    assert len(rows) == len(generation.rows()) and [row.name for row in rows if not row.same] == []
    values, comments = yaml.safe_load(RECIPE.read_text()), recipe_comments(RECIPE)
    assert [key for key in values if not comments[key].strip()] == []  # every value says where it comes from
    named = 0
    for row in generation.rows():
        if row.flag.startswith("--"):
            assert row.name in values, f"{RECIPE} does not state {row.name} ({row.flag})"
            flag = row.flag.split()[0].rstrip(";,")
            assert flag in comments[row.name], (row.name, flag, comments[row.name])
            named += 1
    assert named >= 12
    assert model_args.model_name_or_path == "out/full_sft_768.pth"  # --from_weight full_sft


@pytest.fixture(scope="module")
def demo_sized(tmp_path_factory):
    """The demo's tiny MiniMind-3 (q/k norms) with its MiniMind-3-template tokenizer, and a tiny InternLM2 reward
    model, as folders."""
    from minimind_trl.demos.model import build_model, build_tokenizer, save_folder
    from minimind_trl.models.internlm2_reward.tiny import write_tiny_internlm2_reward_model

    root = tmp_path_factory.mktemp("minimind3-recipe")
    tokenizer = build_tokenizer("minimind3")
    policy = save_folder(build_model(len(tokenizer), generation="minimind3"), tokenizer, root / "policy")
    return policy, write_tiny_internlm2_reward_model(root / "rm")


def test_the_recipe_trains_a_demo_sized_minimind3_with_its_rewards_and_cispo(demo_sized, tmp_path, monkeypatch, caplog):
    """The installed command's code on the shipped recipe; overridden: where things are, the completion length,
    the step count, bf16 (fp32, as upstream on CPU) and save_steps (a checkpoint at the last step holds the log).
    The run plan lists exactly the departures among them (max_steps ends the epoch early: no setting of upstream's), every step logs
    each of the five reward terms (their sum is the reward) and the loss, and that loss is `minimind3_cispo` on
    `group_zscore` advantages (the registered functions were called at every step)."""
    from minimind_trl.demos.model import PROMPTS_FILE
    from minimind_trl.trainer.algorithm import advantages, policy_losses

    calls = {"minimind3_cispo": 0, "group_zscore": 0}

    def counted(registry, name):
        original = registry[name]

        def function(inputs):
            calls[name] += 1
            return original(inputs)

        monkeypatch.setitem(registry, name, function)

    counted(policy_losses.POLICY_LOSSES, "minimind3_cispo")
    counted(advantages.ADVANTAGE_ESTIMATORS, "group_zscore")
    policy, reward_model = demo_sized
    out = tmp_path / "out"
    argv = [
        "grpo", "--config", RECIPE,
        "--model_name_or_path", policy, "--tokenizer_name_or_path", policy, "--reward_model_name_or_path", reward_model,
        "--dataset_name", PROMPTS_FILE, "--output_dir", out,
        "--max_steps", 3, "--save_steps", 3, "--max_completion_length", 16, "--use_cpu", "true", "--bf16", "false",
    ]  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="minimind_trl.cli.run_plan"):
        assert cli([str(arg) for arg in argv]) == 0
    # `--bf16 false` on CPU is no departure: upstream's loop trains in fp32 on a CPU (its autocast is CUDA-only)
    assert "follows MiniMind-3 (d65ef2c) except in 2 setting(s)" in caplog.text
    for departure in ("max_completion_length: 16 (upstream 1024", "save_steps: 3 (up"):
        assert departure in caplog.text
    assert "bf16:" not in caplog.text

    state = json.loads((out / "checkpoint-3" / "trainer_state.json").read_text())
    logged = [entry for entry in state["log_history"] if "reward" in entry]
    assert [entry["step"] for entry in logged] == [1, 2, 3]
    for entry in logged:
        terms = [entry[f"rewards/{term}/mean"] for term in TERMS]
        assert all(math.isfinite(value) for value in terms) and -3.0 <= terms[-1] <= 3.0
        assert entry["reward"] == pytest.approx(sum(terms), abs=1e-5)
        assert math.isfinite(entry["loss"])
    assert calls["minimind3_cispo"] >= 3 and calls["group_zscore"] >= 3
    trained = json.loads((out / "checkpoint-3" / "config.json").read_text())
    assert trained["minimind_generation"] == "minimind3"
    assert (out / "grpo_64.pth").is_file()  # --save_weight grpo
