"""The run plan: a recipe that declares `upstream: <generation>` gets every departure from that generation's record
listed before any model loads; the recipe's callbacks are checked before any model loads."""

import logging

import pytest
from grpo_fixtures import build_tiny_policy, tiny_recipe, write_rlaif

from minimind_trl.cli.run_plan import check_reporting, check_run, load_callbacks, upstream_departures
from minimind_trl.errors import RecipeError
from minimind_trl.grpo import parse_args


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    return build_tiny_policy(tmp_path_factory.mktemp("policy"))


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_rlaif(tmp_path_factory.mktemp("data") / "rlaif.jsonl")


def test_a_recipe_following_minimind3_gets_its_departures_listed(tmp_path, policy, data, caplog):
    recipe = tiny_recipe(tmp_path, policy, data, upstream="minimind3", beta=0.1, loss_type="minimind3_grpo")
    script_args, training_args, model_args, _ = parse_args(["--config", str(recipe), "--learning_rate", "3e-7"])
    with caplog.at_level(logging.WARNING, logger="minimind_trl.cli.run_plan"):
        plan = check_run(script_args, training_args, model_args)

    departures = {line.split(":")[0]: line for line in plan.upstream_departures}
    assert departures["num_generations"] == "num_generations: 4 (upstream 6, --num_generations)"
    assert departures["loss_type"] == (
        "loss_type: minimind3_grpo (upstream minimind3_cispo, --loss_type cispo; grpo: minimind3_grpo)"
    )
    assert departures["reward_funcs"].startswith("reward_funcs: format, tag_count, grpo_fixtures:token_reward (upstream")
    assert "thinking_ratio" in departures and "advantage_estimator" in departures
    assert not {"learning_rate", "beta", "temperature", "loss_aggregation"} & set(departures)  # as upstream
    assert "follows MiniMind-3 (d65ef2c) except in" in caplog.text and departures["seed"] in caplog.text


def test_without_upstream_nothing_is_listed(tmp_path, policy, data):
    recipe = tiny_recipe(tmp_path, policy, data)
    script_args, training_args, model_args, _ = parse_args(["--config", str(recipe)])
    assert training_args.upstream is None
    assert upstream_departures(script_args, training_args) == []
    assert check_run(script_args, training_args, model_args).upstream_departures == []


def test_a_recipe_following_trl_gets_its_departures_from_trls_defaults_listed(tmp_path, policy, data, caplog):
    """`upstream: trl`: the recipe is compared with TRL's `GRPOConfig` defaults, as a MiniMind recipe with its
    generation's; the rows TRL has no value for (rewards, data) are not compared."""
    recipe = tiny_recipe(tmp_path, policy, data, upstream="trl", loss_type="dapo", beta=0.0, temperature=1.0)
    script_args, training_args, model_args, _ = parse_args(["--config", str(recipe)])
    with caplog.at_level(logging.WARNING, logger="minimind_trl.cli.run_plan"):
        plan = check_run(script_args, training_args, model_args)

    departures = {line.split(":")[0]: line for line in plan.upstream_departures}
    assert departures["learning_rate"] == "learning_rate: 0.01 (upstream 1e-06, GRPOConfig.learning_rate)"
    assert departures["advantage_estimator"].startswith("advantage_estimator: minimind (upstream trl,")
    assert departures["max_prompt_length"] == "max_prompt_length: 32 (upstream None, no prompt truncation in TRL 1.16)"
    assert not {"loss_type", "beta", "temperature", "loss_aggregation", "reward_funcs", "seed"} & set(departures)
    assert "follows TRL GRPOConfig (trl 1.16) except in" in caplog.text


@pytest.mark.cpu_kind
@pytest.mark.parametrize("bf16", [None, True, False])
def test_precision_departs_only_when_the_recipe_pins_what_upstream_would_not_do_on_this_device(
    tmp_path, policy, data, either_cpu_choice, bf16
):
    """On CPU upstream's loop trains in fp32 (its `--dtype bfloat16` autocast is entered on CUDA only). `bf16` unset
    lets the CPU choose (bf16 where native and faster, fp32 elsewhere): no departure whichever it chose; an explicit
    `bf16: false` is upstream's CPU numerics; an explicit `bf16: true` on CPU departs, and says so."""
    recipe = tiny_recipe(tmp_path, policy, data, upstream="minimind3", bf16=bf16)
    script_args, training_args, _, _ = parse_args(["--config", str(recipe)])
    chosen = either_cpu_choice.bf16 if bf16 is None else bf16
    assert training_args.bf16 is chosen
    departures = {line.split(":")[0]: line for line in upstream_departures(script_args, training_args)}
    if bf16 is True:
        assert departures["bf16"] == (
            "bf16: bf16 on CPU (upstream bf16 on GPU, fp32 on CPU, --dtype bfloat16; autocast on CUDA only)"
        )
    else:
        assert "bf16" not in departures, departures["bf16"]


CALLBACKS = """
from transformers import TrainerCallback
class Marker(TrainerCallback):
    pass
class NeedsArguments(TrainerCallback):
    def __init__(self, path):
        self.path = path
MARKER = Marker()
def not_a_callback():
    pass
"""


def test_callbacks_are_trainer_callbacks_built_without_arguments(tmp_path, monkeypatch):
    """A recipe's `callbacks` that could not serve as one is refused naming the key and the value (it would fail at
    the run's first event, or while the trainer is built, with a raw traceback)."""
    (tmp_path / "plan_callbacks.py").write_text(CALLBACKS)
    monkeypatch.chdir(tmp_path)
    built = load_callbacks(["plan_callbacks:Marker", "plan_callbacks:MARKER"])
    assert [type(callback).__name__ for callback in built] == ["Marker", "Marker"]
    for name, problem in [
        ("not_a_callback", "callbacks 'plan_callbacks:not_a_callback': a function, not a transformers TrainerCallback"),
        ("NeedsArguments", "callbacks 'plan_callbacks:NeedsArguments': NeedsArguments() raised TypeError: "),
    ]:
        with pytest.raises(RecipeError) as caught:
            load_callbacks([f"plan_callbacks:{name}"])
        assert str(caught.value).startswith(problem) and "\n" not in str(caught.value)


@pytest.mark.parametrize(
    "report_to, problem",
    [
        (["tensorboard,wandb"], "report_to 'tensorboard,wandb' is not a logging integration"),  # a recipe's string
        (["[tensorboard]"], "report_to '[tensorboard]' is not a logging integration"),
        (["tensorboard", "none"], "report_to 'none' stands alone"),
        (["all", "tensorboard"], "report_to 'all' stands alone"),
        (["tensorbored"], "report_to 'tensorbored' is not a logging integration"),
    ],
)
def test_report_to_names_transformers_integrations(report_to, problem):
    """What transformers would refuse with a bare ValueError while the trainer is built is one line before it."""
    with pytest.raises(RecipeError) as caught:
        check_reporting(report_to)
    message = str(caught.value)
    assert message.startswith(problem) and "report_to: [tensorboard, wandb]" in message and "\n" not in message
    check_reporting(["tensorboard"])
    check_reporting([])
