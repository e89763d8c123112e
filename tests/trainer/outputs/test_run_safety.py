"""Nothing lost, nothing silently wrong: one run per output folder, no new run over another run's checkpoints,
resumes only from complete checkpoints of the same recipe, a final save that is never half-published, sampling
temperatures that sample, and reward functions whose bad output is named."""

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
from grpo_fixtures import PROMPTS, build_tiny_policy, hold_lock, subprocess_env, tiny_recipe, write_rlaif

from minimind_trl.errors import OutputDirError, RecipeError, ResumeError, RewardFunctionError
from minimind_trl.cli.grpo import main  # raises the user error (`minimind_trl.grpo.main` reports it, exit 2)
from minimind_trl.grpo import main as grpo_command
from minimind_trl.trainer.algorithm.loss_kwargs import LOSS_KWARGS_ATTRIBUTE, declare_loss_kwargs
from minimind_trl.trainer.algorithm.policy_losses import POLICY_LOSSES, LossKwarg, register_policy_loss
from minimind_trl.trainer.outputs.checkpointing import RUN_INFO_NAME, STAGING_DIR, publish_files
from minimind_trl.trainer.grpo_config import MiniMindGRPOConfig
from minimind_trl.trainer.checks.reward_checks import checked_reward_funcs, reward_output_problem
from minimind_trl.trainer.outputs.run_lock import LOCK_NAME, output_dir_lock
from minimind_trl.trainer.outputs.run_safety import check_resume_checkpoint

# SIGKILL in the middle of writing the final model's weights (100 bytes written), as a full disk or a kill would.
KILL_DURING_FINAL_SAVE = """
import os, signal, sys
import transformers.modeling_utils as modeling_utils
save_file = modeling_utils.safe_save_file
def kill_mid_write(tensors, filename, metadata=None):
    if "checkpoint-" not in filename:
        with open(filename, "wb") as f:
            f.write(b"x" * 100)
        os.kill(os.getpid(), signal.SIGKILL)
    return save_file(tensors, filename, metadata=metadata)
modeling_utils.safe_save_file = kill_mid_write
from minimind_trl.cli.grpo import main  # raises the user error (`minimind_trl.grpo.main` reports it, exit 2)
from minimind_trl.grpo import main as grpo_command
sys.exit(main(sys.argv[1:]))
"""


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("safety")
    return build_tiny_policy(root / "policy"), write_rlaif(root / "rlaif.jsonl")


@pytest.fixture(scope="module")
def checkpointed(tiny, tmp_path_factory):
    """A finished 2-step run with checkpoint-1 and checkpoint-2 (copied per test before anything is removed)."""
    policy, data = tiny
    root = tmp_path_factory.mktemp("checkpointed")
    recipe = tiny_recipe(root, policy, data, save_strategy="steps", save_steps=1)
    assert main(["--config", str(recipe)]) == 0
    return root


def copy_run(checkpointed, tmp_path):
    shutil.copytree(checkpointed / "out", tmp_path / "out")
    text = (checkpointed / "recipe.yaml").read_text().replace(str(checkpointed / "out"), str(tmp_path / "out"))
    (tmp_path / "recipe.yaml").write_text(text)
    return tmp_path / "out", tmp_path / "recipe.yaml"


def no_model_loading(monkeypatch):
    """Make any model load fail loudly: the refusals below must come first."""
    from minimind_trl.cli import build

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the refusal")

    monkeypatch.setattr(build, "MiniMindGRPOTrainer", refuse)


# --------------------------------------------------------------------------- 1. temperature


@pytest.mark.parametrize("temperature", [0.0, -1.0, float("nan")])
def test_non_positive_temperature_is_refused(temperature):
    with pytest.raises(ValueError, match="temperature must be a positive number"):
        MiniMindGRPOConfig("out", temperature=temperature, use_cpu=True)


def test_non_positive_temperature_is_a_recipe_error(tiny, tmp_path):
    recipe = tiny_recipe(tmp_path, *tiny, temperature=-1)
    with pytest.raises(RecipeError, match=r"recipe.yaml:\d+: temperature: must be a positive number"):
        main(["--config", str(recipe)])


