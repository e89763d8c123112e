"""`minimind-trl grpo`: recipe parsing, checks before loading, shipped recipes, and short real runs."""

import dataclasses
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
import yaml
from grpo_fixtures import (
    PROBE_DIR_ENV,
    REPO_ROOT,
    build_tiny_policy,
    saved_registries,
    subprocess_env,
    tiny_recipe,
    write_rlaif,
    write_toy_seams,
)

from minimind_trl.cli.recipe import RecipeError, resolve_recipe
from minimind_trl.grpo import main, parse_args, parse_recipe
from minimind_trl.trainer.algorithm.policy_losses import POLICY_LOSSES

RECIPES = REPO_ROOT / "recipes"
SEED_RECIPES = sorted((RECIPES / "minimind2" / "grpo").glob("*.yaml"))


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    return build_tiny_policy(tmp_path_factory.mktemp("policy"))


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_rlaif(tmp_path_factory.mktemp("data") / "rlaif.jsonl")


def refuse_model_loading(monkeypatch):
    """Any attempt to load a model from now on fails the test: the checks must come first."""
    from transformers import PreTrainedModel

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the arguments were checked")

    monkeypatch.setattr(PreTrainedModel, "from_pretrained", classmethod(refuse))


@pytest.fixture
def no_model_loading(monkeypatch):
    refuse_model_loading(monkeypatch)


def run_main(argv, capsys):
    code = main([str(arg) for arg in argv])
    return code, capsys.readouterr().err


# --------------------------------------------------------------------------- parsing


def test_recipe_gives_defaults_and_command_line_overrides(tmp_path, policy, data):
    recipe = tiny_recipe(tmp_path, policy, data, learning_rate=0.25, num_generations=4)
    script_args, training_args, model_args, parsed = parse_args(
        ["--config", str(recipe), "--learning_rate", "0.5", "--reward_funcs", "format", "tag_count"]
    )
    assert training_args.learning_rate == 0.5  # command line wins
    assert training_args.num_generations == 4  # from the recipe
    assert training_args.beta == 0.02  # MiniMindGRPOConfig's (upstream's) default
    assert script_args.reward_funcs == ["format", "tag_count"]
    assert model_args.model_name_or_path == str(policy)
    assert parsed.path == str(recipe) and "--learning_rate" in parsed.overrides


def test_parse_recipe_takes_overrides_as_a_dict(tmp_path, policy, data):
    recipe = tiny_recipe(tmp_path, policy, data)
    _, training_args, _, _ = parse_recipe(recipe, {"max_steps": 7, "reward_weights": [1.0, 2.0, 0.5]})
    assert training_args.max_steps == 7 and training_args.reward_weights == [1.0, 2.0, 0.5]


def test_typo_in_recipe_names_file_line_and_key(tmp_path, policy, data, capsys, no_model_loading):
    recipe = tiny_recipe(tmp_path, policy, data)
    lines = recipe.read_text().splitlines()
    lines.insert(1, "lerning_rate: 0.1")
    recipe.write_text("\n".join(lines) + "\n")
    code, err = run_main(["--config", recipe], capsys)
    assert code == 2
    assert f"{recipe}:2: unknown key 'lerning_rate' (did you mean 'learning_rate'?)" in err


def test_unknown_command_line_argument_is_an_error(tmp_path, policy, data):
    recipe = tiny_recipe(tmp_path, policy, data)
    with pytest.raises(RecipeError, match=r"not used by the HfArgumentParser: \['--not_a_field', '3'\]"):
        parse_args(["--config", str(recipe), "--not_a_field", "3"])


def test_config_flag_with_equals_sign(tmp_path, policy, data):
    recipe = tiny_recipe(tmp_path, policy, data, learning_rate=0.25)
    _, training_args, _, parsed = parse_args([f"--config={recipe}", "--max_steps", "3"])
    assert training_args.learning_rate == 0.25 and training_args.max_steps == 3  # the recipe was read
    assert parsed.path == str(recipe) and parsed.overrides == ["--max_steps", "3"]


@pytest.fixture
def no_accelerator():
    if torch.accelerator.is_available():
        pytest.skip("this machine has an accelerator: the CPU's choice does not apply")


