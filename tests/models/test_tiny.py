"""`minimind_trl.models.minimind.tiny`: the public tiny MiniMind of both architectures, for smoke tests."""

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from minimind_trl.models.minimind.tiny import TINY_SHAPE, save_tiny_minimind, tiny_minimind, tiny_minimind_model


@pytest.mark.parametrize("architecture, qk_norm", [("minimind2", False), ("minimind3", True)])
def test_both_architectures_build_and_run_a_forward_pass(architecture, qk_norm):
    model, tokenizer = tiny_minimind(architecture)
    assert model.config.minimind_generation == architecture
    assert {key: getattr(model.config, key) for key in TINY_SHAPE} == TINY_SHAPE
    assert model.config.vocab_size == len(tokenizer)
    assert any("q_norm" in name for name, _ in model.named_parameters()) is qk_norm
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "1+1?"}], add_generation_prompt=True,
                                        return_tensors="pt", return_dict=True)["input_ids"]  # fmt: skip
    logits = model(input_ids=ids).logits
    assert logits.shape == (1, ids.shape[1], len(tokenizer)) and torch.isfinite(logits).all()


def test_the_seed_fixes_the_weights_and_config_keys_override_the_shape():
    first, tokenizer = tiny_minimind(seed=3)
    again = tiny_minimind_model(len(tokenizer), seed=3)
    other = tiny_minimind_model(len(tokenizer), seed=4)
    assert torch.equal(first.model.embed_tokens.weight, again.model.embed_tokens.weight)
    assert not torch.equal(first.model.embed_tokens.weight, other.model.embed_tokens.weight)
    moe = tiny_minimind_model(len(tokenizer), "minimind3", use_moe=True, hidden_size=64)
    assert moe.config.use_moe and moe.config.hidden_size == 64
    with pytest.raises(ValueError, match="minimind2, minimind3"):
        tiny_minimind("minimind4")


@pytest.mark.parametrize("architecture", ["minimind2", "minimind3"])
def test_the_saved_folder_loads_with_auto_classes_without_remote_code(tmp_path, architecture):
    model, _ = tiny_minimind(architecture)
    folder = save_tiny_minimind(tmp_path / "tiny", architecture)
    loaded = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=False)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert loaded.config.minimind_generation == architecture
    for (name, saved), (_, built) in zip(loaded.state_dict().items(), model.state_dict().items()):
        assert torch.equal(saved, built), name  # the same seed: the folder holds the weights tiny_minimind builds
    ids = tokenizer("hello", return_tensors="pt")["input_ids"]
    assert torch.isfinite(loaded(input_ids=ids).logits).all()
