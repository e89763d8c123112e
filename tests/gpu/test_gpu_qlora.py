"""QLoRA on the device: `minimind-trl grpo --load_in_4bit true --use_peft true` trains a LoRA adapter on a MiniMind
whose linear layers bitsandbytes holds in 4 bits (a common single-GPU setup), a few steps; the adapter saved moves and
merges into the unquantized base. On CPU (`MINIMIND_TEST_DEVICE=cpu`) the same command is refused in one line, as
bitsandbytes quantizes for CUDA."""

import pytest
from grpo_fixtures import PROBE_DIR_ENV, build_tiny_policy, tiny_recipe, write_rlaif
from safetensors.torch import load_file

pytestmark = pytest.mark.gpu

STEPS = 3


def test_qlora_trains_an_adapter_on_4bit_weights(tmp_path, device, monkeypatch, capsys):
    import json

    from minimind_trl.cli import main as cli

    policy = build_tiny_policy(tmp_path / "policy")
    recipe = tiny_recipe(tmp_path, policy, write_rlaif(tmp_path / "rlaif.jsonl"), max_steps=STEPS,
                         use_cpu=device == "cpu", bf16=device == "cuda", save_strategy="no",
                         callbacks=["grpo_fixtures:RankProbe"])  # fmt: skip
    monkeypatch.setenv(PROBE_DIR_ENV, str(tmp_path))
    qlora = ["--load_in_4bit", "true", "--use_peft", "true", "--lora_r", "4", "--lora_alpha", "8"]
    code = cli(["grpo", "--config", str(recipe), *qlora])
    if device == "cpu":
        assert code == 2
        assert "--load_in_4bit true: bitsandbytes quantizes the policy for a CUDA GPU" in capsys.readouterr().err
        return
    assert code == 0, capsys.readouterr().err[-4000:]
    (layout,) = [json.loads(line) for line in (tmp_path / "layout-rank0.jsonl").read_text().splitlines()]
    assert layout["peft"] == "PeftModelForCausalLM" and "Linear4bit" in layout["linear_layers"]
    steps = [json.loads(line)["step"] for line in (tmp_path / "steps-rank0.jsonl").read_text().splitlines()]
    assert steps == list(range(1, STEPS + 1))
    adapter = load_file(tmp_path / "out" / "adapter_model.safetensors")
    assert adapter and max(v.float().abs().max().item() for k, v in adapter.items() if "lora_B" in k) > 0  # trained
    assert cli(["merge-lora", str(tmp_path / "out"), str(tmp_path / "merged"), "--base_model", str(policy)]) == 0
    assert (tmp_path / "merged" / "model.safetensors").is_file()
