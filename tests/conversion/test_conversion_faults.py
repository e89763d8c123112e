"""Faults and bad input in convert and merge-lora: broken weights, unwritable or full output locations, adapters
that are not what they claim. Each is one line naming the tensor, file or path (exit 2), and nothing half-written
is left behind."""

import errno
import json
import shutil
from types import SimpleNamespace

import pytest
import torch
import upstream_reference as ref
from grpo_fixtures import build_tiny_policy, tiny_recipe, write_rlaif

from minimind_trl.cli import run_command
from minimind_trl.grpo import main as grpo_main

UNWRITABLE = "/sys/minimind-trl-test-out"  # sysfs: no new files, even for root


def native_checkpoint(path, **changes):
    state_dict = ref.random_state_dict(
        ref.resolve_config("minimind2", hidden_size=64, num_hidden_layers=2, num_attention_heads=4, vocab_size=300), 0
    )
    state_dict.update(changes)
    torch.save(state_dict, path)
    return state_dict


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_convert_refuses_non_finite_weights_naming_the_tensor(tmp_path, capsys, bad):
    state_dict = native_checkpoint(tmp_path / "ok.pth")
    weight = state_dict["model.layers.1.mlp.up_proj.weight"].clone()
    weight[0, :3] = bad
    native_checkpoint(tmp_path / "broken.pth", **{"model.layers.1.mlp.up_proj.weight": weight})
    assert run_command("convert", [str(tmp_path / "broken.pth"), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "NaN or infinite values in model.layers.1.mlp.up_proj.weight (3 of" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_convert_to_an_unwritable_location_fails_before_loading(tmp_path, capsys, monkeypatch):
    native_checkpoint(tmp_path / "ok.pth")
    from minimind_trl.conversion import convert

    monkeypatch.setattr(convert, "load_native_checkpoint", lambda *a, **k: pytest.fail("loaded before the check"))
    assert run_command("convert", [str(tmp_path / "ok.pth"), UNWRITABLE]) == 2
    assert f"output_dir {UNWRITABLE}: cannot write there" in capsys.readouterr().err
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    assert run_command("convert", [str(tmp_path / "ok.pth"), str(blocker / "out")]) == 2
    assert f"({blocker} is a file, not a folder)" in capsys.readouterr().err


def test_a_full_disk_during_convert_is_one_line_and_leaves_nothing(tmp_path, capsys, monkeypatch):
    native_checkpoint(tmp_path / "ok.pth")
    from minimind_trl import MiniMindForCausalLM

    def disk_full(self, folder, *args, **kwargs):
        (folder / "config.json").write_text("{}")
        raise OSError(errno.ENOSPC, "No space left on device", str(folder / "model.safetensors"))

    monkeypatch.setattr(MiniMindForCausalLM, "save_pretrained", disk_full)
    assert run_command("convert", [str(tmp_path / "ok.pth"), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'out'}: cannot write the converted model (No space left on device: " in err
    assert "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ok.pth"]  # no config.json without weights


def test_grpo_to_an_unwritable_output_dir_fails_before_models_load(tmp_path, capsys):
    policy = build_tiny_policy(tmp_path / "policy")
    recipe = tiny_recipe(tmp_path, policy, write_rlaif(tmp_path / "d.jsonl"), output_dir=UNWRITABLE)
    assert grpo_main(["--config", str(recipe)]) == 2
    assert f"output_dir {UNWRITABLE}: cannot write there" in capsys.readouterr().err


# --------------------------------------------------------------------------- merge-lora


@pytest.fixture(scope="module")
def adapter(tmp_path_factory):
    root = tmp_path_factory.mktemp("adapter")
    policy = build_tiny_policy(root / "policy")
    recipe = tiny_recipe(
        root, policy, write_rlaif(root / "d.jsonl"), use_peft=True, lora_r=4, lora_alpha=8,
        lora_target_modules=["q_proj", "v_proj"], max_steps=1,
    )  # fmt: skip
    assert grpo_main(["--config", str(recipe)]) == 0
    return SimpleNamespace(policy=policy, folder=root / "out", root=root)


def adapter_copy(adapter, tmp_path):
    folder = tmp_path / "adapter"
    shutil.copytree(adapter.folder, folder, ignore=shutil.ignore_patterns("checkpoint-*", "_*"))
    return folder


def test_merge_names_an_invalid_adapter_config(adapter, tmp_path, capsys):
    folder = adapter_copy(adapter, tmp_path)
    (folder / "adapter_config.json").write_text("{broken")
    assert run_command("merge-lora", [str(folder), str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err
    assert f"{folder / 'adapter_config.json'}: not a readable adapter config (JSONDecodeError" in err


def test_merge_names_missing_adapter_weights(adapter, tmp_path, capsys):
    folder = adapter_copy(adapter, tmp_path)
    (folder / "adapter_model.safetensors").unlink()
    assert run_command("merge-lora", [str(folder), str(tmp_path / "m")]) == 2
    assert "no adapter weights (adapter_model.safetensors or adapter_model.bin)" in capsys.readouterr().err


def test_merge_onto_another_base_is_a_clear_error_with_a_warning(adapter, tmp_path, capsys, caplog):
    other = build_tiny_policy(tmp_path / "wider", hidden_size=64)
    folder = adapter_copy(adapter, tmp_path)
    assert run_command("merge-lora", [str(folder), str(tmp_path / "m"), "--base_model", str(other)]) == 2
    err = capsys.readouterr().err
    assert f"does not fit the base model {other}" in err and "Traceback" not in err
    assert "differs from the base the adapter was trained on" in caplog.text
    assert not (tmp_path / "m").exists()


def test_merge_to_an_unwritable_location_fails_before_loading(adapter, tmp_path, capsys):
    assert run_command("merge-lora", [str(adapter_copy(adapter, tmp_path)), UNWRITABLE]) == 2
    assert f"output_dir {UNWRITABLE}: cannot write there" in capsys.readouterr().err


def test_merge_refuses_an_adapter_that_is_not_lora(adapter, tmp_path, capsys):
    folder = adapter_copy(adapter, tmp_path)
    config = json.loads((folder / "adapter_config.json").read_text())
    (folder / "adapter_config.json").write_text(json.dumps({**config, "peft_type": "PROMPT_TUNING"}))
    assert run_command("merge-lora", [str(folder), str(tmp_path / "m")]) == 2
    assert "not a LoRA adapter config (peft_type 'PROMPT_TUNING')" in capsys.readouterr().err