@pytest.mark.parametrize("bf16_native", [False, True], ids=["avx2", "avx512-bf16"])
def test_seed_recipe_on_a_machine_without_gpu_takes_the_cpus_precision(no_accelerator, cpu_machine, bf16_native):
    """The seed recipes leave bf16 unset (upstream's bf16 on GPUs): on CPU they run, in what the CPU does fast."""
    cpu_machine(bf16_native)
    for recipe in SEED_RECIPES:
        _, training_args, _, _ = parse_args(["--config", str(recipe)])
        assert training_args.bf16 is bf16_native and training_args.use_cpu is bf16_native, recipe
        assert training_args.mixed_precision == ("bf16" if bf16_native else "no")


def test_explicit_bf16_on_a_machine_without_gpu_says_how_to_run_on_cpu(no_accelerator, cpu_machine):
    cpu_machine(True)
    with pytest.raises(RecipeError) as error:
        parse_args(["--config", str(RECIPES / "minimind2" / "grpo" / "reasoning.yaml"), "--bf16", "true"])
    assert "doesn't support bf16/gpu" in str(error.value)  # transformers' own message is kept
    assert "an explicit bf16 on CPU needs --use_cpu true; or leave bf16 unset" in str(error.value)


def test_missing_recipe_is_an_error(tmp_path):
    with pytest.raises(RecipeError, match="recipe not found: .*nope.yaml"):
        parse_args(["--config", str(tmp_path / "nope.yaml")])


def test_packaged_recipes_resolve_by_relative_name():
    assert (
        Path(resolve_recipe("minimind2/grpo/reasoning.yaml")).resolve()
        == (RECIPES / "minimind2/grpo/reasoning.yaml").resolve()
    )
    assert (
        Path(resolve_recipe("recipes/minimind2/grpo/chat")).resolve()
        == (RECIPES / "minimind2/grpo/chat.yaml").resolve()
    )


# --------------------------------------------------------------------------- checks before any model is loaded


@pytest.mark.parametrize(
    "override, message",
    [
        ({"dataset_name": "missing/rlaif.jsonl"}, "dataset_name: data file missing/rlaif.jsonl does not exist"),
        ({"reward_funcs": ["format", "tag_cont"]}, "unknown reward function 'tag_cont' (did you mean 'tag_count'?)"),
        ({"reward_funcs": ["no_such_module:reward"]}, "cannot import module 'no_such_module'"),
        (
            {"reward_funcs": ["grpo_fixtures:no_such_reward"]},
            "module 'grpo_fixtures' has no attribute 'no_such_reward'",
        ),
        ({"reward_weights": [1.0, 2.0]}, "reward_weights has 2 values for 3 reward_funcs"),
        ({"reward_funcs": ["reward_model"]}, "includes 'reward_model' but reward_model_name_or_path is not set"),
        ({"model_name_or_path": "./no/such/policy"}, "model_name_or_path: ./no/such/policy does not exist"),
        ({"model_name_or_path": "policy.pth"}, "does not exist"),
        ({"resume_from_checkpoint": "last"}, "no checkpoint-N folder in"),
    ],
)
def test_bad_input_fails_before_loading(tmp_path, policy, data, capsys, no_model_loading, override, message):
    recipe = tiny_recipe(tmp_path, policy, data, **override)
    code, err = run_main(["--config", recipe], capsys)
    assert code == 2
    assert message in err


@pytest.mark.parametrize(
    "name, message",
    [
        ("no_such_dataset_dir", "dataset_name: local path no_such_dataset_dir does not exist"),
        ("data/rlaif/train", "dataset_name: local path data/rlaif/train does not exist"),
        ("data/rlaif", "data/rlaif: cannot load the dataset ("),  # could be a Hub id: datasets is asked, offline
    ],
)
def test_missing_dataset_that_does_not_look_local(
    tmp_path, policy, data, capsys, monkeypatch, no_model_loading, name, message
):
    import datasets

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    recipe = tiny_recipe(tmp_path, policy, data, dataset_name=name)
    code, err = run_main(["--config", recipe], capsys)
    assert code == 2
    assert message in err and "Traceback" not in err


