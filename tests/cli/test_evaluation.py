"""Evaluation during training, as TRL's `trl grpo` runs it: with `eval_strategy`, the trainer generates on held-out
prompts (`dataset_test_split` of the data, or `eval_dataset_name`), rendered and checked as the training prompts
are, and logs their reward per term beside the training curves; MiniMind2, MiniMind-3 (prompts rendered per
prompt) and the agent rollout; a resume evaluates on schedule with the uninterrupted run's figures and refuses
other held-out prompts; the model card shows the last evaluation."""

import json
import os
import shutil

import pytest
from grpo_fixtures import PROBE_DIR_ENV, PROMPTS, agent_rows, build_tiny_policy, tiny_recipe, write_rlaif, write_rows
from test_agent_recipe import agent_argv
from test_minimind3_recipe import RECIPE as MINIMIND3_RECIPE
from test_minimind3_recipe import TERMS as MINIMIND3_TERMS
from test_minimind3_recipe import demo_sized  # noqa: F401 (a fixture: a demo-sized MiniMind-3 and reward model)

from minimind_trl.agent.reward import TERMS as AGENT_TERMS
from minimind_trl.cli import main as cli
from minimind_trl.grpo import main, parse_args
from minimind_trl.prompt_rendering import prompt_renderer

HELD_OUT = PROMPTS[6:]  # the two Chinese prompts; the first six train
EVAL_EVERY_2 = ["--eval_strategy", "steps", "--eval_steps", "2", "--save_strategy", "steps", "--save_steps", "2"]


def log_history(checkpoint) -> list[dict]:
    return json.loads((checkpoint / "trainer_state.json").read_text())["log_history"]


def evaluations(history) -> list[dict]:
    return [entry for entry in history if "eval_reward" in entry]


