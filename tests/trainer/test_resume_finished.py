"""A resume of a run that had already finished trains nothing and rewrites nothing, whichever way the run ended
(max_steps inside an epoch or at its end, whole or fractional num_train_epochs, gradient accumulation, a LoRA
adapter) and however the checkpoint is named (`last`, its path); a run killed while handing off gets only the final
outputs it lacks; a resume that raises max_steps still trains on."""

import logging
import os
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
from grpo_fixtures import PROMPTS, build_tiny_policy, tiny_recipe, write_rlaif

from minimind_trl.grpo import main

# 4 prompts, 2 per optimizer step: 2 steps an epoch. Each ending: the recipe's settings and the step it ends at.
ENDINGS = {
    "max_steps inside an epoch": (dict(max_steps=3), 3),
    "max_steps at an epoch's end": (dict(max_steps=2), 2),
    "num_train_epochs": (dict(max_steps=-1, num_train_epochs=1), 2),
    "fractional num_train_epochs": (dict(max_steps=-1, num_train_epochs=1.5), 3),
    "gradient accumulation": (dict(max_steps=3, per_device_train_batch_size=4, gradient_accumulation_steps=2), 3),
    "LoRA adapter": (dict(max_steps=3, use_peft=True, lora_r=4, lora_alpha=8), 3),  # its .pth: the merged model
}
FINISHED = "the run had already finished, nothing was trained"


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("finished-inputs")
    return build_tiny_policy(root / "policy"), write_rlaif(root / "rlaif.jsonl", PROMPTS[:4])


def finished_run(inputs, root: Path, settings: dict) -> SimpleNamespace:
    policy, data = inputs
    settings = dict(save_strategy="steps", save_steps=1, save_native_pth=True) | settings
    recipe = tiny_recipe(root, policy, data, **settings)
    assert main(["--config", str(recipe)]) == 0
    return SimpleNamespace(recipe=recipe, out=root / "out")


def snapshot(folder: Path) -> dict:
    """Every file under `folder` with its size and modification time (a rewrite with equal bytes changes the time)."""
    return {str(path.relative_to(folder)): (path.stat().st_size, path.stat().st_mtime_ns)
            for path in sorted(folder.rglob("*")) if path.is_file()}  # fmt: skip


def checkpoints(out: Path) -> list[str]:
    return sorted((p.name for p in out.iterdir() if p.name.startswith("checkpoint-")), key=lambda n: int(n[11:]))


@pytest.fixture(scope="module", params=list(ENDINGS), ids=list(ENDINGS))
def ended(request, inputs, tmp_path_factory):
    settings, last_step = ENDINGS[request.param]
    run = finished_run(inputs, tmp_path_factory.mktemp("finished"), settings)
    assert checkpoints(run.out)[-1] == f"checkpoint-{last_step}"
    return SimpleNamespace(**vars(run), last_step=last_step)


@pytest.mark.parametrize("resume", ["last", "path"])
def test_resuming_a_finished_run_trains_and_writes_nothing(ended, resume, caplog):
    checkpoint = ended.out / f"checkpoint-{ended.last_step}"
    before = snapshot(ended.out)
    with caplog.at_level(logging.WARNING, logger="minimind_trl"):
        code = main(["--config", str(ended.recipe), "--resume_from_checkpoint", "last" if resume == "last" else
                     str(checkpoint)])  # fmt: skip
    assert code == 0
    assert snapshot(ended.out) == before  # no checkpoint past the end, no final file rewritten
    assert f"{checkpoint} is at optimizer step {ended.last_step} and this run ends at step {ended.last_step}" in caplog.text
    assert FINISHED in caplog.text
    assert f"{ended.out} holds the finished run's outputs, left as they are" in caplog.text


@pytest.fixture(scope="module")
def mid_epoch(inputs, tmp_path_factory):
    """The first ending, finished once; each test below works on its own copy."""
    return finished_run(inputs, tmp_path_factory.mktemp("mid-epoch"), ENDINGS["max_steps inside an epoch"][0])


def copy_of(run, tmp_path) -> SimpleNamespace:
    shutil.copytree(run.out, tmp_path / "out")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(run.recipe.read_text().replace(str(run.out), str(tmp_path / "out")))
    return SimpleNamespace(recipe=recipe, out=tmp_path / "out")


def test_a_run_killed_while_handing_off_gets_only_what_it_lacks(mid_epoch, tmp_path, caplog):
    run = copy_of(mid_epoch, tmp_path)
    card = (run.out / "README.md").read_text()
    native = (run.out / "grpo_32.pth").read_bytes()
    for name in ("README.md", "grpo_32.pth", "grpo_32.config.json"):  # killed before the card and native weights
        os.remove(run.out / name)
    before = snapshot(run.out)
    with caplog.at_level(logging.WARNING, logger="minimind_trl"):
        assert main(["--config", str(run.recipe), "--resume_from_checkpoint", "last"]) == 0
    after = snapshot(run.out)
    assert {name: after[name] for name in before} == before  # the model and checkpoints untouched
    assert set(after) - set(before) == {"README.md", "grpo_32.pth", "grpo_32.config.json"}
    assert (run.out / "grpo_32.pth").read_bytes() == native  # the finished weights, from the last checkpoint
    last_step = [line for line in card.splitlines() if line.startswith(("| step |", "| reward |", "| rewards/"))]
    rewritten = (run.out / "README.md").read_text()
    assert len(last_step) == 6 and all(row in rewritten for row in last_step)  # the run's last step's metrics
    assert "train_runtime" not in rewritten  # not the summary of the call that trained nothing (0 s, loss 0)
    assert f"{run.out} lacks the finished run's model card and native .pth: written from" in caplog.text


def test_a_resume_that_raises_max_steps_trains_on(mid_epoch, tmp_path):
    run = copy_of(mid_epoch, tmp_path)
    weights = (run.out / "model.safetensors").read_bytes()
    assert main(["--config", str(run.recipe), "--resume_from_checkpoint", "last", "--max_steps", "4"]) == 0
    assert checkpoints(run.out)[-1] == "checkpoint-4"
    assert (run.out / "model.safetensors").read_bytes() != weights


@pytest.mark.parametrize("marker", ["config.json", "adapter_config.json"])
def test_last_in_a_finished_folder_without_checkpoints_says_there_is_nothing_to_resume(tmp_path, marker):
    from minimind_trl.errors import ResumeError
    from minimind_trl.trainer.outputs.checkpointing import resolve_resume_checkpoint

    (tmp_path / marker).write_text("{}")  # a run with save_strategy: no leaves its final model and no checkpoint
    with pytest.raises(ResumeError, match="it holds a finished model: that run ended without checkpoints, there is"):
        resolve_resume_checkpoint("last", str(tmp_path))
