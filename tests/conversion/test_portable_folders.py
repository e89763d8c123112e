"""Every folder minimind-trl writes carries what the consumers outside transformers 5 read.

* `config.json` names the class (`architectures`): vLLM resolves the model class from it and llama.cpp's
  `convert_hf_to_gguf.py` stops without it ("Failed to detect model architecture"); transformers itself does
  not need it, so round-trip tests alone cannot see it missing.
* `tokenizer_config.json` in the form upstream's converter writes (`tokenizer_class: PreTrainedTokenizerFast`,
  `extra_special_tokens` a dict): transformers 4.57.x (upstream's pinned version) has no `TokenizersBackend`
  and fails on a list; the files must still load back identically on transformers 5.
* the `response_template` that parses MiniMind's tool calls, which TRL's tool loop (`tools=`,
  `environment_factory`) needs and cannot find for MiniMind's chat templates on its own.
"""

import json

import pytest
import torch
from conftest import FIXTURES, require_shared
from transformers import AutoTokenizer

from minimind_trl import MiniMindConfig, MiniMindForCausalLM
from minimind_trl.cli.policy import load_tokenizer
from minimind_trl.conversion.convert import convert_checkpoint
from minimind_trl.conversion.export import export_hf, load_minimind_folder
from minimind_trl.conversion.merge_lora import merge_lora
from minimind_trl.models.minimind.tokenization_minimind import MINIMIND_RESPONSE_TEMPLATE, build_minimind_tokenizer

TINY = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, vocab_size=6400)
CASES = {
    "llama": dict(TINY),
    "qwen3": dict(TINY, minimind_generation="minimind3"),
    "qwen3_moe": dict(TINY, minimind_generation="minimind3", use_moe=True, num_experts=2),
}
CLASSES = {"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM"}
MESSAGES = [{"role": "user", "content": "你好, what is 2+3?"}, {"role": "assistant", "content": "<think>5</think>"}]


def _architectures(folder) -> list:
    return json.loads((folder / "config.json").read_text()).get("architectures")


def _assert_portable_tokenizer(folder, reference):
    """The 4.57-readable form, and transformers 5 reads it back as the same tokenizer."""
    config = json.loads((folder / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert isinstance(config["extra_special_tokens"], dict)
    assert "chat_template" in config  # where llama.cpp's converter and older loaders look first
    reloaded = AutoTokenizer.from_pretrained(folder)
    text = "Hello 世界 <|im_start|>user\n<think>x</think><|im_end|>"
    assert reloaded(text)["input_ids"] == reference(text)["input_ids"]
    assert sorted(reloaded.all_special_tokens) == sorted(reference.all_special_tokens)  # order: JSON key order
    assert (reloaded.bos_token_id, reloaded.eos_token_id, reloaded.pad_token_id) == (
        reference.bos_token_id, reference.eos_token_id, reference.pad_token_id,
    )  # fmt: skip
    assert reloaded.apply_chat_template(MESSAGES, tokenize=False) == reference.apply_chat_template(
        MESSAGES, tokenize=False
    )
    assert config["response_template"] == MINIMIND_RESPONSE_TEMPLATE == reloaded.response_template


@pytest.mark.parametrize("era", ["MiniMind2", "MiniMind-3"])
def test_convert_writes_architectures_and_a_portable_upstream_tokenizer(era, tmp_path):
    tokenizer_dir = require_shared(FIXTURES / era / "tokenizer")
    kwargs = CASES["llama" if era == "MiniMind2" else "qwen3"]
    model = MiniMindForCausalLM(MiniMindConfig(**kwargs))
    torch.save(model.state_dict(), tmp_path / "m.pth")
    convert_checkpoint(tmp_path / "m.pth", tmp_path / "hf", num_attention_heads=2, tokenizer=tokenizer_dir)
    assert _architectures(tmp_path / "hf") == ["MiniMindForCausalLM"]
    _assert_portable_tokenizer(tmp_path / "hf", AutoTokenizer.from_pretrained(tokenizer_dir))


@pytest.mark.parametrize("fmt", list(CASES))
def test_exports_name_their_transformers_class(fmt, tmp_path):
    model = MiniMindForCausalLM(MiniMindConfig(**CASES[fmt])).eval()
    tokenizer = build_minimind_tokenizer()
    model.save_pretrained(tmp_path / "hf")
    tokenizer.save_pretrained(tmp_path / "hf")
    assert _architectures(tmp_path / "hf") == ["MiniMindForCausalLM"]
    _assert_portable_tokenizer(tmp_path / "hf", tokenizer)

    loaded, loaded_tokenizer = load_minimind_folder(tmp_path / "hf")
    export_hf(loaded, tmp_path / fmt, fmt, tokenizer=loaded_tokenizer)
    assert _architectures(tmp_path / fmt) == [CLASSES[fmt]]
    _assert_portable_tokenizer(tmp_path / fmt, tokenizer)


def test_policy_tokenizer_and_merged_lora_folders_are_portable(tmp_path):
    from peft import LoraConfig, get_peft_model

    reference = build_minimind_tokenizer()
    model = MiniMindForCausalLM(MiniMindConfig(**TINY)).eval()
    model.save_pretrained(tmp_path / "base")
    reference.save_pretrained(tmp_path / "base")
    # what the GRPO command loads (and the trainer saves into checkpoints and Hub pushes)
    policy_tokenizer = load_tokenizer(str(tmp_path / "base"))
    policy_tokenizer.save_pretrained(tmp_path / "checkpoint")
    _assert_portable_tokenizer(tmp_path / "checkpoint", reference)

    base = MiniMindForCausalLM.from_pretrained(tmp_path / "base")
    get_peft_model(base, LoraConfig(r=2, target_modules=["q_proj"])).save_pretrained(tmp_path / "adapter")
    AutoTokenizer.from_pretrained(tmp_path / "base").save_pretrained(tmp_path / "adapter")  # transformers' own form
    assert json.loads((tmp_path / "adapter" / "tokenizer_config.json").read_text())["tokenizer_class"] != (
        "PreTrainedTokenizerFast"
    )
    merge_lora(str(tmp_path / "adapter"), str(tmp_path / "merged"), base_model=str(tmp_path / "base"))
    assert _architectures(tmp_path / "merged") == ["MiniMindForCausalLM"]
    _assert_portable_tokenizer(tmp_path / "merged", reference)