def test_the_lean_sampler_refuses_a_non_positive_temperature():
    from transformers import GenerationConfig

    from minimind_trl import MiniMindConfig, MiniMindForCausalLM
    from minimind_trl.trainer.speed.fast_sampling import FastSampler

    model = MiniMindForCausalLM(
        MiniMindConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                       intermediate_size=64, vocab_size=64)
    )  # fmt: skip
    config = GenerationConfig(do_sample=True, temperature=-1.0, top_k=5, max_new_tokens=2, pad_token_id=0)
    with FastSampler().patch(model), pytest.raises(ValueError, match="temperature must be positive"):
        model.generate(torch.ones(1, 3, dtype=torch.long), generation_config=config)


# --------------------------------------------------------------------------- 2. one run per output folder


def test_a_second_run_into_a_held_output_dir_is_refused(tiny, tmp_path, monkeypatch):
    out = tmp_path / "out"
    holder = hold_lock(out)
    try:
        assert holder.stdout.readline().strip() == "locked"
        no_model_loading(monkeypatch)
        with pytest.raises(OutputDirError, match=f"in use by the run of pid {holder.pid}"):
            main(["--config", str(tiny_recipe(tmp_path, *tiny))])
        with pytest.raises(OutputDirError, match="in use"):
            with output_dir_lock(str(out)):
                pass
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    with output_dir_lock(str(out)):  # released when the holder ended
        assert json.loads((out / LOCK_NAME).read_text())["pid"] == os.getpid()


def test_a_link_at_the_lock_name_stops_the_command_before_any_model(tiny, tmp_path, monkeypatch, capsys):
    """`minimind-trl grpo` into a folder where someone planted a link at the lock's name: one line naming the lock
    file, exit 2, and the file the link points to untouched (it was truncated to 0 bytes, exit 0)."""
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me\n")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / LOCK_NAME).symlink_to(victim)
    no_model_loading(monkeypatch)
    assert grpo_command(["--config", str(tiny_recipe(tmp_path, *tiny))]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"minimind-trl grpo: error: output_dir {tmp_path / 'out'}: its run lock "
                          f"{tmp_path / 'out' / LOCK_NAME} is a symbolic link") and len(err.splitlines()) == 1, err
    assert victim.read_text() == "keep me\n"


def test_a_finished_run_leaves_no_lock_file(checkpointed):
    assert (checkpointed / "out" / "checkpoint-2").is_dir()  # the run trained and saved
    assert not (checkpointed / "out" / LOCK_NAME).exists()


# --------------------------------------------------------------------------- 3. another run's checkpoints


def test_a_new_run_refuses_a_folder_with_another_runs_checkpoints(checkpointed, tmp_path, monkeypatch):
    out, recipe = copy_run(checkpointed, tmp_path)
    no_model_loading(monkeypatch)
    with pytest.raises(OutputDirError, match=r"holds another run's checkpoints \(checkpoint-1, checkpoint-2\)"):
        main(["--config", str(recipe)])
    assert (out / "checkpoint-2" / "optimizer.pt").is_file()


def test_overwrite_output_dir_replaces_the_old_checkpoints(checkpointed, tmp_path):
    out, recipe = copy_run(checkpointed, tmp_path)
    (out / "checkpoint-6").mkdir()  # one the new run would not have replaced
    assert main(["--config", str(recipe), "--overwrite_output_dir", "true", "--save_steps", "2"]) == 0
    assert sorted(p.name for p in out.iterdir() if p.name.startswith("checkpoint-")) == ["checkpoint-2"]


def test_the_starting_policy_is_never_the_output_even_with_overwrite(tiny, tmp_path, monkeypatch):
    policy, data = tiny
    no_model_loading(monkeypatch)
    before = {p.name: p.read_bytes() for p in policy.iterdir()}
    for overwrite in ("false", "true"):
        argv = ["--config", str(tiny_recipe(tmp_path, *tiny)), "--output_dir", str(policy)]
        with pytest.raises(OutputDirError, match=f"output_dir {policy} is the input model_name_or_path {policy}"):
            main(argv + ["--overwrite_output_dir", overwrite])
    assert {p.name: p.read_bytes() for p in policy.iterdir()} == before


def test_a_policy_inside_a_checkpoint_of_the_output_dir_is_refused(checkpointed, tmp_path, monkeypatch):
    out, recipe = copy_run(checkpointed, tmp_path)
    no_model_loading(monkeypatch)
    argv = ["--config", str(recipe), "--model_name_or_path", str(out / "checkpoint-1")]
    argv += ["--overwrite_output_dir", "true"]
    refusal = f"output_dir {out} contains the input model_name_or_path {out}/checkpoint-1"
    with pytest.raises(OutputDirError, match=refusal):
        main(argv)  # overwrite_output_dir would delete checkpoint-1, the model the run starts from
    assert (out / "checkpoint-1" / "model.safetensors").is_file()


