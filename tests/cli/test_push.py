"""`minimind-trl push OUTPUT_DIR --hub_model_id ...`: a run's output folder pushed later sends what the run's own final
push sends (no checkpoints, no `_`-prefixed entries: the lock, `_staging`, `_base_model`); a folder a run is writing,
or one people could not load, is refused; a Hub that fails is one line, and the folder is left as it was."""

import os
from pathlib import Path

import pytest
from grpo_fixtures import build_tiny_policy, hold_lock
from huggingface_hub import HfApi
from hub_stand_in import HubStandIn, in_process_hub
from test_hub import FakeHub

from minimind_trl.cli import main

HUB_ID = "someone/pushed-later"


@pytest.fixture
def run_folder(tmp_path) -> Path:
    """What a finished run leaves: the model at the top, checkpoints, a native policy's conversion, an interrupted
    save's staging, a crashed run's lock file (the lock itself went with its process)."""
    out = build_tiny_policy(tmp_path / "out")
    for name, text in [("README.md", "card"), ("grpo_32.pth", "pth"), ("grpo_32.config.json", "{}"),
                       ("training_args.bin", "args"), ("checkpoint-2/model.safetensors", "w"),
                       ("_base_model/config.json", "{}"), ("_staging/final/model.safetensors", "w"),
                       ("_minimind_run.lock", '{"pid": 1}')]:  # fmt: skip
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text(text)
    return out


def snapshot(folder: Path) -> dict:
    """The folder's files and their modification times, less the crashed run's lock file (taken over and removed by
    the check that no live run holds the folder, as the next run would)."""
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in folder.rglob("*")
            if p.is_file() and p.name != "_minimind_run.lock"}  # fmt: skip


def test_push_sends_the_top_of_the_folder_without_checkpoints_or_underscored_entries(run_folder, tmp_path, monkeypatch,
                                                                                   capsys):  # fmt: skip
    hub = FakeHub(tmp_path / "fake-hub")
    monkeypatch.setattr(HfApi, "create_repo", lambda api, repo_id, **kw: hub.create_repo(api, repo_id, **kw))
    monkeypatch.setattr(HfApi, "upload_folder", lambda api, **kw: hub.upload_folder(api, **kw))
    assert main(["push", str(run_folder), "--hub_model_id", HUB_ID]) == 0
    (upload,) = hub.uploads
    assert upload.repo_id == HUB_ID and upload.path_in_repo == ""
    top_files = {p.name for p in run_folder.iterdir() if p.is_file() and not p.name.startswith("_")}
    assert set(upload.files) == top_files and "grpo_32.pth" in top_files and "model.safetensors" in top_files
    assert f"pushed {run_folder} to" in capsys.readouterr().out


def test_push_refuses_a_folder_a_run_is_writing(run_folder, capsys):
    holder = hold_lock(run_folder)
    try:
        assert holder.stdout.readline().strip() == "locked"
        assert main(["push", str(run_folder), "--hub_model_id", HUB_ID]) == 2
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    assert f"output_dir {run_folder} is in use by the run of pid {holder.pid}" in capsys.readouterr().err


@pytest.mark.parametrize("broken, message", [
    ("config.json", "has no config.json"),
    ("tokenizer.json", "lacks ['tokenizer.json']; refusing to push an incomplete model"),
])  # fmt: skip
def test_push_refuses_a_folder_people_could_not_load(run_folder, broken, message, capsys):
    os.remove(run_folder / broken)
    assert main(["push", str(run_folder), "--hub_model_id", HUB_ID]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("failure", ["offline", "uploads refused"])
def test_a_failing_hub_is_one_line_and_leaves_the_folder_as_it_was(failure, run_folder, monkeypatch, capsys):
    before = snapshot(run_folder)
    with HubStandIn(status=403) as hub:
        in_process_hub(monkeypatch, hub.endpoint, offline=failure == "offline")
        assert main(["push", str(run_folder), "--hub_model_id", HUB_ID]) == 2
    err = capsys.readouterr().err
    (line,) = err.strip().splitlines()
    if failure == "offline":
        assert line == (f"minimind-trl push: error: push: the Hugging Face Hub ({hub.endpoint}) could not create or find "
                        f"the repository {HUB_ID}: offline mode is on (HF_HUB_OFFLINE=1). Unset HF_HUB_OFFLINE to reach "
                        "it, then run this command again")  # fmt: skip
    else:
        assert line == (f"minimind-trl push: error: the push of {run_folder} to {HUB_ID} on the Hugging Face Hub "
                        f"({hub.endpoint}) failed: HTTP 403: stand-in Hub: uploads are refused. Log in with a token "
                        f"that may write there (`hf auth login`, or HF_TOKEN), then run this command again "
                        f"({run_folder} is unchanged)")  # fmt: skip
        assert hub.uploads()
    assert snapshot(run_folder) == before


def test_a_bad_repository_id_is_named(run_folder, capsys):
    assert main(["push", str(run_folder), "--hub_model_id", "someone/two/slashes"]) == 2
    assert "error: --hub_model_id 'someone/two/slashes' is not a Hub repository id" in capsys.readouterr().err