def test_reward_model_path_that_is_not_a_reward_model(tmp_path, policy, data, capsys, no_model_loading):
    recipe = tiny_recipe(
        tmp_path, policy, data, reward_funcs=["format", "reward_model"], reward_model_name_or_path=str(policy)
    )
    code, err = run_main(["--config", recipe], capsys)
    assert code == 2
    assert f"reward_model_name_or_path: {policy} is not a reward model" in err
    assert "MiniMindForCausalLM" in err


def test_native_policy_needs_a_tokenizer(tmp_path, policy, data, capsys, no_model_loading):
    native = tmp_path / "reason_32.pth"
    native.write_bytes(b"not checked before the tokenizer question")
    recipe = tiny_recipe(tmp_path, policy, data, model_name_or_path=str(native))
    code, err = run_main(["--config", recipe], capsys)
    assert code == 2 and "set tokenizer_name_or_path" in err


def test_batch_that_cannot_hold_whole_groups(tmp_path, policy, data, capsys, no_model_loading):
    recipe = tiny_recipe(tmp_path, policy, data, per_device_train_batch_size=6, num_generations=4)
    code, err = run_main(["--config", recipe], capsys)
    assert code == 2
    assert "generation_batch_size (6) must be divisible by num_generations (4)" in err
    assert "1 process(es)" in err


@pytest.mark.parametrize("backend", ["wandb", "swanlab", "trackio"])
def test_missing_logging_backend_names_the_extra(tmp_path, policy, data, capsys, no_model_loading, backend):
    from transformers.integrations import integration_utils

    if getattr(integration_utils, f"is_{backend}_available")():
        pytest.skip(f"{backend} is installed here")
    recipe = tiny_recipe(tmp_path, policy, data, report_to=backend)
    code, err = run_main(["--config", recipe], capsys)
    assert code == 2 and f"pip install 'minimind-trl[{backend}]'" in err