def test_a_finished_model_in_the_output_dir_needs_overwrite(checkpointed, tmp_path, monkeypatch):
    out, recipe = copy_run(checkpointed, tmp_path)
    for checkpoint in out.glob("checkpoint-*"):
        shutil.rmtree(checkpoint)
    no_model_loading(monkeypatch)
    with pytest.raises(OutputDirError, match=r"holds a finished model \(config.json, model.safetensors\)"):
        main(["--config", str(recipe)])
    from minimind_trl.trainer.outputs.output_dir import check_output_dir

    check_output_dir(str(out), resuming=False, overwrite=True)  # told to replace it: allowed
    check_output_dir(str(out), resuming=True, overwrite=False)  # continuing the run that wrote it: allowed


def test_a_resume_with_other_settings_is_refused(checkpointed, tmp_path, monkeypatch):
    out, recipe = copy_run(checkpointed, tmp_path)
    assert "recipe" in json.loads((out / "checkpoint-2" / RUN_INFO_NAME).read_text())
    no_model_loading(monkeypatch)
    argv = ["--config", str(recipe), "--resume_from_checkpoint", "last"]
    with pytest.raises(ResumeError, match=r"other settings \(learning_rate: 0.01 -> 1e-30\)"):
        main(argv + ["--learning_rate", "1e-30"])


@pytest.fixture
def coef_loss():
    """`resume_coef_loss`, a registered loss declaring `coef` (default 0.5), for the test only."""
    saved = dict(POLICY_LOSSES)

    @register_policy_loss("resume_coef_loss", loss_kwargs={"coef": LossKwarg(0.5, (0.0, None))})
    def resume_coef_loss(inputs):
        return -inputs.loss_kwargs["coef"] * inputs.advantages * inputs.per_token_logps

    yield resume_coef_loss
    POLICY_LOSSES.clear()
    POLICY_LOSSES.update(saved)


def test_a_resume_compares_the_loss_kwargs_in_effect(tiny, tmp_path, monkeypatch, coef_loss):
    """The run record keeps a loss's keyword arguments as in effect (its declared defaults with the recipe's over
    them): a default its module changed between the run and the resume is refused like a changed recipe value, and
    `{}`, `null` or the default written out are the same run."""
    recipe = tiny_recipe(tmp_path, *tiny, max_steps=1, save_strategy="steps", save_steps=1,
                         loss_type="resume_coef_loss", loss_kwargs=None)  # fmt: skip
    assert main(["--config", str(recipe)]) == 0
    record = json.loads((tmp_path / "out" / "checkpoint-1" / RUN_INFO_NAME).read_text())
    assert record["recipe"]["loss_kwargs"] == {"coef": 0.5}
    no_model_loading(monkeypatch)  # a resume whose checks pass goes on to load the models: the AssertionError
    resume = ["--config", str(recipe), "--resume_from_checkpoint", "last"]
    for same in ([], ["--loss_kwargs", "{}"], ["--loss_kwargs", '{"coef": 0.5}'], ["--loss_kwargs", '{"coef": "5e-1"}']):
        with pytest.raises(AssertionError, match="a model was loaded"):
            main(resume + same)
    changed = r"loss_kwargs: \{'coef': 0.5\} -> \{'coef': 0.7\} \(in effect: the loss's declared defaults"
    with pytest.raises(ResumeError, match=changed):
        main(resume + ["--loss_kwargs", '{"coef": 0.7}'])
    edited = declare_loss_kwargs("policy loss 'resume_coef_loss'", {"coef": LossKwarg(0.7, (0.0, None))})
    monkeypatch.setattr(coef_loss, LOSS_KWARGS_ATTRIBUTE, edited)  # the loss's module now declares 0.7
    with pytest.raises(ResumeError, match=changed):
        main(resume)


def rewrite_recipe(recipe, **changes):
    import yaml

    values = yaml.safe_load(recipe.read_text())
    values.update(changes)
    recipe.write_text(yaml.safe_dump(values, sort_keys=False))


