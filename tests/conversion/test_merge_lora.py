"""`minimind-trl merge-lora`: a LoRA run's adapter folds into a full model that loads and generates."""

import json
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
