"""`minimind-trl export --format gguf`: the file read back with ggml-org's own `GGUFReader`.

Architecture and hyper-parameters as llama.cpp reads them, every tensor's name, shape and values against the
MiniMind weights (llama's q/k rows un-permuted), MiniMind's real tokenizer (tokens, types, merges, specials, chat
template), each storage type, and the refusals where llama.cpp would compute other logits.
"""

import json

import numpy as np
import pytest
import torch
from conftest import FIXTURES, require_shared
from transformers import AutoTokenizer

from minimind_trl import MiniMindConfig, MiniMindForCausalLM
from minimind_trl.cli import main as cli
from minimind_trl.conversion.export import ExportError
from minimind_trl.conversion.export_gguf import export_gguf, unpermute_for_llama

gguf = pytest.importorskip("gguf")

CASES = {  # head_dim 24 != hidden/heads; MoE with 3 experts, top-2; one untied head
    "llama": ("MiniMind2", dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)),
    "qwen3": ("MiniMind-3", dict(minimind_generation="minimind3", hidden_size=64, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2, head_dim=24, tie_word_embeddings=False)),
    "qwen3moe": ("MiniMind-3", dict(minimind_generation="minimind3", hidden_size=64, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=1, use_moe=True, num_experts=3,
                                    num_experts_per_tok=2, moe_intermediate_size=64, rope_theta=1e4)),
}  # fmt: skip


def random_minimind(seed=0, **kwargs) -> MiniMindForCausalLM:
    torch.manual_seed(seed)
    model = MiniMindForCausalLM(MiniMindConfig(vocab_size=6400, **kwargs)).eval()
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0.0, 0.5) if param.ndim == 2 else param.uniform_(0.5, 1.5)
    return model


def tokenizer_of(era: str):
    return AutoTokenizer.from_pretrained(require_shared(FIXTURES / era / "tokenizer"))


def field(reader, key):
    return reader.fields[key].contents()


def read_tensors(reader) -> dict[str, tuple[tuple, np.ndarray, object]]:
    """name -> (torch-order shape, float32 values, stored type)"""
    out = {}
    for tensor in reader.tensors:
        shape = tuple(int(n) for n in reversed(tensor.shape.tolist()))
        values = gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32).reshape(shape)
        out[tensor.name] = (shape, values, tensor.tensor_type)
    return out


def expected_tensors(model, arch) -> dict[str, torch.Tensor]:
    """The MiniMind weights under llama.cpp's names, written independently of the exporter's table."""
    config, state = model.config, model.state_dict()
    names = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
             "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
             "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm", "mlp.gate_proj": "ffn_gate",
             "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down", "mlp.gate": "ffn_gate_inp"}  # fmt: skip
    out = {"token_embd.weight": state["model.embed_tokens.weight"], "output_norm.weight": state["model.norm.weight"]}
    if not config.tie_word_embeddings:
        out["output.weight"] = state["lm_head.weight"]
    for i in range(config.num_hidden_layers):
        for hf, name in names.items():
            if f"model.layers.{i}.{hf}.weight" in state:
                out[f"blk.{i}.{name}.weight"] = state[f"model.layers.{i}.{hf}.weight"]
        if config.use_moe:
            for proj, name in (("gate_proj", "ffn_gate_exps"), ("up_proj", "ffn_up_exps"), ("down_proj", "ffn_down_exps")):
                experts = [state[f"model.layers.{i}.mlp.experts.{e}.{proj}.weight"] for e in range(config.num_experts)]
                out[f"blk.{i}.{name}.weight"] = torch.stack(experts)
    return {name: value.float() for name, value in out.items()}


@pytest.mark.parametrize("arch", list(CASES))
def test_gguf_reads_back_as_llama_cpp_expects(arch, tmp_path):
    era, kwargs = CASES[arch]
    model, tokenizer = random_minimind(**kwargs), tokenizer_of(era)
    path = export_gguf(model, tmp_path / "m.gguf", tokenizer, outtype="f32")
    reader = gguf.GGUFReader(path)
    config = model.config

    assert field(reader, "general.architecture") == arch
    hyper = {
        "context_length": config.max_position_embeddings, "embedding_length": config.hidden_size,
        "block_count": config.num_hidden_layers, "feed_forward_length": config.intermediate_size,
        "attention.head_count": config.num_attention_heads, "attention.head_count_kv": config.num_key_value_heads,
        "attention.key_length": config.head_dim, "attention.value_length": config.head_dim,
        "rope.dimension_count": config.head_dim, "vocab_size": 6400,
    }  # fmt: skip
    if config.use_moe:
        hyper.update(expert_count=3, expert_used_count=2, expert_feed_forward_length=64)
    assert {key: field(reader, f"{arch}.{key}") for key in hyper} == hyper
    assert field(reader, f"{arch}.rope.freq_base") == pytest.approx(config.rope_parameters["rope_theta"])
    assert field(reader, f"{arch}.attention.layer_norm_rms_epsilon") == pytest.approx(config.rms_norm_eps)
    assert f"{arch}.rope.scaling.type" not in reader.fields

    got, expected = read_tensors(reader), expected_tensors(model, arch)
    assert sorted(got) == sorted(expected)
    for name, value in expected.items():
        shape, array, ttype = got[name]
        assert shape == tuple(value.shape) and ttype == gguf.GGMLQuantizationType.F32, name
        array = torch.from_numpy(array)
        if arch == "llama" and name.endswith(("attn_q.weight", "attn_k.weight")):
            heads = config.num_attention_heads if "attn_q" in name else config.num_key_value_heads
            assert not torch.equal(array, value), name  # llama.cpp's llama rotates adjacent pairs: rows permuted
            array = unpermute_for_llama(array, heads)
        assert torch.equal(array, value), name

    # MiniMind's tokenizer as llama.cpp's converter writes a GPT-2-style BPE
    assert field(reader, "tokenizer.ggml.model") == "gpt2"
    assert field(reader, "tokenizer.ggml.pre") == "gpt-2"
    vocab = {index: token for token, index in tokenizer.get_vocab().items()}
    assert field(reader, "tokenizer.ggml.tokens") == [vocab[i] for i in range(6400)]
    types = field(reader, "tokenizer.ggml.token_type")
    assert types[:3] == [gguf.TokenType.CONTROL] * 3 and types[100] == gguf.TokenType.NORMAL
    merges = json.loads((FIXTURES / era / "tokenizer" / "tokenizer.json").read_text())["model"]["merges"]
    assert field(reader, "tokenizer.ggml.merges") == [m if isinstance(m, str) else " ".join(m) for m in merges]
    specials = {key: field(reader, f"tokenizer.ggml.{key}_token_id") for key in ("bos", "eos", "padding", "unknown")}
    assert specials == {"bos": 1, "eos": 2, "padding": 0, "unknown": 0}
    assert field(reader, "tokenizer.ggml.add_bos_token") is False
    assert field(reader, "tokenizer.chat_template") == tokenizer.chat_template


