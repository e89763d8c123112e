"""Checkpoints and resume: a run killed hard resumes to the weights of an uninterrupted run, checkpoints are
never half-written, and resumes that cannot continue exactly are refused or explained."""

import json
import logging
import os
import shutil
import subprocess
import sys
from types import SimpleNamespace

import pytest
import yaml
from grpo_fixtures import PROBE_DIR_ENV, build_tiny_policy, subprocess_env, tiny_recipe, write_rlaif
from safetensors.torch import load_file

from minimind_trl.trainer.outputs.checkpointing import (
    RUN_INFO_NAME,
    STAGING_DIR,
    BatchGeometry,
    ResumeError,
    check_generation_alignment,
    check_resume_geometry,
    publish_folder,
    resolve_resume_checkpoint,
)
from minimind_trl.grpo import main

# Kills the process (SIGKILL, no cleanup) inside the save of checkpoint-4: after the model weights were written,
# before the RNG states, optimizer state and trainer state.
KILL_DURING_SAVE = """
import os, signal, sys
from transformers import Trainer
save_rng_state = Trainer._save_rng_state
def kill_during_save(self, output_dir):
    if self.state.global_step == 4:
        os.kill(os.getpid(), signal.SIGKILL)
    return save_rng_state(self, output_dir)
Trainer._save_rng_state = kill_during_save
from minimind_trl.grpo import main
sys.exit(main(sys.argv[1:]))
"""


def max_abs_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[key] - b[key]).abs().max().item() for key in a)


