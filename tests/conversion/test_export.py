"""`minimind-trl export`: native round trips (bit-equal) and Llama / Qwen3 / Qwen3-MoE folders that
transformers' own classes load strictly with MiniMind's logits."""

import json

import pytest
import torch
from conftest import FIXTURE_CASES, FIXTURES, load_fixture_case, require_shared
from safetensors import safe_open
from transformers import AutoTokenizer, LlamaForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM

from minimind_trl import MiniMindConfig, MiniMindForCausalLM
from minimind_trl.formats import architectures as architectures_module
from minimind_trl.cli import main as cli
from minimind_trl.conversion.convert import convert_checkpoint
from minimind_trl.conversion.export import ExportError, export_hf
from minimind_trl.formats.export_native import to_native_state_dict

ATOL = 1e-5


def random_minimind(seed: int = 0, **config_kwargs) -> MiniMindForCausalLM:
    """A MiniMind with O(1) logits and non-trivial norms, so eps, RoPE and routing mistakes show."""
    torch.manual_seed(seed)
    model = MiniMindForCausalLM(MiniMindConfig(**config_kwargs)).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.ndim == 2:
                param.normal_(0.0, param.shape[1] ** -0.5)
            else:
                param.uniform_(0.5, 1.5)
    return model


def loading_problems(info: dict) -> dict:
    return {name: keys for name, keys in info.items() if keys}


# --------------------------------------------------------------------------- native


@pytest.mark.parametrize("era,case", FIXTURE_CASES, ids=[f"{e}-{c}" for e, c in FIXTURE_CASES])
def test_native_round_trip_is_bit_equal_to_upstream_state_dict(era, case, tmp_path, capsys):
    """convert(upstream .pth) -> export native gives upstream's own state dict back: same keys, same bits."""
    fixture = load_fixture_case(era, case)
    heads = fixture["config_kwargs"]["num_attention_heads"]
    convert_checkpoint(fixture["state_dict_path"], tmp_path / "hf", num_attention_heads=heads)

    assert cli(["export", str(tmp_path / "hf"), str(tmp_path / "out.pth"), "--format", "native"]) == 0
    exported = torch.load(tmp_path / "out.pth", weights_only=True)
    upstream = fixture["state_dict"]
    assert set(exported) == set(upstream)  # what upstream's load_state_dict(strict=True) needs
    for key, value in upstream.items():
        assert exported[key].dtype == torch.float32 and torch.equal(exported[key], value), key

    # the sidecar carries what the tensors cannot: converting back restores the whole config
    sidecar = tmp_path / "out.config.json"
    assert json.loads(sidecar.read_text())["num_attention_heads"] == heads
    assert cli(["convert", str(tmp_path / "out.pth"), str(tmp_path / "back"), "--config", str(sidecar)]) == 0
    first = json.loads((tmp_path / "hf" / "config.json").read_text())
    second = json.loads((tmp_path / "back" / "config.json").read_text())
    assert first == second
    with safe_open(tmp_path / "hf" / "model.safetensors", "pt") as a, safe_open(tmp_path / "back" / "model.safetensors", "pt") as b:
        assert sorted(a.keys()) == sorted(b.keys())
        assert all(torch.equal(a.get_tensor(k), b.get_tensor(k)) for k in a.keys())


def test_native_fp16_like_upstream_trainers_and_sidecar_keeps_non_inferable_settings(tmp_path):
    model = random_minimind(hidden_size=48, num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=3,
                            use_moe=True, n_routed_experts=3, num_experts_per_tok=1, aux_loss_alpha=0.05,
                            rope_theta=1e4, inference_rope_scaling=True, rms_norm_eps=1e-6, vocab_size=300)  # fmt: skip
    model.save_pretrained(tmp_path / "hf")
    assert cli(["export", str(tmp_path / "hf"), str(tmp_path / "m.pth"), "--format", "native", "--dtype", "float16"]) == 0
    exported = torch.load(tmp_path / "m.pth", weights_only=True)
    assert set(exported) == set(model.state_dict())
    for key, value in model.state_dict().items():
        assert exported[key].dtype == torch.float16 and torch.equal(exported[key], value.half()), key

    sidecar = json.loads((tmp_path / "m.config.json").read_text())
    assert sidecar["n_routed_experts"] == 3 and sidecar["aux_loss_alpha"] == 0.05  # MiniMind2's own names
    assert sidecar["inference_rope_scaling"] is True and "rope_scaling" not in sidecar
    assert cli(["convert", str(tmp_path / "m.pth"), str(tmp_path / "back"), "--config", str(tmp_path / "m.config.json")]) == 0
    # without --config, convert finds the sidecar next to the checkpoint by itself
    assert cli(["convert", str(tmp_path / "m.pth"), str(tmp_path / "found")]) == 0
    for folder in ("back", "found"):
        back = MiniMindForCausalLM.from_pretrained(tmp_path / folder)
        for field in ("num_attention_heads", "num_experts_per_tok", "router_aux_loss_coef", "rope_parameters", "rms_norm_eps"):
            assert getattr(back.config, field) == getattr(model.config, field), (folder, field)