def probed_prompts(probe_dir) -> list[list[str]]:
    return [json.loads(line)["prompts"] for line in (probe_dir / "rewards-rank0.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def split_data(tmp_path_factory):
    """A data folder with train.jsonl and test.jsonl: `datasets` reads it as a train and a test split."""
    root = tmp_path_factory.mktemp("evaluation")
    (root / "data").mkdir()
    write_rlaif(root / "data" / "train.jsonl", PROMPTS[:6])
    write_rlaif(root / "data" / "test.jsonl", HELD_OUT)
    return build_tiny_policy(root / "policy"), root / "data"


@pytest.fixture(scope="module")
def straight(split_data, tmp_path_factory):
    """4 steps of MiniMind2 evaluated on the test split every 2 steps, checkpoints at 2 and 4."""
    policy, data = split_data
    root = tmp_path_factory.mktemp("straight")
    recipe = tiny_recipe(root, policy, data, max_steps=4)
    probe = root / "probe"
    probe.mkdir()
    os.environ[PROBE_DIR_ENV] = str(probe)
    try:
        assert main(["--config", str(recipe), *EVAL_EVERY_2]) == 0
    finally:
        del os.environ[PROBE_DIR_ENV]
    return recipe, root / "out", probe


def test_minimind2_evaluates_the_test_split_per_reward_beside_training(straight, split_data):
    """Every 2 steps the held-out prompts, and only they, are generated on and scored: the reward of each function
    and their sum, under TRL's `eval_` names, in the same log as the training curves; the card shows the last."""
    _, out, probe = straight
    history = log_history(out / "checkpoint-4")
    evaluated = evaluations(history)
    assert [entry["step"] for entry in evaluated] == [2, 4]
    assert [entry["step"] for entry in history if "reward" in entry] == [1, 2, 3, 4]
    for entry in evaluated:
        terms = [entry[f"eval_rewards/{name}/mean"] for name in ("format_reward", "tag_count_reward", "token_reward")]
        assert entry["eval_reward"] == pytest.approx(sum(terms), abs=1e-6) and entry["eval_reward"] > 0
    batches = probed_prompts(probe)
    held_out = [batch for batch in batches if set(batch) & set(HELD_OUT)]
    assert len(held_out) == 2 and all(sorted(batch) == sorted(HELD_OUT * 4) for batch in held_out)  # 4 each
    assert all(set(batch) <= set(PROMPTS[:6]) for batch in batches if batch not in held_out)
    card = (out / "README.md").read_text()
    assert f"- **Held-out prompts:** `{split_data[1]} [test]`" in card
    section = card[card.index("### Held-out rewards (the last evaluation)") :]
    assert f"| eval_reward | {evaluated[-1]['eval_reward']:.6g} |" in section and "| step | 4 |" in section


def test_a_resume_evaluates_on_schedule_as_the_uninterrupted_run(straight, tmp_path):
    """Checkpoint-2 resumed: the evaluation at step 4 is the uninterrupted run's, to the last digit (same prompts,
    same samples), and the log keeps the evaluation of step 2."""
    recipe, out, _ = straight
    resumed = tmp_path / "out"
    shutil.copytree(out / "checkpoint-2", resumed / "checkpoint-2")
    assert main(["--config", str(recipe), *EVAL_EVERY_2, "--output_dir", str(resumed),
                 "--resume_from_checkpoint", "last"]) == 0  # fmt: skip
    expected, got = evaluations(log_history(out / "checkpoint-4")), evaluations(log_history(resumed / "checkpoint-4"))
    assert [entry["step"] for entry in got] == [2, 4]
    keys = [key for key in expected[-1] if key.startswith("eval_") and "runtime" not in key and "per_second" not in key]
    assert {key: got[-1][key] for key in keys} == {key: expected[-1][key] for key in keys}


def test_a_resume_that_evaluates_on_other_prompts_is_refused(straight, tmp_path, capsys):
    """The held-out prompts are part of the run record: other ones would draw one curve on two sets. Starting or
    stopping evaluation is allowed (the record compares what both runs have)."""
    recipe, out, _ = straight
    other = write_rlaif(tmp_path / "held.jsonl", PROMPTS[:2])
    resumed = tmp_path / "out"
    shutil.copytree(out / "checkpoint-2", resumed / "checkpoint-2")
    argv = ["--config", str(recipe), *EVAL_EVERY_2, "--output_dir", str(resumed), "--resume_from_checkpoint", "last"]
    assert main([*argv, "--eval_dataset_name", str(other)]) == 2
    assert "; changed: eval_dataset. A resume continues the same run" in capsys.readouterr().err
    assert not (resumed / "checkpoint-4").exists()
    record = json.loads((out / "checkpoint-2" / "minimind_run.json").read_text())["run"]
    assert record["eval_dataset"]["rows"] == len(HELD_OUT)


def test_minimind3_evaluates_prompts_rendered_as_training_renders_them(demo_sized, tmp_path):  # noqa: F811
    """The MiniMind-3 recipe (thinking_ratio, system prompts: every prompt rendered per row) with a held-out file of
    its own: the held-out prompts go through the same renderer, and each of the five reward terms is logged."""
    from minimind_trl.cli.grpo import train
    from minimind_trl.demos.model import PROMPTS_FILE

    policy, reward_model = demo_sized
    held_out = write_rlaif(tmp_path / "held.jsonl", HELD_OUT)
    script_args, training_args, model_args, recipe = parse_args([str(arg) for arg in [
        "--config", MINIMIND3_RECIPE, "--model_name_or_path", policy, "--tokenizer_name_or_path", policy,
        "--reward_model_name_or_path", reward_model, "--dataset_name", PROMPTS_FILE, "--output_dir", tmp_path / "out",
        "--max_steps", 1, "--max_completion_length", 16, "--use_cpu", "true", "--bf16", "false",
        "--eval_strategy", "steps", "--eval_steps", 1, "--eval_dataset_name", held_out, "--num_generations_eval", 4,
    ]])  # fmt: skip
    trainer = train(script_args, training_args, model_args, recipe=recipe)
    renderer = prompt_renderer(trainer.eval_dataset)
    assert renderer is not None and renderer.rendering == prompt_renderer(trainer.train_dataset).rendering
    (evaluated,) = evaluations(trainer.state.log_history)
    terms = [evaluated[f"eval_rewards/{term}/mean"] for term in MINIMIND3_TERMS]
    assert evaluated["eval_reward"] == pytest.approx(sum(terms), abs=1e-5)


def test_the_agent_rollout_evaluates_with_its_reward_terms(demo_sized, tmp_path):  # noqa: F811
    """TRL's `rollout_func` path evaluates: the agent rollout runs on the held-out rows (tools, turns), and the agent
    reward's terms are logged under `eval_agent_reward/`, summing to the held-out reward."""
    policy, reward_model = demo_sized
    data = write_rows(tmp_path / "agent_rl.jsonl", agent_rows(4))
    held_out = write_rows(tmp_path / "held.jsonl", agent_rows(6)[4:])
    out = tmp_path / "out"
    argv = agent_argv(policy, reward_model, data, out, "--max_steps", "1", "--save_steps", "1", "--eval_strategy",
                      "steps", "--eval_steps", "1", "--eval_dataset_name", held_out)
    assert cli(argv) == 0
    (evaluated,) = evaluations(log_history(out / "checkpoint-1"))
    terms = [evaluated[f"eval_agent_reward/{term}"] for term in AGENT_TERMS]
    assert evaluated["eval_reward"] == pytest.approx(sum(terms), abs=1e-5)
    assert 1.0 <= evaluated["eval_agent/turns"] <= 3.0
    assert "eval_agent_reward/gt_match" in (out / "README.md").read_text()