def test_the_installed_command_exits_non_zero_on_a_bad_recipe(tmp_path, policy, data):
    recipe = tiny_recipe(tmp_path, policy, data, reward_funcs=["format", "nope"])
    result = subprocess.run(
        [sys.executable, "-m", "minimind_trl.cli", "grpo", "--config", str(recipe)],
        capture_output=True,
        text=True,
        env=subprocess_env(),
        timeout=300,
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert "unknown reward function 'nope'" in result.stderr


# --------------------------------------------------------------------------- shipped recipes


def _recipe_values(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


@pytest.mark.parametrize("path", SEED_RECIPES, ids=lambda p: str(p.relative_to(RECIPES)))
def test_seed_recipes_parse_and_comment_every_value(path):
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line and not line.startswith((" ", "#")):
            assert "#" in line, f"{path}:{number}: value without a comment naming its upstream flag: {line!r}"
    # fp32, so that the parse does not depend on this machine's precision; everything else parses as shipped.
    script_args, training_args, model_args, _ = parse_args(
        ["--config", str(path), "--bf16", "false", "--use_cpu", "true"]
    )
    values = _recipe_values(path)
    assert training_args.learning_rate == pytest.approx(8e-8)
    assert script_args.reward_funcs == values["reward_funcs"]
    assert model_args.model_name_or_path == values["model_name_or_path"]


@pytest.mark.parametrize("path", SEED_RECIPES, ids=lambda p: str(p.relative_to(RECIPES)))
def test_seed_recipes_hold_the_seed_settings(path):
    from minimind_trl.trainer.outputs.model_card import UPSTREAM_SETTINGS

    values = _recipe_values(path)
    for name, flag, seed_value in UPSTREAM_SETTINGS:
        assert name in values, f"{path} does not state {name} ({flag})"
        if name == "bf16":  # unset: chosen for the machine, upstream's bf16 on GPUs (docs/cpu.md)
            assert values[name] is None, f"{path}: bf16 must stay unset so a CPU without native bf16 runs in fp32"
            continue
        assert (
            values[name] == pytest.approx(seed_value) if isinstance(seed_value, float) else values[name] == seed_value
        ), name


def test_seed_settings_table_matches_the_config_defaults():
    from minimind_trl.trainer.outputs.model_card import UPSTREAM_SETTINGS
    from minimind_trl.trainer import MiniMindGRPOConfig

    defaults = {f.name: f.default for f in dataclasses.fields(MiniMindGRPOConfig)}
    assert defaults["bf16"] is None  # chosen in __post_init__: True on GPUs (unless fp16), the CPU's choice on CPU
    defaults["bf16"] = True
    for name, _, seed_value in UPSTREAM_SETTINGS:
        assert defaults[name] == seed_value, name


# --------------------------------------------------------------------------- real runs (one process, in-process)


def test_two_steps_with_tensorboard(tmp_path, policy, data, monkeypatch):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monkeypatch.setenv(PROBE_DIR_ENV, str(tmp_path))
    recipe = tiny_recipe(tmp_path, policy, data, report_to="tensorboard")
    assert main(["--config", str(recipe)]) == 0

    out = tmp_path / "out"
    event_files = list((out / "runs").rglob("events.out.tfevents.*"))
    assert event_files, "tensorboard wrote no event file"
    events = EventAccumulator(str(event_files[0].parent))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    for tag in ("train/reward", "train/rewards/format_reward/mean", "train/rewards/token_reward/mean", "train/kl"):
        assert tag in tags, sorted(tags)
    assert [event.step for event in events.Scalars("train/reward")] == [1, 2]
    logged = [json.loads(line) for line in (tmp_path / "rewards-rank0.jsonl").read_text().splitlines()]
    expected = [sum(row["rewards"]) / len(row["rewards"]) for row in logged]
    assert [event.value for event in events.Scalars("train/rewards/token_reward/mean")] == pytest.approx(expected)

    trained = torch.load(out / "training_args.bin", weights_only=False)
    assert trained.max_steps == 2
    from safetensors.torch import load_file

    initial, final = load_file(policy / "model.safetensors"), load_file(out / "model.safetensors")
    assert max((final[k] - initial[k]).abs().max().item() for k in initial) > 1e-4  # the steps moved the weights


def test_native_pth_policy_is_converted_and_trained(tmp_path, policy, data):
    from minimind_trl import MiniMindForCausalLM
    from minimind_trl.formats.export_native import to_native_state_dict

    model = MiniMindForCausalLM.from_pretrained(policy)
    native = tmp_path / "reason_32.pth"
    torch.save(to_native_state_dict(model, dtype=torch.float16), native)
    recipe = tiny_recipe(
        tmp_path,
        policy,
        data,
        model_name_or_path=str(native),
        tokenizer_name_or_path=str(policy),
        max_steps=1,
        native_num_attention_heads=4,
        save_native_pth=True,
        save_strategy="steps",
        save_steps=1,
    )
    assert main(["--config", str(recipe)]) == 0

    out = tmp_path / "out"
    converted = MiniMindForCausalLM.from_pretrained(out / "_base_model")
    for key, value in model.state_dict().items():
        torch.testing.assert_close(converted.state_dict()[key], value.half().float())
    state = torch.load(out / "grpo_32.pth", weights_only=True)  # upstream's --save_weight grpo file
    at_checkpoint = torch.load(out / "checkpoint-1" / "grpo_32.pth", weights_only=True)  # also at every save
    assert all(torch.equal(at_checkpoint[key], value) for key, value in state.items())
    trained = MiniMindForCausalLM.from_pretrained(out)
    assert state.keys() == trained.state_dict().keys()
    assert all(value.dtype == torch.float16 for value in state.values())
    torch.testing.assert_close(
        state["model.norm.weight"].float(), trained.model.norm.weight.detach(), atol=1e-3, rtol=0
    )
    card = (out / "README.md").read_text()
    assert f"**Base model:** `{native}`" in card


def test_native_pth_policy_reads_the_export_sidecar(tmp_path, policy, data):
    """A `.pth` written by `minimind-trl export --format native` carries its non-inferable settings in a sidecar
    (head count, rope_theta, ...); the GRPO entry point converts with them, as `minimind-trl convert` does."""
    from minimind_trl import MiniMindForCausalLM
    from minimind_trl.formats.export_native import export_native

    model = MiniMindForCausalLM.from_pretrained(policy)
    model.config.rope_theta = 1e4  # not visible in the tensors: only the sidecar can carry it
    model.config.rope_parameters["rope_theta"] = 1e4
    native = export_native(model, tmp_path / "reason_32.pth", dtype=torch.float16)
    assert (tmp_path / "reason_32.config.json").is_file()
    recipe = tiny_recipe(tmp_path, policy, data, model_name_or_path=str(native), tokenizer_name_or_path=str(policy))
    assert main(["--config", str(recipe), "--max_steps", "1"]) == 0  # no native_num_attention_heads needed

    converted = MiniMindForCausalLM.from_pretrained(tmp_path / "out" / "_base_model").config
    assert converted.num_attention_heads == 4 and converted.rope_parameters["rope_theta"] == 1e4


def test_programs_build_the_same_trainer_with_their_own_data_and_callbacks(tmp_path, policy, data):
    """The demo's route: parse a recipe, bring a dataset and callbacks, get the entry point's trainer."""
    from datasets import Dataset
    from transformers import TrainerCallback

    from minimind_trl.grpo import build_trainer
    from minimind_trl.trainer import MiniMindGRPOTrainer

    class Marker(TrainerCallback):
        pass

    recipe = tiny_recipe(tmp_path, policy, data, dataset_name=None)
    script_args, training_args, model_args, parsed = parse_recipe(recipe)
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": "hi"}]}] * 4)
    trainer = build_trainer(
        script_args, training_args, model_args, callbacks=[Marker()], recipe=parsed, train_dataset=dataset
    )
    assert isinstance(trainer, MiniMindGRPOTrainer)
    assert trainer.train_dataset is dataset
    assert any(isinstance(callback, Marker) for callback in trainer.callback_handler.callbacks)
    assert trainer.run_card.recipe == str(recipe) and trainer.run_card.reward_funcs == script_args.reward_funcs


def test_native_checkpoint_that_does_not_convert_is_a_clean_error(tmp_path, policy, data, capsys):
    native = tmp_path / "reason_32.pth"
    torch.save({"model.embed_tokens.weight": torch.zeros(4, 8)}, native)  # no layers: not a MiniMind checkpoint
    recipe = tiny_recipe(tmp_path, policy, data, model_name_or_path=str(native), tokenizer_name_or_path=str(policy))
    code, err = run_main(["--config", recipe], capsys)
    assert code == 2 and str(native) in err
    assert not (tmp_path / "out" / "_base_model").exists()


# --------------------------------------------------------------------------- seams from a user's module


@pytest.fixture
def user_code(tmp_path, monkeypatch):
    """A folder outside the package on the import path; the registries as they were afterwards."""
    folder = tmp_path / "user_code"
    folder.mkdir()
    monkeypatch.syspath_prepend(str(folder))
    with saved_registries():
        yield folder


def seams_that_ran(probe: Path, rank: int = 0) -> Counter:
    return Counter(json.loads(line)["seam"] for line in (probe / f"seams-rank{rank}.jsonl").read_text().splitlines())


def test_a_recipe_trains_with_a_loss_estimator_and_aggregation_of_a_module_outside_the_package(
    tmp_path, policy, data, user_code, monkeypatch, capsys
):
    from minimind_trl.grpo import build_trainer, run
    from minimind_trl.trainer.outputs.checkpointing import RUN_INFO_NAME

    values = write_toy_seams(user_code, "toy_seams_recipe")
    probe = tmp_path / "probe"
    probe.mkdir()
    monkeypatch.setenv(PROBE_DIR_ENV, str(probe))
    recipe = tiny_recipe(tmp_path, policy, data, save_strategy="steps", save_steps=2, **values)
    script_args, training_args, model_args, parsed = parse_recipe(recipe)
    trainer = run(build_trainer(script_args, training_args, model_args, recipe=parsed), script_args)

    assert trainer.state.global_step == 2
    ran = seams_that_ran(probe)
    assert ran["advantage_estimator"] == 2 and ran["loss_type"] >= 2 and ran["loss_aggregation"] >= 2
    logged = [entry["toy/logp"] for entry in trainer.state.log_history if "toy/logp" in entry]
    assert len(logged) == 2 and all(value < 0 for value in logged)  # the loss's own metric, each step
    out = tmp_path / "out"
    record = json.loads((out / "checkpoint-2" / RUN_INFO_NAME).read_text())["run"]
    for key, value in values.items():
        assert record[f"{key}_function"] == value  # the run record names the function (module:qualname)
        assert f"| {key} | `{value}` | `{value}` |" in (out / "README.md").read_text()  # and the model card

    # The module changed: the same name now runs another function. A resume is refused, before any model loads.
    import toy_seams_recipe

    def reinforce(inputs):
        return -inputs.advantages * inputs.per_token_logps

    monkeypatch.setattr(toy_seams_recipe, "reinforce", reinforce)
    del POLICY_LOSSES[values["loss_type"]]
    refuse_model_loading(monkeypatch)
    code, err = run_main(["--config", recipe, "--resume_from_checkpoint", "last", "--max_steps", "3"], capsys)
    assert code == 2 and "changed: loss_type_function" in err and "test_grpo_cli:test_a_recipe" in err


def test_the_command_line_takes_them_too(tmp_path, policy, data):
    values = write_toy_seams(tmp_path / "user_code", "toy_seams_cli")
    probe = tmp_path / "probe"
    probe.mkdir()
    argv = [sys.executable, "-m", "minimind_trl.cli", "grpo", "--config", str(tiny_recipe(tmp_path, policy, data))]
    for key, value in values.items():
        argv += [f"--{key}", value]
    env = subprocess_env(**{PROBE_DIR_ENV: probe})
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path / "user_code"), env["PYTHONPATH"]])
    result = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    ran = seams_that_ran(probe)
    assert ran["advantage_estimator"] == 2 and ran["loss_type"] >= 2 and ran["loss_aggregation"] >= 2
    assert "| loss_aggregation | `toy_seams_cli:token_mean` |" in (tmp_path / "out" / "README.md").read_text()


