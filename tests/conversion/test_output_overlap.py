"""`--force` replaces what the command writes and nothing else: `export`, `convert` and `merge-lora` refuse an output
that is, holds or lies inside their input (symlinks and relative paths resolved), and never delete files they did
not write. Each refusal is one line (exit 2) and leaves every file where it was."""

import json
import os

import pytest
import torch
from grpo_fixtures import build_tiny_policy

from minimind_trl.cli import main as cli
from minimind_trl.formats.export_native import to_native_state_dict


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    return build_tiny_policy(tmp_path_factory.mktemp("overlap") / "policy")


def snapshot(folder):
    """Every file under `folder` with its bytes: what must survive a refused command."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def copy_policy(policy, folder):
    folder.mkdir(parents=True)
    for path in policy.iterdir():
        (folder / path.name).write_bytes(path.read_bytes())
    return folder


def refused(capsys, argv, fragment):
    capsys.readouterr()
    rc = cli(argv)
    err = capsys.readouterr().err
    assert rc == 2, err
    assert fragment in err and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1, err
    return err


def test_export_into_the_current_folder_holding_the_model_is_refused(policy, tmp_path, monkeypatch, capsys):
    work = tmp_path / "D"
    copy_policy(policy, work / "model")
    (work / "notes.txt").write_text("mine")
    before = snapshot(work)
    monkeypatch.chdir(work)
    refused(capsys, ["export", "model", ".", "--format", "llama", "--force"], "contains the input model")
    assert snapshot(work) == before


def test_export_into_the_run_folder_holding_the_model_is_refused(policy, tmp_path, capsys):
    run = tmp_path / "run"
    copy_policy(policy, run / "final")
    (run / "checkpoint-4").mkdir()
    (run / "checkpoint-4" / "optimizer.pt").write_bytes(b"state")
    before = snapshot(run)
    refused(capsys, ["export", str(run / "final"), str(run), "--format", "llama", "--force"], "contains the input")
    refused(capsys, ["export", str(run / "final"), str(run / "final"), "--format", "llama", "--force"], " is the input")
    assert snapshot(run) == before


def test_an_export_over_a_file_of_the_model_folder_is_refused(policy, tmp_path, capsys):
    model = copy_policy(policy, tmp_path / "X")
    before = snapshot(model)
    argv = ["export", str(model), str(model / "model.safetensors"), "--format", "native", "--force"]
    refused(capsys, argv, "is a file of the input")
    argv = ["export", str(model), str(model / "config.json"), "--format", "gguf", "--force"]
    refused(capsys, argv, "is a file of the input")
    assert snapshot(model) == before


@pytest.mark.parametrize("fmt, name", [("llama", "llama"), ("gguf", "model.gguf"), ("native", "m.pth")])
def test_a_new_output_inside_the_model_folder_is_allowed(policy, tmp_path, fmt, name):
    """Refuse only what would overwrite or delete: a new entry beside the model's files replaces none of them."""
    pytest.importorskip("gguf") if fmt == "gguf" else None
    model = copy_policy(policy, tmp_path / "X")
    before = snapshot(model)
    assert cli(["export", str(model), str(model / name), "--format", fmt]) == 0
    assert (model / name).exists()
    assert {key: value for key, value in snapshot(model).items() if key in before} == before


def test_an_output_reached_through_a_symlink_is_refused(policy, tmp_path, capsys):
    model = copy_policy(policy, tmp_path / "X")
    os.symlink(model, tmp_path / "link")
    before = snapshot(model)
    refused(capsys, ["export", str(model), str(tmp_path / "link"), "--format", "llama", "--force"], "is the input")
    assert snapshot(model) == before


def test_convert_into_the_folder_holding_the_checkpoint_is_refused(policy, tmp_path, capsys):
    from minimind_trl import MiniMindForCausalLM

    work = tmp_path / "D"
    work.mkdir()
    torch.save(to_native_state_dict(MiniMindForCausalLM.from_pretrained(policy)), work / "m.pth")
    (work / "notes.txt").write_text("mine")
    before = snapshot(work)
    refused(capsys, ["convert", str(work / "m.pth"), str(work), "--force"], "contains the input")
    assert snapshot(work) == before


def test_merge_lora_into_the_adapter_folder_is_refused(policy, tmp_path, capsys):
    adapter = tmp_path / "A"
    adapter.mkdir()
    config = {"peft_type": "LORA", "base_model_name_or_path": str(policy), "r": 4, "target_modules": ["q_proj"]}
    (adapter / "adapter_config.json").write_text(json.dumps(config))
    (adapter / "adapter_model.safetensors").write_bytes(b"weights")
    (adapter / "checkpoint-2").mkdir()
    (adapter / "checkpoint-2" / "optimizer.pt").write_bytes(b"state")
    before = snapshot(adapter)
    refused(capsys, ["merge-lora", str(adapter), str(adapter), "--force"], "is the input")
    refused(capsys, ["merge-lora", str(adapter), str(tmp_path), "--force"], "contains the input")
    assert snapshot(adapter) == before


def test_force_replaces_an_earlier_export_but_never_the_users_files(policy, tmp_path, capsys):
    out = tmp_path / "llama"
    assert cli(["export", str(policy), str(out), "--format", "llama"]) == 0
    assert cli(["export", str(policy), str(out), "--format", "llama", "--force"]) == 0  # an earlier export: replaced
    (out / "notes.txt").write_text("mine")
    before = snapshot(out)
    refused(capsys, ["export", str(policy), str(out), "--format", "llama", "--force"], "did not write (notes.txt)")
    assert snapshot(out) == before


@pytest.mark.parametrize("fmt, name", [("native", "m.pth"), ("gguf", "m.gguf")])
def test_force_replaces_only_a_file_of_the_kind_the_export_writes(policy, tmp_path, capsys, fmt, name):
    (tmp_path / name).write_text("not a model")
    refused(capsys, ["export", str(policy), str(tmp_path / name), "--format", fmt, "--force"], "exists and is not a")
    assert (tmp_path / name).read_text() == "not a model"
