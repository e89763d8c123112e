"""Faults and bad input in `minimind-trl export`: a folder without weights, truncated or damaged safetensors, a
config.json that is not JSON, not MiniMind's or disagrees with the weights, a folder without a tokenizer, an
unwritable or full output location. Each is one line naming the file (exit 2), and nothing is written."""

import errno
import json
import shutil

import pytest
from grpo_fixtures import build_tiny_policy

from minimind_trl.cli import main as cli
from minimind_trl.conversion import export as export_module

UNWRITABLE = "/sys/minimind-trl-test-out"  # sysfs: no new files, even for root


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    return build_tiny_policy(tmp_path_factory.mktemp("export-faults") / "policy")


def copy_of(good, tmp_path, name="model"):
    folder = tmp_path / name
    shutil.copytree(good, folder)
    return folder


def edit_config(folder, **changes):
    path = folder / "config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))


def truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def drop_tokenizer(folder):
    for path in folder.iterdir():
        if path.name.startswith(("tokenizer", "special_tokens", "chat_template")):
            path.unlink()


def run_export(capsys, *argv):
    rc = cli(["export", *map(str, argv)])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    return rc, captured.err


FAULTS = {
    "no weights": (lambda f: (f / "model.safetensors").unlink(), "config.json", "no weights (looked for"),
    "truncated": (lambda f: truncate(f / "model.safetensors"), "model.safetensors", "is truncated or damaged"),
    "not safetensors": (
        lambda f: (f / "model.safetensors").write_bytes(b"garbage"), "model.safetensors", "is truncated or damaged"
    ),
    "invalid JSON": (lambda f: (f / "config.json").write_text("{broken"), "config.json", "not valid JSON (line 1"),
    "not an object": (lambda f: (f / "config.json").write_text("[1]"), "config.json", "not a JSON object"),
    "llama model_type": (lambda f: edit_config(f, model_type="llama"), "config.json", "model_type is 'llama'"),
    "unknown model_type": (lambda f: edit_config(f, model_type="nonsense"), "config.json", "model_type is 'nonsense'"),
    "no model_type": (
        lambda f: (f / "config.json").write_text(json.dumps({"hidden_size": 32})), "config.json", "model_type is None"
    ),
    "inconsistent config": (
        lambda f: edit_config(f, hidden_size=64),
        "config.json",
        "invalid MiniMind config (ValueError: MiniMind2 derives",
    ),
    "shapes disagree": (
        lambda f: edit_config(f, intermediate_size=96),
        "model.safetensors",
        "do not fit config.json: mis-shaped keys (6): model.layers.0.mlp.gate_proj.weight [64, 32] (expected [96, 32])",
    ),
    "a layer more": (
        lambda f: edit_config(f, num_hidden_layers=3),
        "model.safetensors",
        "do not fit config.json: missing keys (9): model.layers.2.",
    ),
    "unknown activation": (
        lambda f: edit_config(f, hidden_act="swishy"), "config.json", "hidden_act='swishy': expected one of"
    ),
    "zero rms_norm_eps": (lambda f: edit_config(f, rms_norm_eps=0.0), "config.json", "rms_norm_eps=0.0: expected a"),
    "negative rope_theta": (
        lambda f: edit_config(f, rope_parameters={"rope_type": "default", "rope_theta": -1.0}),
        "config.json",
        "rope_theta=-1.0: expected a positive number",
    ),
    "context of one token": (
        lambda f: edit_config(f, max_position_embeddings=1),
        "config.json",
        "max_position_embeddings=1: expected an integer of at least 2",
    ),
}


@pytest.mark.parametrize("fault", FAULTS)
def test_a_damaged_source_folder_is_one_line_naming_the_file(good, tmp_path, capsys, monkeypatch, fault):
    damage, file, fragment = FAULTS[fault]
    folder = copy_of(good, tmp_path)
    damage(folder)
    monkeypatch.setattr("sys.stdin", None)  # transformers' "run custom code? [y/N]" prompt must not be reached
    rc, err = run_export(capsys, folder, tmp_path / "out", "--format", "llama")
    assert rc == 2
    assert f"{folder / file}" in err and fragment in err, err
    assert not (tmp_path / "out").exists()