@pytest.mark.parametrize(
    "key, name, problem",
    [
        ("loss_type", "no_such_function", "has no attribute 'no_such_function'"),
        ("advantage_estimator", "two_arguments", "cannot be called with an advantage estimator's arguments"),
        ("loss_aggregation", "NOT_A_FUNCTION", "is not callable"),
    ],
)
def test_a_bad_module_function_is_one_line_before_loading(
    tmp_path, policy, data, user_code, capsys, no_model_loading, key, name, problem
):
    write_toy_seams(user_code, "toy_seams_bad")
    recipe = tiny_recipe(tmp_path, policy, data, **{key: f"toy_seams_bad:{name}"})
    code, err = run_main(["--config", recipe], capsys)
    (line,) = [line for line in err.splitlines() if "error:" in line]
    assert code == 2 and f"{key} 'toy_seams_bad:{name}': " in line and problem in line


@pytest.mark.parametrize("module, returned, problem", [
    ("toy_nan_aggregation", "(per_token_loss * mask).sum() * float('nan')", "returned nan"),
    ("toy_detached_aggregation", "(per_token_loss * mask).sum().detach()", "detached from the per-token loss"),
])  # fmt: skip
def test_a_recipes_aggregation_returning_nan_or_a_detached_loss_stops_the_run(tmp_path, policy, data, user_code,
                                                                                capsys, module, returned, problem):
    """A NaN aggregation must not train NaN weights and exit 0, nor a detached one die in torch's traceback: one
    error line naming the key and the function, exit 2, no final weights."""
    (user_code / f"{module}.py").write_text(
        f"def bad(per_token_loss, mask, scale):\n    return {returned}\n", encoding="utf-8"
    )
    recipe = tiny_recipe(tmp_path, policy, data, loss_type="minimind3_cispo", advantage_estimator="group_zscore",
                         epsilon_high=5.0, loss_aggregation=f"{module}:bad")
    code, err = run_main(["--config", recipe], capsys)
    (line,) = [line for line in err.splitlines() if "error:" in line]
    assert code == 2 and f"loss aggregation '{module}:bad'" in line and "recipe key loss_aggregation" in line
    assert problem in line and "Traceback" not in err
    assert not (tmp_path / "out" / "model.safetensors").exists()