@pytest.mark.parametrize(
    "change, keys",
    [
        (dict(reward_funcs=["format", "grpo_fixtures:token_reward"]), "reward_funcs"),
        (dict(dataset_max_samples=4), "dataset_max_samples"),
        (dict(dataset_name="OTHER_DATA"), "dataset_name"),
        (dict(model_name_or_path="OTHER_POLICY"), "model_fingerprint, model_name_or_path"),
        (dict(reward_weights=[1.0, 2.0, 1.0]), "reward_weights"),
    ],
)
def test_a_resume_that_changes_what_defines_the_run_is_refused(checkpointed, tmp_path, monkeypatch, change, keys):
    out, recipe = copy_run(checkpointed, tmp_path)
    if change.get("dataset_name") == "OTHER_DATA":
        change["dataset_name"] = str(write_rlaif(tmp_path / "other.jsonl"))
    if change.get("model_name_or_path") == "OTHER_POLICY":
        change["model_name_or_path"] = str(build_tiny_policy(tmp_path / "other-policy"))
    rewrite_recipe(recipe, **change)
    no_model_loading(monkeypatch)
    with pytest.raises(ResumeError, match=f"changed: {keys}\\. A resume continues the same run"):
        main(["--config", str(recipe), "--resume_from_checkpoint", "last"])


def test_a_resume_on_edited_data_is_refused_by_the_trainer(checkpointed, tmp_path):
    out, recipe = copy_run(checkpointed, tmp_path)
    data = tmp_path / "rlaif.jsonl"
    write_rlaif(data, prompts=["What is one plus one?", *PROMPTS[1:]])  # same size, one prompt edited
    rewrite_recipe(recipe, dataset_name=str(data))
    record = json.loads((out / "checkpoint-2" / RUN_INFO_NAME).read_text())
    record["run"]["dataset_name"] = os.path.realpath(data)  # the path of the run that wrote it: only content differs
    (out / "checkpoint-2" / RUN_INFO_NAME).write_text(json.dumps(record))
    with pytest.raises(ResumeError, match="changed: train_dataset_fingerprint"):
        main(["--config", str(recipe), "--resume_from_checkpoint", "last"])


@pytest.mark.parametrize("record", ['{"recipe": 5}', "[1, 2]", '{"world_size": 1}', None])
def test_a_foreign_or_missing_run_record_is_refused_unless_accepted(
    checkpointed, tmp_path, monkeypatch, caplog, record
):
    out, recipe = copy_run(checkpointed, tmp_path)
    path = out / "checkpoint-2" / RUN_INFO_NAME
    if record is None:
        path.unlink()  # a checkpoint of stock TRL
    else:
        path.write_text(record)
    argv = ["--config", str(recipe), "--resume_from_checkpoint", "last", "--max_steps", "3"]
    with monkeypatch.context() as patched:
        no_model_loading(patched)
        with pytest.raises(ResumeError, match="nothing checks that this resume continues the same run"):
            main(argv)
    assert main(argv + ["--accept_inexact_resume", "true", "--learning_rate", "0.5"]) == 0
    assert "NOTHING was checked" in caplog.text


# --------------------------------------------------------------------------- 4. partial checkpoints


@pytest.mark.parametrize("missing", ["optimizer.pt", "scheduler.pt", "rng_state.pth"])
def test_an_incomplete_checkpoint_is_refused_naming_the_missing_file(checkpointed, tmp_path, monkeypatch, missing):
    out, recipe = copy_run(checkpointed, tmp_path)
    (out / "checkpoint-1" / missing).unlink()
    no_model_loading(monkeypatch)
    with pytest.raises(ResumeError, match=f"incomplete for an exact resume: missing {missing}"):
        main(["--config", str(recipe), "--resume_from_checkpoint", str(out / "checkpoint-1"), "--max_steps", "2"])


def test_accept_inexact_resume_resumes_anyway_with_a_warning(checkpointed, tmp_path, caplog):
    out, recipe = copy_run(checkpointed, tmp_path)
    (out / "checkpoint-1" / "optimizer.pt").unlink()
    argv = ["--config", str(recipe), "--resume_from_checkpoint", str(out / "checkpoint-1")]
    assert main(argv + ["--accept_inexact_resume", "true"]) == 0
    assert "not an exact continuation" in caplog.text