def sampled(probe_dir) -> list[dict]:
    path = os.path.join(probe_dir, "rewards-rank0.jsonl")
    return [json.loads(line) for line in open(path)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """An uninterrupted 4-step run (in-process) and the same run killed while saving checkpoint-4 (subprocess)."""
    root = tmp_path_factory.mktemp("resume")
    policy = build_tiny_policy(root / "policy")
    data = write_rlaif(root / "rlaif.jsonl")
    settings = dict(max_steps=4, save_strategy="steps", save_steps=2, learning_rate=0.02)

    straight = root / "straight"
    straight.mkdir()
    os.environ[PROBE_DIR_ENV] = str(straight)
    try:
        assert main(["--config", str(tiny_recipe(straight, policy, data, **settings))]) == 0
    finally:
        del os.environ[PROBE_DIR_ENV]

    killed = root / "killed"
    killed.mkdir()
    recipe = tiny_recipe(killed, policy, data, **settings)
    result = subprocess.run(
        [sys.executable, "-c", KILL_DURING_SAVE, "--config", str(recipe)],
        env=subprocess_env(**{PROBE_DIR_ENV: killed}),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == -9, result.stderr[-3000:]  # SIGKILL
    return SimpleNamespace(policy=policy, straight=straight, killed=killed, recipe=recipe)


def test_a_killed_save_leaves_no_half_written_checkpoint(runs):
    out = runs.killed / "out"
    assert sorted(p.name for p in out.iterdir() if p.name.startswith("checkpoint-")) == ["checkpoint-2"]
    staged = out / STAGING_DIR / "checkpoint-4"
    assert (staged / "model.safetensors").is_file()  # the kill really happened mid-save ...
    assert not (staged / "trainer_state.json").exists()  # ... before the checkpoint was complete
    complete = out / "checkpoint-2"
    for name in (
        "model.safetensors",
        "optimizer.pt",
        "scheduler.pt",
        "rng_state.pth",
        "trainer_state.json",
        RUN_INFO_NAME,
    ):
        assert (complete / name).is_file(), name
    assert resolve_resume_checkpoint("last", str(out)) == str(complete)


def test_the_killed_run_matched_the_straight_run_until_the_kill(runs):
    before_kill = load_file(runs.killed / "out" / "checkpoint-2" / "model.safetensors")
    straight = load_file(runs.straight / "out" / "checkpoint-2" / "model.safetensors")
    assert max_abs_diff(before_kill, straight) <= 1e-6


def test_resume_after_sigkill_equals_the_uninterrupted_run(runs, monkeypatch, caplog):
    monkeypatch.setenv(PROBE_DIR_ENV, str(runs.killed))
    with caplog.at_level(logging.WARNING, logger="minimind_trl.trainer.outputs.run_safety"):
        assert main(["--config", str(runs.recipe), "--resume_from_checkpoint", "last"]) == 0
    # a resume says which checkpoint it continues from
    assert f"resuming from {runs.killed / 'out' / 'checkpoint-2'} (optimizer step 2)" in caplog.text

    out = runs.killed / "out"
    resumed = load_file(out / "model.safetensors")
    straight = load_file(runs.straight / "out" / "model.safetensors")
    at_checkpoint = load_file(out / "checkpoint-2" / "model.safetensors")
    assert max_abs_diff(resumed, straight) <= 1e-6
    assert max_abs_diff(resumed, at_checkpoint) > 1e-3  # steps 3-4 really trained after the resume

    # Sampling is reproducible across the resume: steps 3 and 4 drew the same prompts and completions.
    straight_steps = {row["step"]: row for row in sampled(runs.straight)}
    resumed_steps = [row for row in sampled(runs.killed) if row["step"] >= 2][-2:]  # rows of the resumed run
    assert [row["step"] for row in resumed_steps] == [2, 3]
    for row in resumed_steps:
        assert row == straight_steps[row["step"]]

    # The resumed run re-saved checkpoint-4 and cleaned the staging area the kill left behind.
    assert sorted(p.name for p in out.iterdir() if p.name.startswith("checkpoint-")) == [
        "checkpoint-2",
        "checkpoint-4",
    ]
    assert not (out / STAGING_DIR).exists()
    state = json.loads((out / "checkpoint-4" / "trainer_state.json").read_text())
    assert state["global_step"] == 4 and [entry["step"] for entry in state["log_history"][:4]] == [1, 2, 3, 4]


@pytest.fixture(scope="module")
def unshared_straight(runs, tmp_path_factory):
    """The uninterrupted 4-step run again with `share_prompts: false`: how far the summation order alone moves it."""
    root = tmp_path_factory.mktemp("unshared")
    recipe = yaml.safe_load(runs.recipe.read_text())
    recipe.update(output_dir=str(root / "out"), share_prompts=False)
    (root / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    os.environ[PROBE_DIR_ENV] = str(root)
    try:
        assert main(["--config", str(root / "recipe.yaml")]) == 0
    finally:
        del os.environ[PROBE_DIR_ENV]
    return load_file(root / "out" / "model.safetensors")


@pytest.mark.cpu_kind
def test_resume_across_the_prompt_sharing_switch_stays_exact(runs, unshared_straight, tmp_path, monkeypatch):
    """Checkpoint-2 of a run whose log-prob passes computed each prompt once per group (`share_prompts`, the default),
    resumed with `share_prompts: false`: the uninterrupted run's weights up to the summation order, which is all
    that sharing changes (and a resume may switch it).

    Not bit-exact on every CPU: which order a CPU's GEMMs sum in depends on the row count and on the kernel (AVX2,
    AVX-512 and AMX block differently), and Adam divides each gradient by its own running scale, so a gradient that
    is a cancelling sum carries its reordering into the weights at up to the learning rate's scale (no bound from
    the sum's length holds). The bound is therefore measured by the same computation in the same test: the
    uninterrupted run with sharing off throughout (4 steps in the other order) differs from the shared one by D;
    the resume runs only its last 2 steps in the other order and must stay within 8 D (measured: 0.02 D on an AMX
    Xeon, 0.9 D with its kernels capped at AVX2; D = 0 where the kernels sum alike: then the resume is bit-exact).
    A resume that lost or misplaced any state moves the weights by about the learning rate (2e-2), as the
    steps-trained check below shows."""
    from minimind_trl.models.minimind.modeling_minimind import MiniMindModel

    out = tmp_path / "out"
    shutil.copytree(runs.killed / "out" / "checkpoint-2", out / "checkpoint-2")
    recipe = yaml.safe_load(runs.recipe.read_text())
    recipe.update(output_dir=str(out), share_prompts=False)
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    shared_passes = []
    forward_shared_prefix = MiniMindModel._forward_shared_prefix
    monkeypatch.setattr(
        MiniMindModel,
        "_forward_shared_prefix",
        lambda *args, **kwargs: shared_passes.append(1) or forward_shared_prefix(*args, **kwargs),
    )
    monkeypatch.setenv(PROBE_DIR_ENV, str(tmp_path))
    assert main(["--config", str(tmp_path / "recipe.yaml"), "--resume_from_checkpoint", "last"]) == 0
    assert shared_passes == []
    straight = load_file(runs.straight / "out" / "model.safetensors")
    resumed = load_file(out / "model.safetensors")
    reordering = max_abs_diff(unshared_straight, straight)
    assert max_abs_diff(resumed, straight) <= 8 * reordering, reordering
    assert max_abs_diff(resumed, load_file(out / "checkpoint-2" / "model.safetensors")) > 1e-3  # steps 3-4 trained


def test_resume_in_a_later_epoch_replays_that_epochs_prompt_order(tmp_path, monkeypatch):
    """8 prompts, 2 per step: 4 steps per epoch. Resuming at step 5 (second epoch) must draw the second
    epoch's order, not the first one again (TRL's sampler generator is not checkpointed)."""
    policy = build_tiny_policy(tmp_path / "policy")
    data = write_rlaif(tmp_path / "rlaif.jsonl")
    settings = dict(max_steps=6, save_strategy="steps", save_steps=5, num_train_epochs=2)
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    straight.mkdir()
    resumed.mkdir()
    monkeypatch.setenv(PROBE_DIR_ENV, str(straight))
    assert main(["--config", str(tiny_recipe(straight, policy, data, **settings))]) == 0
    monkeypatch.setenv(PROBE_DIR_ENV, str(resumed))
    checkpoint = str(straight / "out" / "checkpoint-5")
    assert (
        main(["--config", str(tiny_recipe(resumed, policy, data, **settings)), "--resume_from_checkpoint", checkpoint])
        == 0
    )

    straight_rows = sampled(straight)
    first_epoch = {prompt for row in straight_rows[:4] for prompt in row["prompts"]}
    second_epoch = [row["prompts"] for row in straight_rows[4:]]
    assert len(first_epoch) == 8  # every prompt once per epoch
    (last,) = sampled(resumed)
    assert last == straight_rows[5]
    assert [row["prompts"] for row in straight_rows[4:6]] != [row["prompts"] for row in straight_rows[:2]]
    assert second_epoch[1] == last["prompts"]
    diff = max_abs_diff(
        load_file(resumed / "out" / "model.safetensors"), load_file(straight / "out" / "model.safetensors")
    )
    assert diff <= 1e-6


# --------------------------------------------------------------------------- units


def geometry(**changes):
    values = dict(
        world_size=2,
        per_device_train_batch_size=8,
        gradient_accumulation_steps=1,
        steps_per_generation=1,
        generation_batch_size=16,
        num_generations=4,
        num_iterations=1,
        distributed_type="DistributedType.MULTI_CPU",
    )
    values.update(changes)
    return BatchGeometry(**values)


def write_geometry(folder, geometry_):
    import dataclasses

    folder.mkdir(parents=True, exist_ok=True)
    (folder / RUN_INFO_NAME).write_text(json.dumps(dataclasses.asdict(geometry_)))
    return folder


def test_resume_geometry_keeps_the_global_batch(tmp_path, monkeypatch, caplog):
    checkpoint = write_geometry(tmp_path / "checkpoint-1", geometry())
    now = geometry(world_size=1, per_device_train_batch_size=16, distributed_type="DistributedType.NO")
    monkeypatch.setattr(BatchGeometry, "from_args", classmethod(lambda cls, args: now))
    with caplog.at_level(logging.WARNING, logger="minimind_trl.trainer.outputs.checkpointing"):
        assert check_resume_geometry(str(checkpoint), None) == geometry()
    assert "Resuming a 2-process checkpoint on 1 process(es)" in caplog.text

    changed = geometry(world_size=1, per_device_train_batch_size=8, generation_batch_size=8)
    monkeypatch.setattr(BatchGeometry, "from_args", classmethod(lambda cls, args: changed))
    with pytest.raises(ResumeError, match="set per_device_train_batch_size=16"):
        check_resume_geometry(str(checkpoint), None)


def test_deepspeed_checkpoints_need_the_same_process_count(tmp_path, monkeypatch):
    checkpoint = write_geometry(tmp_path / "checkpoint-1", geometry(distributed_type="DistributedType.DEEPSPEED"))
    now = geometry(world_size=1, per_device_train_batch_size=16, distributed_type="DistributedType.DEEPSPEED")
    monkeypatch.setattr(BatchGeometry, "from_args", classmethod(lambda cls, args: now))
    with pytest.raises(ResumeError, match="DeepSpeed checkpoints are partitioned per process"):
        check_resume_geometry(str(checkpoint), None)


def test_resolve_resume_checkpoint(tmp_path):
    assert resolve_resume_checkpoint(None, str(tmp_path)) is None
    with pytest.raises(ResumeError, match="no checkpoint-N folder"):
        resolve_resume_checkpoint("latest", str(tmp_path))
    (tmp_path / "checkpoint-3").mkdir()
    with pytest.raises(ResumeError, match="has no trainer_state.json"):
        resolve_resume_checkpoint(str(tmp_path / "checkpoint-3"), str(tmp_path))
    (tmp_path / "checkpoint-10").mkdir()
    assert resolve_resume_checkpoint("true", str(tmp_path)) == str(tmp_path / "checkpoint-10")


def test_publish_folder_replaces_only_once_the_new_folder_is_complete(tmp_path):
    final, staged = tmp_path / "checkpoint-2", tmp_path / STAGING_DIR / "checkpoint-2"
    final.mkdir()
    (final / "old").write_text("old")
    staged.mkdir(parents=True)
    (staged / "new").write_text("new")
    publish_folder(str(staged), str(final))
    assert [p.name for p in final.iterdir()] == ["new"] and not staged.exists()
    assert not (tmp_path / "checkpoint-2.replaced").exists()


def test_checkpoints_inside_a_reused_generation_batch_are_flagged(caplog):
    args = SimpleNamespace(
        save_strategy="steps", save_steps=3, gradient_accumulation_steps=1, steps_per_generation=2, num_iterations=1
    )
    with caplog.at_level(logging.WARNING, logger="minimind_trl.trainer.outputs.checkpointing"):
        check_generation_alignment(args)
    assert "not an exact continuation" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="minimind_trl.trainer.outputs.checkpointing"):
        check_generation_alignment(SimpleNamespace(**{**vars(args), "save_steps": 4}))
    assert caplog.text == ""