@pytest.mark.parametrize("outtype", ["f16", "bf16", "q8_0"])
def test_gguf_storage_types(outtype, tmp_path):
    era, kwargs = CASES["qwen3moe"]
    model = random_minimind(**kwargs)
    path = export_gguf(model, tmp_path / "m.gguf", tokenizer_of(era), outtype=outtype)
    got = read_tensors(gguf.GGUFReader(path))
    wanted = {"f16": gguf.GGMLQuantizationType.F16, "bf16": gguf.GGMLQuantizationType.BF16,
              "q8_0": gguf.GGMLQuantizationType.Q8_0}[outtype]  # fmt: skip
    for name, value in expected_tensors(model, "qwen3moe").items():
        shape, array, ttype = got[name]
        array = torch.from_numpy(array)
        if value.ndim == 1 or name.endswith("ffn_gate_inp.weight"):  # kept float32, as llama.cpp's converter does
            assert ttype == gguf.GGMLQuantizationType.F32 and torch.equal(array, value), name
        elif outtype == "q8_0":
            assert ttype == wanted, name
            # Q8_0: blocks of 32 values sharing one scale d = max|x|/127 (stored fp16: d is off by up to 2^-11 d,
            # so x = d*round(x/d) is off by at most d/2 + 127 * 2^-11 d)
            step = value.reshape(-1, 32).abs().amax(-1, keepdim=True) / 127
            assert ((array.reshape(-1, 32) - value.reshape(-1, 32)).abs() <= step * (0.5 + 127 * 2**-11)).all(), name
        else:
            rounded = value.to(torch.float16 if outtype == "f16" else torch.bfloat16).float()
            assert ttype == wanted and torch.equal(array, rounded), name


def test_gguf_refuses_what_llama_cpp_computes_differently(tmp_path):
    tokenizer = tokenizer_of("MiniMind2")
    tiny = dict(hidden_size=64, num_hidden_layers=1, num_attention_heads=4)
    with pytest.raises(ExportError, match=r"--format gguf: MiniMind2 MoE cannot be written"):
        export_gguf(random_minimind(use_moe=True, **tiny), tmp_path / "a.gguf", tokenizer)
    with pytest.raises(ExportError, match=r"YaRN.*1 \+ 0\.1\*ln\(factor\)"):
        export_gguf(random_minimind(inference_rope_scaling=True, **tiny), tmp_path / "b.gguf", tokenizer)
    with pytest.raises(ExportError, match="norm_topk_prob"):
        export_gguf(random_minimind(minimind_generation="minimind3", use_moe=True, num_experts=2,
                                    norm_topk_prob=False, **tiny), tmp_path / "c.gguf", tokenizer)  # fmt: skip
    assert not list(tmp_path.iterdir())
    # an inactive YaRN (context not extended) is plain RoPE and exports
    inactive = random_minimind(inference_rope_scaling=True, max_position_embeddings=2048, **tiny)
    assert export_gguf(inactive, tmp_path / "d.gguf", tokenizer).is_file()


def test_cli_gguf_and_yarn_warning_for_folder_exports(tmp_path, capsys):
    era, kwargs = CASES["llama"]
    model = random_minimind(**kwargs)
    model.save_pretrained(tmp_path / "hf")
    tokenizer_of(era).save_pretrained(tmp_path / "hf")
    assert cli(["export", str(tmp_path / "hf"), str(tmp_path / "m.gguf"), "--format", "gguf", "--dtype", "q8_0"]) == 0
    assert "FROM " in capsys.readouterr().out
    reader = gguf.GGUFReader(tmp_path / "m.gguf")
    assert field(reader, "general.architecture") == "llama"
    assert field(reader, "general.file_type") == gguf.LlamaFileType.MOSTLY_Q8_0
    assert cli(["export", str(tmp_path / "hf"), str(tmp_path / "x"), "--format", "llama", "--dtype", "q8_0"]) == 2
    assert "q8_0 is a GGUF type" in capsys.readouterr().err

    yarn = random_minimind(inference_rope_scaling=True, **kwargs)
    yarn.save_pretrained(tmp_path / "yarn")
    assert cli(["export", str(tmp_path / "hf"), str(tmp_path / "plain"), "--format", "llama"]) == 0
    assert "llama.cpp" not in capsys.readouterr().err
    assert cli(["export", str(tmp_path / "yarn"), str(tmp_path / "llama"), "--format", "llama"]) == 0
    assert "warning: --format llama with YaRN" in capsys.readouterr().err