def poison(folder):
    """One NaN and one inf in the saved weights, as a diverged or fp16-overflowed run leaves them."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(folder / "model.safetensors")
    tensors["model.layers.0.mlp.up_proj.weight"][0, 0] = float("nan")
    tensors["model.norm.weight"][1] = float("inf")
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})


@pytest.mark.parametrize("fmt, output", [("native", "out.pth"), ("gguf", "out.gguf"), ("llama", "out")])
def test_non_finite_weights_are_refused_with_one_message_for_every_format(good, tmp_path, capsys, fmt, output):
    folder = copy_of(good, tmp_path)
    poison(folder)
    rc, err = run_export(capsys, folder, tmp_path / output, "--format", fmt)
    assert rc == 2, err
    named = "model.layers.0.mlp.up_proj.weight (1 of 2048), model.norm.weight (1 of 32)"
    assert f"{folder}: NaN or infinite values in {named}" in err
    assert "the weights are broken" in err and "router" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


@pytest.mark.parametrize("fmt, output", [("native", "out.pth"), ("gguf", "out.gguf"), ("qwen3", "out")])
def test_truncated_weights_are_named_for_every_format(good, tmp_path, capsys, fmt, output):
    folder = copy_of(good, tmp_path)
    truncate(folder / "model.safetensors")
    rc, err = run_export(capsys, folder, tmp_path / output, "--format", fmt)
    assert rc == 2 and f"{folder / 'model.safetensors'} is truncated or damaged" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_without_a_tokenizer_gguf_refuses_and_folders_warn(good, tmp_path, capsys):
    pytest.importorskip("gguf")
    folder = copy_of(good, tmp_path)
    drop_tokenizer(folder)
    rc, err = run_export(capsys, folder, tmp_path / "m.gguf", "--format", "gguf")
    assert rc == 2 and f"{folder} has no tokenizer" in err and "--tokenizer" in err
    assert not (tmp_path / "m.gguf").exists()

    rc, err = run_export(capsys, folder, tmp_path / "llama", "--format", "llama")
    assert rc == 0 and f"warning: {folder} has no tokenizer" in err and "--tokenizer" in err
    assert not (tmp_path / "llama" / "tokenizer.json").exists()

    # --tokenizer supplies one: both formats then carry it
    assert run_export(capsys, folder, tmp_path / "m.gguf", "--format", "gguf", "--tokenizer", good)[0] == 0
    rc, err = run_export(capsys, folder, tmp_path / "tok", "--format", "llama", "--tokenizer", good)
    assert rc == 0 and "no tokenizer" not in err and (tmp_path / "tok" / "tokenizer.json").is_file()

    # the native .pth needs none (upstream reads its tokenizer from its own model/ folder)
    rc, err = run_export(capsys, folder, tmp_path / "n.pth", "--format", "native")
    assert rc == 0 and "no tokenizer" not in err


def test_a_tokenizer_folder_that_is_not_one_is_named(good, tmp_path, capsys):
    rc, err = run_export(capsys, good, tmp_path / "out", "--format", "llama", "--tokenizer", tmp_path / "nothing")
    assert rc == 2 and f"--tokenizer {tmp_path / 'nothing'}: cannot load a tokenizer" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("fmt", ["llama", "native", "gguf"])
def test_an_unwritable_output_fails_before_loading(good, tmp_path, capsys, monkeypatch, fmt):
    monkeypatch.setattr(export_module, "load_minimind_folder", lambda *a, **k: pytest.fail("loaded before the check"))
    rc, err = run_export(capsys, good, f"{UNWRITABLE}/out", "--format", fmt)
    assert rc == 2 and f"output {UNWRITABLE}/out: cannot write there" in err


def test_a_full_disk_is_one_line_and_leaves_nothing(good, tmp_path, capsys, monkeypatch):
    import safetensors.torch
    import torch

    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", "model.safetensors")

    monkeypatch.setattr(safetensors.torch, "save_file", disk_full)
    rc, err = run_export(capsys, good, tmp_path / "out", "--format", "llama")
    assert rc == 2 and f"{tmp_path / 'out'}: cannot write the export (No space left on device: model" in err
    monkeypatch.setattr(torch, "save", disk_full)
    rc, err = run_export(capsys, good, tmp_path / "out.pth", "--format", "native")
    assert rc == 2 and f"{tmp_path / 'out.pth'}: cannot write the export (No space left on device: model" in err
    assert list(tmp_path.iterdir()) == []