def test_to_native_state_dict_checks_keys():
    model = random_minimind(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, vocab_size=100)
    native = to_native_state_dict(model)
    assert "lm_head.weight" in native and "model.embed_tokens.weight" in native
    # a deduplicated (safetensors-style) dict gets its tied key back
    deduplicated = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}
    assert set(to_native_state_dict(deduplicated, config=model.config)) == set(native)
    wrapped = {f"base_model.model.{k}": v for k, v in model.state_dict().items()}
    with pytest.raises(ExportError, match="merge adapters first"):
        to_native_state_dict(wrapped, config=model.config)


# --------------------------------------------------------------------------- Llama / Qwen3 / Qwen3-MoE

HF_CASES = {
    # name: (MiniMindConfig kwargs, format, transformers class)
    "minimind2-dense-llama": (dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, vocab_size=6400),
                              "llama", LlamaForCausalLM),
    "minimind2-dense-yarn-llama": (dict(hidden_size=96, num_hidden_layers=2, num_attention_heads=6,
                                        inference_rope_scaling=True, rope_theta=1e4, vocab_size=300),
                                   "llama", LlamaForCausalLM),
    "minimind2-dense-inactive-yarn-llama": (dict(hidden_size=64, num_hidden_layers=1, num_attention_heads=4,
                                                 inference_rope_scaling=True, max_position_embeddings=2048,
                                                 vocab_size=300), "llama", LlamaForCausalLM),
    "minimind3-dense-head_dim24-yarn-qwen3": (dict(minimind_generation="minimind3", hidden_size=64,
                                                   num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                                   head_dim=24, inference_rope_scaling=True, vocab_size=300),
                                              "qwen3", Qwen3ForCausalLM),
    "minimind3-moe-qwen3_moe": (dict(minimind_generation="minimind3", hidden_size=64, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, use_moe=True, vocab_size=300),
                                "qwen3_moe", Qwen3MoeForCausalLM),
    "minimind3-moe-6experts-top2-yarn-untied-qwen3_moe": (
        dict(minimind_generation="minimind3", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, use_moe=True, num_experts=6, num_experts_per_tok=2, moe_intermediate_size=96,
             inference_rope_scaling=True, tie_word_embeddings=False, vocab_size=300),
        "qwen3_moe", Qwen3MoeForCausalLM),
}  # fmt: skip