def test_accept_inexact_resume_resumes_past_a_truncated_optimizer_state(checkpointed, tmp_path, caplog):
    out, recipe = copy_run(checkpointed, tmp_path)
    optimizer = out / "checkpoint-1" / "optimizer.pt"
    optimizer.write_bytes(optimizer.read_bytes()[:500])
    argv = ["--config", str(recipe), "--resume_from_checkpoint", str(out / "checkpoint-1")]
    with pytest.raises(ResumeError, match="damaged optimizer.pt .* --accept_inexact_resume true to continue without"):
        main(argv)
    assert main(argv + ["--accept_inexact_resume", "true"]) == 0  # as the refusal says: fresh optimizer state
    assert "that state is not loaded (fresh instead)" in caplog.text
    assert json.loads((out / "checkpoint-2" / "trainer_state.json").read_text())["global_step"] == 2


class RunsCode:
    """A pickle payload: unpickling it would call `open(marker, "w")`."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_an_rng_state_that_would_run_code_is_refused_as_unsafe(checkpointed, tmp_path, monkeypatch, caplog):
    out, recipe = copy_run(checkpointed, tmp_path)
    marker = tmp_path / "code-ran"
    torch.save({"python": RunsCode(marker)}, out / "checkpoint-1" / "rng_state.pth")
    argv = ["--config", str(recipe), "--resume_from_checkpoint", str(out / "checkpoint-1")]
    with monkeypatch.context() as patched:
        no_model_loading(patched)
        with pytest.raises(ResumeError) as caught:
            main(argv)
    message = str(caught.value)
    assert "is unsafe to resume: unsafe rng_state.pth (a pickle that would run code when loaded, it calls" in message
    assert "refused, never loaded" in message and "weights_only=False" not in message
    assert main(argv + ["--accept_inexact_resume", "true"]) == 0  # never loaded: the seed's RNG instead
    assert not marker.exists()
    assert "rng_state.pth" in caplog.text and "not loaded" in caplog.text


@pytest.mark.parametrize(
    "name, damage, fragment",
    [
        ("model.safetensors", lambda p: p.write_bytes(p.read_bytes()[:-100]), "model.safetensors is truncated"),
        ("optimizer.pt", lambda p: p.write_bytes(p.read_bytes()[:500]), "damaged optimizer.pt"),
        ("trainer_state.json", lambda p: p.write_text("{not json"), "trainer_state.json is unreadable"),
    ],
)
def test_a_damaged_checkpoint_names_the_file(checkpointed, tmp_path, name, damage, fragment):
    out, _ = copy_run(checkpointed, tmp_path)
    damage(out / "checkpoint-2" / name)
    args = MiniMindGRPOConfig(str(out), use_cpu=True, bf16=False, per_device_train_batch_size=8, num_generations=4)
    with pytest.raises(ResumeError, match=fragment):
        check_resume_checkpoint(str(out / "checkpoint-2"), args)


def test_a_damaged_run_record_is_named_before_models_load(checkpointed, tmp_path, monkeypatch):
    out, recipe = copy_run(checkpointed, tmp_path)
    (out / "checkpoint-2" / RUN_INFO_NAME).write_text('{"world_size": 1, ')
    no_model_loading(monkeypatch)
    with pytest.raises(ResumeError, match=f"checkpoint-2/{RUN_INFO_NAME} is unreadable"):
        main(["--config", str(recipe), "--resume_from_checkpoint", "last"])


def test_a_correct_resume_does_not_warn_about_a_missing_lm_head(checkpointed, tmp_path, caplog):
    out, recipe = copy_run(checkpointed, tmp_path)
    assert main(["--config", str(recipe), "--resume_from_checkpoint", str(out / "checkpoint-1")]) == 0
    assert "lm_head.weight" not in caplog.text


# --------------------------------------------------------------------------- 7. too few prompts


def test_too_few_prompts_for_one_step_is_refused_before_models_load(tiny, tmp_path, monkeypatch, capsys):
    policy, _ = tiny
    data = write_rlaif(tmp_path / "one.jsonl", prompts=["What is two plus three?"])
    no_model_loading(monkeypatch)
    assert grpo_command(["--config", str(tiny_recipe(tmp_path, policy, data))]) == 2
    err = capsys.readouterr().err
    assert "1 prompt(s) in " in err and "one.jsonl, but one step needs 2" in err and "Traceback" not in err


# --------------------------------------------------------------------------- 8. the final save


def test_a_kill_during_the_final_save_leaves_no_finished_looking_folder(tiny, tmp_path):
    recipe = tiny_recipe(tmp_path, *tiny, max_steps=1)
    result = subprocess.run(
        [sys.executable, "-c", KILL_DURING_FINAL_SAVE, "--config", str(recipe)],
        env=subprocess_env(), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == -9, result.stderr[-3000:]
    out = tmp_path / "out"
    assert (out / STAGING_DIR / "final" / "model.safetensors").stat().st_size == 100  # the kill hit mid-write
    assert not (out / "config.json").exists() and not (out / "model.safetensors").exists()


def test_publish_files_moves_config_last_and_replaces_an_older_model(tmp_path):
    staged, final = tmp_path / "out" / STAGING_DIR / "final", tmp_path / "out"
    staged.mkdir(parents=True)
    (final / "config.json").write_text("old")
    (final / "checkpoint-2").mkdir()
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        (staged / name).write_text(f"new {name}")
    publish_files(str(staged), str(final))
    assert (final / "config.json").read_text() == "new config.json"
    assert (final / "model.safetensors").read_text() == "new model.safetensors"
    assert (final / "checkpoint-2").is_dir() and not (final / STAGING_DIR).exists()


# --------------------------------------------------------------------------- reward functions


class FakeTrainer:
    def __init__(self, func):
        self.reward_funcs, self.reward_func_names = [func], [func.__name__]
        self.state = type("State", (), {"global_step": 4})()


@pytest.mark.parametrize(
    "output, fragment",
    [
        ([1.0, 2.0], "2 rewards for 3 completions"),
        ([1.0, float("inf"), 0.0], "inf at position 1"),
        (["good", 1.0, 0.0], "str 'good' at position 0"),
        (1.0, "float 1.0 instead of a list"),
    ],
)
def test_a_bad_reward_output_names_the_function_and_the_step(output, fragment):
    def my_reward(**kwargs):
        return output

    trainer = FakeTrainer(my_reward)
    with checked_reward_funcs(trainer, 3), pytest.raises(RewardFunctionError) as caught:
        trainer.reward_funcs[0](prompts=[], completions=[])
    assert f"reward function my_reward at step 5 returned {fragment}" in str(caught.value)
    assert trainer.reward_funcs == [my_reward]


def test_a_raising_reward_function_is_named():
    def broken_reward(**kwargs):
        raise KeyError("answer")

    trainer = FakeTrainer(broken_reward)
    with checked_reward_funcs(trainer, 3), pytest.raises(RewardFunctionError) as caught:
        trainer.reward_funcs[0]()
    assert "reward function broken_reward at step 5 raised KeyError: 'answer'" in str(caught.value)


def test_good_reward_outputs_pass():
    assert reward_output_problem([1, 0.5, None, float("nan")], 4) is None
    assert reward_output_problem(torch.tensor([1.0, 2.0]), 2) is None


def inf_reward(completions, **kwargs):
    return [float("inf")] * len(completions)


def test_an_infinite_reward_stops_the_run_with_a_user_error(tiny, tmp_path):
    recipe = tiny_recipe(tmp_path, *tiny, reward_funcs=["format", "test_run_safety:inf_reward"], max_steps=1)
    with pytest.raises(RewardFunctionError, match="reward function inf_reward at step 1 returned inf at position 0"):
        main(["--config", str(recipe)])
    assert (tmp_path / "out").is_dir() and not (tmp_path / "out" / LOCK_NAME).exists()  # removed on failure too


def huge_reward(completions, **kwargs):
    return [1e38] * len(completions)


def test_a_weighted_reward_sum_that_overflows_names_the_weighting(tiny, tmp_path):
    recipe = tiny_recipe(
        tmp_path, *tiny, reward_funcs=["test_run_safety:huge_reward", "format"], reward_weights=[10.0, 1.0], max_steps=1
    )
    with pytest.raises(RewardFunctionError) as caught:
        main(["--config", str(recipe)])
    message = str(caught.value)
    assert "at step 1 the weighted reward sum overflows torch.float32 to inf: huge_reward 1e+38 x weight 10" in message
    assert "scale the reward or its weight down" in message and "infinite score" not in message


# --------------------------------------------------------------------------- the Python API


@pytest.mark.parametrize(
    "model, reward_funcs, fragment",
    [
        (123, [inf_reward], "model must be a path or Hub id"),
        (None, [inf_reward], "model must be a path or Hub id"),
        ("policy", [42], "42 \\(int\\) is not a reward"),
        ("policy", "format", "'format' is the name of a built-in reward"),
    ],
)
def test_python_api_type_errors_say_what_is_expected(model, reward_funcs, fragment):
    from minimind_trl.trainer import MiniMindGRPOTrainer

    with pytest.raises(TypeError, match=fragment):
        MiniMindGRPOTrainer(model=model, reward_funcs=reward_funcs, args=MiniMindGRPOConfig("out", use_cpu=True))


@pytest.mark.parametrize(
    "model, reward_funcs, error, fragment",
    [
        ("./no/such/policy", [inf_reward], "ModelSourceError", "model: ./no/such/policy does not exist"),
        ("policy", ["models/no/such-rm"], "RewardSpecError", "reward model models/no/such-rm does not exist"),
        ("policy", ["models/rm"], "RewardSpecError", "reward model: models/rm is not a local folder \\(nothing at /"),
    ],
)
def test_python_api_names_a_mistyped_local_path_without_a_hub_lookup(model, reward_funcs, error, fragment):
    from minimind_trl import errors
    from minimind_trl.trainer import MiniMindGRPOTrainer

    with pytest.raises(getattr(errors, error), match=fragment):
        MiniMindGRPOTrainer(model=model, reward_funcs=reward_funcs, args=MiniMindGRPOConfig("out", use_cpu=True))


# --------------------------------------------------------------------------- telemetry


def test_a_run_from_local_sources_disables_hub_telemetry(tiny, tmp_path, monkeypatch):
    from huggingface_hub import constants

    from minimind_trl.cli.recipe import parse_args
    from minimind_trl.cli.run_plan import check_run

    monkeypatch.delenv("HF_HUB_DISABLE_TELEMETRY", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_TELEMETRY", False)
    script_args, training_args, model_args, _ = parse_args(["--config", str(tiny_recipe(tmp_path, *tiny))])
    check_run(script_args, training_args, model_args)
    assert constants.HF_HUB_DISABLE_TELEMETRY and os.environ["HF_HUB_DISABLE_TELEMETRY"] == "1"


def test_python_api_refuses_too_few_prompts_for_one_step(tiny, tmp_path):
    from transformers import AutoTokenizer

    from minimind_trl.data import load_rlaif_dataset
    from minimind_trl.errors import MiniMindTRLError
    from minimind_trl.trainer import MiniMindGRPOTrainer

    policy, _ = tiny
    data = load_rlaif_dataset(write_rlaif(tmp_path / "one.jsonl", prompts=["What is two plus three?"]))
    args = MiniMindGRPOConfig(
        str(tmp_path / "out"), use_cpu=True, bf16=False, per_device_train_batch_size=8, num_generations=4,
        max_completion_length=8, max_steps=2, report_to="none",
    )  # fmt: skip
    trainer = MiniMindGRPOTrainer(
        model=str(policy), reward_funcs=[inf_reward], args=args, train_dataset=data,
        processing_class=AutoTokenizer.from_pretrained(policy),
    )  # fmt: skip
    with pytest.raises(MiniMindTRLError, match=r"1 prompt\(s\), but one step needs 2"):
        trainer.train()
    assert not (tmp_path / "out" / "model.safetensors").exists()


def test_python_api_resume_with_other_reward_functions_is_refused(tiny, tmp_path):
    from grpo_fixtures import token_reward
    from transformers import AutoTokenizer

    from minimind_trl.data import load_rlaif_dataset
    from minimind_trl.rewards import format_reward
    from minimind_trl.trainer import MiniMindGRPOTrainer

    policy, data = tiny
    args = MiniMindGRPOConfig(
        str(tmp_path / "out"), use_cpu=True, bf16=False, per_device_train_batch_size=8, num_generations=4,
        max_completion_length=8, max_steps=1, save_strategy="steps", save_steps=1, report_to="none",
    )  # fmt: skip

    def trainer(reward_funcs):
        return MiniMindGRPOTrainer(
            model=str(policy), reward_funcs=reward_funcs, args=args, train_dataset=load_rlaif_dataset(data),
            processing_class=AutoTokenizer.from_pretrained(policy),
        )  # fmt: skip

    trainer([token_reward]).train()
    record = json.loads((tmp_path / "out" / "checkpoint-1" / RUN_INFO_NAME).read_text())["run"]
    assert record["reward_func_names"] == ["token_reward"] and record["model_name_or_path"] == str(policy)
    with pytest.raises(ResumeError, match=r"changed: reward_func_names\."):
        trainer([token_reward, format_reward]).train(resume_from_checkpoint="last")
