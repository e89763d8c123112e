"""`minimind-trl merge-lora`: a LoRA run's adapter folds into a full model that loads and generates, from any working
folder and after the run's folder moved (the adapter records its base relative to itself when the base is inside the
run, as `_base_model/` is); two spellings of one base folder are one; a base that is not there is one line."""

import json
import os
import shutil
from types import SimpleNamespace

import pytest
import torch
from grpo_fixtures import build_tiny_policy, tiny_recipe, write_rlaif
from safetensors.torch import load_file

from minimind_trl import MiniMindForCausalLM
from minimind_trl.grpo import main as grpo_main
from minimind_trl.cli import run_command


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora")
    policy = build_tiny_policy(root / "policy")
    data = write_rlaif(root / "rlaif.jsonl")
    recipe = tiny_recipe(
        root, policy, data, use_peft=True, lora_r=4, lora_alpha=8, lora_target_modules=["q_proj", "v_proj"]
    )
    assert grpo_main(["--config", str(recipe)]) == 0
    return SimpleNamespace(policy=policy, adapter=root / "out", root=root)


def test_lora_run_saves_an_adapter_with_its_tokenizer(lora_run):
    config = json.loads((lora_run.adapter / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(lora_run.policy)
    assert sorted(config["target_modules"]) == ["q_proj", "v_proj"] and config["r"] == 4
    assert (lora_run.adapter / "tokenizer.json").is_file()
    assert not (lora_run.adapter / "model.safetensors").exists()


def test_merge_folds_the_adapter_into_the_base_weights(lora_run, capsys):
    merged_dir = lora_run.root / "merged"
    assert run_command("merge-lora", [str(lora_run.adapter), str(merged_dir)]) == 0

    base = load_file(lora_run.policy / "model.safetensors")
    adapter = load_file(lora_run.adapter / "adapter_model.safetensors")
    merged = MiniMindForCausalLM.from_pretrained(merged_dir)
    scale = 8 / 4  # lora_alpha / r
    for layer in range(2):
        for proj in ("q_proj", "v_proj"):
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{proj}"
            lora_a, lora_b = adapter[f"{prefix}.lora_A.weight"], adapter[f"{prefix}.lora_B.weight"]
            assert lora_b.abs().max() > 0  # training moved the adapter away from its zero init
            expected = base[f"model.layers.{layer}.self_attn.{proj}.weight"] + scale * lora_b @ lora_a
            actual = getattr(merged.model.layers[layer].self_attn, proj).weight
            torch.testing.assert_close(actual, expected, atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(
            merged.model.layers[layer].mlp.up_proj.weight, base[f"model.layers.{layer}.mlp.up_proj.weight"]
        )

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(merged_dir)
    inputs = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    output = merged.generate(**inputs, max_new_tokens=5, do_sample=False)
    assert output.shape[1] == inputs["input_ids"].shape[1] + 5 or tokenizer.eos_token_id in output[0].tolist()
    assert json.loads((merged_dir / "config.json").read_text())["auto_map"]["AutoModelForCausalLM"]


def test_merge_refuses_bad_input(lora_run, tmp_path, capsys):
    assert run_command("merge-lora", [str(tmp_path), str(tmp_path / "merged")]) == 2
    assert "is not a LoRA adapter folder (no adapter_config.json)" in capsys.readouterr().err

    existing = tmp_path / "existing"
    existing.mkdir()
    (existing / "keep.txt").write_text("user data")
    assert run_command("merge-lora", [str(lora_run.adapter), str(existing)]) == 2
    assert "exists and is not empty" in capsys.readouterr().err
    assert (existing / "keep.txt").read_text() == "user data"

    assert run_command("merge-lora", [str(lora_run.adapter), str(tmp_path / "m2"), "--base_model", "./no/such/base"]) == 2
    assert "base model ./no/such/base (from --base_model) does not exist" in capsys.readouterr().err


# --------------------------------------------------------------------------- the adapter's base, wherever it goes


@pytest.fixture(scope="module")
def native_lora_run(tmp_path_factory):
    """A LoRA run from a native `.pth` (converted into the run's `_base_model/`), started in `work/` with the
    relative output_dir `out/run`, as a user runs it; a checkpoint at step 1, the final adapter at step 2."""
    from minimind_trl.formats.export_native import to_native_state_dict

    root = tmp_path_factory.mktemp("native-lora")
    policy = build_tiny_policy(root / "policy")
    native = root / "reason_32.pth"
    torch.save(to_native_state_dict(MiniMindForCausalLM.from_pretrained(policy), dtype=torch.float16), native)
    work = root / "work"
    work.mkdir()
    recipe = tiny_recipe(
        work, policy, write_rlaif(root / "rlaif.jsonl"), model_name_or_path=str(native), native_num_attention_heads=4,
        tokenizer_name_or_path=str(policy), output_dir="out/run", use_peft=True, lora_r=4, lora_alpha=8,
        save_strategy="steps", save_steps=1,
    )  # fmt: skip
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(work)
        assert grpo_main(["--config", str(recipe)]) == 0
    return SimpleNamespace(root=root, run=work / "out" / "run")


def merged_weights(folder):
    return load_file(folder / "model.safetensors")


@pytest.fixture(scope="module")
def reference_merge(native_lora_run):
    """The adapter merged where it was trained (the working folder of the run): what every other merge must equal."""
    out = native_lora_run.root / "reference-merge"
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(native_lora_run.root / "work")
        assert run_command("merge-lora", ["out/run", str(out)]) == 0
    return merged_weights(out)


def test_the_adapter_records_its_base_relative_to_its_own_folder(native_lora_run):
    read = lambda folder: json.loads((folder / "adapter_config.json").read_text())["base_model_name_or_path"]  # noqa
    assert read(native_lora_run.run) == "_base_model"
    assert read(native_lora_run.run / "checkpoint-1") == "../_base_model"


@pytest.mark.parametrize("where", ["another folder", "the adapter's folder", "a moved copy", "a symlinked spelling"])
def test_merge_lora_works_from_any_folder_and_after_the_run_folder_moved(
    native_lora_run, reference_merge, where, tmp_path, monkeypatch, caplog
):
    adapter = native_lora_run.run
    if where == "a moved copy":
        adapter = tmp_path / "moved" / "my-run"
        shutil.copytree(native_lora_run.run, adapter)
    if where == "a symlinked spelling":
        (tmp_path / "link").symlink_to(native_lora_run.run.parent)
        adapter = tmp_path / "link" / "run"
    monkeypatch.chdir(adapter if where == "the adapter's folder" else tmp_path)
    given = "." if where == "the adapter's folder" else os.path.relpath(adapter, tmp_path)
    with caplog.at_level("WARNING", logger="minimind_trl"):
        assert run_command("merge-lora", [given, str(tmp_path / "merged")]) == 0
    assert "differs" not in caplog.text
    merged = merged_weights(tmp_path / "merged")
    assert merged.keys() == reference_merge.keys()
    assert all(torch.equal(merged[key], reference_merge[key]) for key in merged)


def test_a_checkpoints_adapter_merges_too(native_lora_run, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert run_command("merge-lora", [str(native_lora_run.run / "checkpoint-1"), "merged"]) == 0
    assert (tmp_path / "merged" / "model.safetensors").is_file()


def test_two_spellings_of_the_recorded_base_are_one(native_lora_run, tmp_path, caplog):
    (tmp_path / "link").symlink_to(native_lora_run.run)
    for n, spelling in enumerate([native_lora_run.run / "_base_model", tmp_path / "link" / "_base_model"]):
        with caplog.at_level("WARNING", logger="minimind_trl"):
            args = [str(native_lora_run.run), str(tmp_path / f"m{n}"), "--base_model", str(spelling)]
            assert run_command("merge-lora", args) == 0
    assert "differs" not in caplog.text
    copy = tmp_path / "copy-of-base"
    shutil.copytree(native_lora_run.run / "_base_model", copy)  # the same weights, but another folder: said
    with caplog.at_level("WARNING", logger="minimind_trl"):
        assert run_command("merge-lora", [str(native_lora_run.run), str(tmp_path / "m2"), "--base_model", str(copy)]) == 0
    assert f"--base_model {copy} differs from the base the adapter was trained on" in caplog.text


@pytest.mark.parametrize("recorded, message", [
    ("_base_model", "cannot load the base model _base_model (from adapter_config.json; not a folder here, neither "
                    "{adapter}/_base_model nor _base_model, so a Hub id): "),
    ("out/run/_base_model", "records the base model 'out/run/_base_model', which is not there (neither "
                            "{adapter}/out/run/_base_model nor out/run/_base_model); pass the base it was trained on"),
    ("someone/not-on-this-machine", "cannot load the base model someone/not-on-this-machine (from adapter_config.json; "
                                    "not a folder here"),
])  # fmt: skip
def test_a_base_that_is_not_there_is_one_line(native_lora_run, recorded, message, tmp_path, monkeypatch, capsys):
    adapter = tmp_path / "adapter"
    for name in ("adapter_config.json", "adapter_model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        (adapter / name).parent.mkdir(exist_ok=True)
        shutil.copy(native_lora_run.run / name, adapter / name)
    config = json.loads((adapter / "adapter_config.json").read_text())
    (adapter / "adapter_config.json").write_text(json.dumps({**config, "base_model_name_or_path": recorded}))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    monkeypatch.chdir(tmp_path)
    assert run_command("merge-lora", [str(adapter), "merged"]) == 2
    err = capsys.readouterr().err
    (line,) = err.strip().splitlines()
    assert line.startswith("minimind-trl merge-lora: error: ") and message.format(adapter=adapter) in line
    assert "HFValidationError" not in err and "Traceback" not in err


def test_peft_loads_the_adapter_on_its_base_as_the_docs_show(native_lora_run, reference_merge):
    """docs/training.md#lora: `PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained("OUT/_base_model"),
    "OUT")` is the merged model before merging."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    out = native_lora_run.run
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(f"{out}/_base_model"), str(out))
    merged = MiniMindForCausalLM.from_pretrained(native_lora_run.root / "reference-merge")
    ids = torch.tensor([[1, 5, 9, 14, 3]])
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids).logits, merged(input_ids=ids).logits, atol=1e-5, rtol=1e-5)