@pytest.mark.parametrize("name", list(HF_CASES))
def test_export_loads_strictly_in_transformers_with_equal_logits(name, tmp_path, capsys):
    kwargs, fmt, target_class = HF_CASES[name]
    model = random_minimind(seed=len(name), **kwargs)
    model.save_pretrained(tmp_path / "minimind")
    with_tokenizer = kwargs["vocab_size"] == 6400
    if with_tokenizer:
        AutoTokenizer.from_pretrained(require_shared(FIXTURES / "MiniMind2" / "tokenizer")).save_pretrained(tmp_path / "minimind")

    # --no-verify: this test is the independent check of the folder
    rc = cli(["export", str(tmp_path / "minimind"), str(tmp_path / fmt), "--format", fmt, "--no-verify"])
    assert rc == 0, capsys.readouterr().err
    exported, info = target_class.from_pretrained(tmp_path / fmt, output_loading_info=True)
    assert type(exported) is target_class and loading_problems(info) == {}
    exported.eval()
    for field in ("tie_word_embeddings", "rms_norm_eps", "head_dim", "num_key_value_heads", "max_position_embeddings"):
        assert getattr(exported.config, field) == getattr(model.config, field), field
    if model.config.tie_word_embeddings:
        assert exported.lm_head.weight is exported.model.embed_tokens.weight

    input_ids = torch.randint(3, kwargs["vocab_size"], (3, 14), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(input_ids)
    mask[1, :3], mask[2, :9] = 0, 0
    with torch.no_grad():
        for args in ({}, {"attention_mask": mask}):
            expected, got = model(input_ids, **args).logits, exported(input_ids, **args).logits
            torch.testing.assert_close(got[mask.bool()], expected[mask.bool()], atol=ATOL, rtol=0)

    # the file layout and config keys real hub checkpoints have (what vLLM / llama.cpp converters read)
    config = json.loads((tmp_path / fmt / "config.json").read_text())
    assert config["rope_theta"] == model.config.rope_parameters["rope_theta"]
    assert (config["rope_scaling"] is None) == (not model.config.yarn_active)
    with safe_open(tmp_path / fmt / "model.safetensors", "pt") as weights:
        keys = set(weights.keys())
    assert ("lm_head.weight" in keys) == (not model.config.tie_word_embeddings)
    if fmt == "qwen3_moe":
        assert config["num_experts"] == model.config.num_experts and "num_local_experts" not in config
        per_expert = {f"model.layers.{layer}.mlp.experts.{expert}.{proj}.weight"
                      for layer in range(2) for expert in range(model.config.num_experts)
                      for proj in ("gate_proj", "up_proj", "down_proj")}  # fmt: skip
        assert per_expert <= keys
        assert not any("gate_up_proj" in key for key in keys)
    if with_tokenizer:
        assert AutoTokenizer.from_pretrained(tmp_path / fmt).chat_template is not None


REFUSALS = {
    "minimind2-moe-as-llama": ("minimind2", True, "llama", "MiniMind2 MoE cannot be written as Llama, Qwen3 or Qwen3-MoE"),
    "minimind2-moe-as-qwen3_moe": ("minimind2", True, "qwen3_moe", "shared expert unweighted"),
    "minimind2-dense-as-qwen3": ("minimind2", False, "qwen3", "exports exactly as --format llama"),
    "minimind3-dense-as-llama": ("minimind3", False, "llama", "Llama has no such norm"),
    "minimind3-dense-as-qwen3_moe": ("minimind3", False, "qwen3_moe", "exports exactly as --format qwen3"),
    "minimind3-moe-as-qwen3": ("minimind3", True, "qwen3", "exports exactly as --format qwen3_moe"),
}


@pytest.mark.parametrize("name", list(REFUSALS))
def test_inexpressible_exports_are_refused_with_the_reason(name, tmp_path, capsys):
    generation, moe, fmt, fragment = REFUSALS[name]
    model = random_minimind(minimind_generation=generation, hidden_size=32, num_hidden_layers=1,
                            num_attention_heads=2, num_key_value_heads=1, use_moe=moe, vocab_size=100)  # fmt: skip
    model.save_pretrained(tmp_path / "minimind")
    assert cli(["export", str(tmp_path / "minimind"), str(tmp_path / "out"), "--format", fmt]) == 2
    assert fragment in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["minimind"]


YARN_MISMATCHES = {
    # name: (MiniMindConfig kwargs, format); upstream's YaRN ramp ends at head_dim // 2 - 1, transformers' at head_dim - 1
    "minimind2-head_dim4-theta1e4-llama": (dict(hidden_size=64, num_attention_heads=16, num_key_value_heads=4,
                                                rope_theta=1e4), "llama"),
    "minimind3-head_dim8-theta1e3-qwen3": (dict(minimind_generation="minimind3", hidden_size=32, num_attention_heads=2,
                                                num_key_value_heads=1, head_dim=8, rope_theta=1e3), "qwen3"),
    "minimind3-moe-head_dim4-theta1e4-qwen3_moe": (dict(minimind_generation="minimind3", hidden_size=32,
                                                        num_attention_heads=4, num_key_value_heads=2, head_dim=4,
                                                        rope_theta=1e4, use_moe=True), "qwen3_moe"),
}  # fmt: skip


@pytest.mark.parametrize("name", list(YARN_MISMATCHES))
def test_yarn_that_transformers_computes_differently_is_refused(name, tmp_path, capsys):
    kwargs, fmt = YARN_MISMATCHES[name]
    model = random_minimind(num_hidden_layers=1, vocab_size=100, inference_rope_scaling=True, **kwargs)
    model.save_pretrained(tmp_path / "minimind")
    assert cli(["export", str(tmp_path / "minimind"), str(tmp_path / "out"), "--format", fmt, "--no-verify"]) == 2
    err = capsys.readouterr().err
    assert "transformers' YaRN gives other RoPE frequencies" in err and "--format native" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["minimind"]
    # the same folder without YaRN, or as native, exports fine
    assert cli(["export", str(tmp_path / "minimind"), str(tmp_path / "m.pth"), "--format", "native"]) == 0
    plain = random_minimind(num_hidden_layers=1, vocab_size=100, **kwargs)
    export_hf(plain, tmp_path / fmt, fmt)


def test_verification_rejects_a_wrong_mapping_and_leaves_nothing(tmp_path, monkeypatch):
    """The default self-check loads the export with transformers and compares logits before moving it into place."""
    model = random_minimind(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, vocab_size=100)
    monkeypatch.setattr(architectures_module, "export_rope_parameters", lambda config: {"rope_type": "default", "rope_theta": 1e4})
    with pytest.raises(ExportError, match="logits differ from MiniMind's"):
        export_hf(model, tmp_path / "llama", "llama")
    assert list(tmp_path.iterdir()) == []


def test_export_fp16_folder_keeps_dtype_and_verifies(tmp_path):
    model = random_minimind(minimind_generation="minimind3", hidden_size=32, num_hidden_layers=1,
                            num_attention_heads=2, num_key_value_heads=1, vocab_size=100)  # fmt: skip
    export_hf(model, tmp_path / "qwen3", "qwen3", dtype=torch.float16)
    with safe_open(tmp_path / "qwen3" / "model.safetensors", "pt") as weights:
        assert all(weights.get_tensor(k).dtype == torch.float16 for k in weights.keys())
    config = json.loads((tmp_path / "qwen3" / "config.json").read_text())
    assert config["torch_dtype"] == config["dtype"] == "float16"
