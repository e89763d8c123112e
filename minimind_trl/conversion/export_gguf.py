"""MiniMind -> one GGUF file that llama.cpp (and Ollama, LM Studio, llama-cpp-python) load, via ggml-org's `gguf`.

No llama.cpp checkout is needed: the file is written the way llama.cpp's `convert_hf_to_gguf.py` writes the
architecture MiniMind exports as (see `export.py`):

* MiniMind2 dense -> ``llama``: q/k rows permuted per head, because llama.cpp's `llama` applies RoPE to
  adjacent pairs while transformers (and MiniMind) rotate halves;
* MiniMind-3 dense -> ``qwen3`` and MiniMind-3 MoE -> ``qwen3moe`` (rotate-half RoPE, per-head q/k norms, experts
  stacked into one `[n_expert, out, in]` tensor per projection); no permutation.

Tokenizer: MiniMind's byte-level BPE with GPT-2's split regex is written as `gpt2` with pre-tokenizer `gpt-2`
(llama.cpp does not know MiniMind's pre-tokenizer hash; `gpt-2` tokenises identically), with its merges, special
tokens and chat template. 1-D tensors (norms) and the MoE router stay float32, as llama.cpp's converter keeps them.

Refused, because llama.cpp would compute other logits than MiniMind: MiniMind2 MoE (no such architecture), an
active YaRN (llama.cpp multiplies attention by its own YaRN factor 1 + 0.1 ln(factor), which MiniMind does not),
and a MoE without top-k renormalisation (llama.cpp's `qwen3moe` always renormalises).
"""

import json
import os
import tempfile
from pathlib import Path

import numpy as np
import torch

from ..errors import ExportError
from ..loading_utils import check_output_file
from ..models.minimind.configuration_minimind import MINIMIND2, MiniMindConfig
from ..models.minimind.modeling_minimind import MiniMindForCausalLM
from ..formats.export_native import _tmp_file

GGUF_TYPES = ("f32", "f16", "bf16", "q8_0")
_HF_FORMAT = {"llama": "llama", "qwen3": "qwen3", "qwen3moe": "qwen3_moe"}
GGUF_PRE_TOKENIZER = "gpt-2"


def _require_gguf():
    try:
        import gguf
    except ImportError as exc:
        raise ExportError("--format gguf needs ggml-org's gguf package: pip install 'minimind-trl[gguf]'") from exc
    return gguf


def gguf_architecture(config: MiniMindConfig) -> str:
    """`llama`, `qwen3` or `qwen3moe`, or an ExportError saying why llama.cpp would compute something else."""
    if config.minimind_generation == MINIMIND2 and config.use_moe:
        raise ExportError(
            "--format gguf: MiniMind2 MoE cannot be written as llama.cpp's llama or qwen3moe: it adds an always-on "
            "shared expert unweighted and has no per-head q/k RMSNorm. Possible: --format native (upstream "
            "MiniMind), or the Hugging Face folder as is (transformers)."
        )
    arch = "qwen3moe" if config.use_moe else ("llama" if config.minimind_generation == MINIMIND2 else "qwen3")
    if config.use_moe and config.n_shared_experts:
        raise ExportError(f"--format gguf: {config.n_shared_experts} shared experts; llama.cpp's qwen3moe has none")
    rope = config.rope_parameters
    rope_type = rope["rope_type"]
    if rope_type == "yarn" and not config.yarn_active:  # the table is not longer than the original: plain RoPE
        if float(rope.get("attention_factor") or 1.0) != 1.0:
            raise ExportError("--format gguf: an inactive YaRN with attention_factor != 1 has no GGUF equivalent")
        rope_type = "default"
    if rope_type not in ("default", "yarn"):
        raise ExportError(
            f"--format gguf: RoPE type {rope_type!r} is not written to GGUF (not verified against llama.cpp); "
            f"use --format {_HF_FORMAT[arch]} (transformers, vLLM) or native"
        )
    if rope_type == "yarn":
        raise ExportError(
            "--format gguf: this model uses YaRN (inference_rope_scaling). llama.cpp multiplies attention by its own "
            "YaRN factor 1 + 0.1*ln(factor) whatever the file says, which MiniMind does not, so the logits would "
            "differ (measured: max |diff| > 1). Export a copy without YaRN (convert with "
            "--set inference_rope_scaling=false; context up to original_max_position_embeddings) or serve the "
            "Hugging Face folder with transformers."
        )
    if config.use_moe and not config.norm_topk_prob:
        raise ExportError(
            "--format gguf: this MoE does not renormalise its top-k gate weights (norm_topk_prob=false); llama.cpp's "
            "qwen3moe always does, so the logits would differ. Use --format qwen3_moe (transformers, vLLM)."
        )
    return arch


def permute_for_llama(weight: torch.Tensor, n_head: int) -> torch.Tensor:
    """Rotate-half rows -> llama.cpp's adjacent-pair RoPE rows, per head (as `convert_hf_to_gguf.py` does)."""
    return weight.reshape(n_head, 2, weight.shape[0] // n_head // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def unpermute_for_llama(weight: torch.Tensor, n_head: int) -> torch.Tensor:
    """The inverse of `permute_for_llama` (for reading a GGUF back)."""
    return weight.reshape(n_head, weight.shape[0] // n_head // 2, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "mlp.gate.weight": "ffn_gate_inp.weight",
}
_EXPERT_NAMES = {"gate_proj": "ffn_gate_exps.weight", "up_proj": "ffn_up_exps.weight", "down_proj": "ffn_down_exps.weight"}


def gguf_tensors(model: MiniMindForCausalLM, arch: str) -> dict[str, torch.Tensor]:
    """GGUF tensor name -> float32 tensor (torch layout), every MiniMind weight exactly once."""
    config = model.config
    state = {key: value.detach().to("cpu", torch.float32) for key, value in model.state_dict().items()}
    out = {"token_embd.weight": state.pop("model.embed_tokens.weight"), "output_norm.weight": state.pop("model.norm.weight")}
    head = state.pop("lm_head.weight")
    if not config.tie_word_embeddings:
        out["output.weight"] = head  # tied: llama.cpp reads token_embd
    for layer in range(config.num_hidden_layers):
        prefix = f"model.layers.{layer}."
        for key in [k for k in state if k.startswith(prefix) and ".mlp.experts." not in k]:
            name = _LAYER_NAMES.get(key[len(prefix) :])
            if name is None:
                raise ExportError(f"--format gguf: no GGUF name for {key}")
            out[f"blk.{layer}.{name}"] = state.pop(key)
        if config.use_moe:
            for proj, name in _EXPERT_NAMES.items():
                keys = [f"{prefix}mlp.experts.{e}.{proj}.weight" for e in range(config.num_experts)]
                out[f"blk.{layer}.{name}"] = torch.stack([state.pop(key) for key in keys])
        if arch == "llama":
            q, k = f"blk.{layer}.attn_q.weight", f"blk.{layer}.attn_k.weight"
            out[q] = permute_for_llama(out[q], config.num_attention_heads)
            out[k] = permute_for_llama(out[k], config.num_key_value_heads)
    if state:
        raise ExportError(f"--format gguf: weights without a GGUF place: {sorted(state)[:6]}")
    return out


def _tokenizer_vocab(tokenizer, vocab_size: int, gguf) -> tuple[list[str], list[int]]:
    """Tokens by id and their types, the way llama.cpp's converter lists a GPT-2-style vocabulary."""
    vocab = tokenizer.get_vocab()
    if len(vocab) > vocab_size:
        raise ExportError(f"--format gguf: the tokenizer has {len(vocab)} tokens, the model only {vocab_size} embeddings")
    reverse = {index: token for token, index in vocab.items()}
    added = tokenizer.added_tokens_decoder
    tokens, types = [], []
    for index in range(vocab_size):
        if index not in reverse:
            tokens.append(f"[PAD{index}]")
            types.append(gguf.TokenType.UNUSED)
        elif index in added:
            tokens.append(reverse[index])
            special = added[index].special or (reverse[index].startswith("<|") and reverse[index].endswith("|>"))
            types.append(gguf.TokenType.CONTROL if special else gguf.TokenType.USER_DEFINED)
        else:
            tokens.append(reverse[index])
            types.append(gguf.TokenType.NORMAL)
    return tokens, types


def _check_gpt2_style(tokenizer_dir: Path) -> None:
    data = json.loads((tokenizer_dir / "tokenizer.json").read_text(encoding="utf-8"))
    pre, model = data.get("pre_tokenizer") or {}, data.get("model") or {}
    if model.get("type") != "BPE" or pre.get("type") != "ByteLevel" or not pre.get("use_regex", True) or data.get("normalizer"):
        raise ExportError(
            f"--format gguf: the tokenizer is not a byte-level BPE with GPT-2's split (model {model.get('type')}, "
            f"pre-tokenizer {pre.get('type')}, normalizer {data.get('normalizer')}); llama.cpp's '{GGUF_PRE_TOKENIZER}' "
            f"pre-tokenizer would split text differently"
        )


def _tensor_for(gguf, name: str, tensor: torch.Tensor, outtype: str):
    """(array, raw_dtype) as llama.cpp's converter stores it: 1-D and router tensors float32, others `outtype`."""
    array = tensor.numpy()
    if outtype == "f32" or tensor.ndim == 1 or name.endswith("ffn_gate_inp.weight"):
        return np.ascontiguousarray(array, dtype=np.float32), None
    if outtype == "f16":
        return np.ascontiguousarray(array, dtype=np.float16), None
    qtype = gguf.GGMLQuantizationType.BF16 if outtype == "bf16" else gguf.GGMLQuantizationType.Q8_0
    block = gguf.GGML_QUANT_SIZES[qtype][0]
    if array.shape[-1] % block:  # llama.cpp's converter falls back the same way
        return np.ascontiguousarray(array, dtype=np.float16), None
    return gguf.quants.quantize(np.ascontiguousarray(array, dtype=np.float32), qtype), qtype


def _is_gguf(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == b"GGUF"


def check_gguf_output(output_path: str | Path, force: bool) -> None:
    """The `.gguf` may be written: absent, or replaced with `force` only when it is a GGUF file."""
    check_output_file(output_path, force, _is_gguf, "GGUF", ExportError)


def export_gguf(
    model: MiniMindForCausalLM, output_path: str | Path, tokenizer, outtype: str = "f16", force: bool = False
) -> Path:
    """Write `model` and `tokenizer` as one GGUF file (atomically); returns its path."""
    gguf = _require_gguf()
    if outtype not in GGUF_TYPES:
        raise ExportError(f"--format gguf: unknown type {outtype!r}; choose one of {', '.join(GGUF_TYPES)}")
    if tokenizer is None:
        raise ExportError("--format gguf: no tokenizer given; a GGUF file carries its tokenizer (llama.cpp needs it)")
    output_path = Path(output_path).absolute()
    check_gguf_output(output_path, force)
    config = model.config
    arch = gguf_architecture(config)
    tensors = gguf_tensors(model, arch)
    tokens, types = _tokenizer_vocab(tokenizer, config.vocab_size, gguf)
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer.save_pretrained(tmp)  # the portable files llama.cpp's converter reads
        _check_gpt2_style(Path(tmp))
        special = gguf.SpecialVocab(tmp, load_merges=True, n_vocab=config.vocab_size)
    if not special.merges:
        raise ExportError("--format gguf: the tokenizer has no BPE merges")

    output_path.parent.mkdir(parents=True, exist_ok=True)
    tmp_file = _tmp_file(output_path)
    try:
        writer = gguf.GGUFWriter(str(tmp_file), arch)
        writer.add_name(f"MiniMind ({arch})")
        writer.add_file_type(
            {"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
             "bf16": gguf.LlamaFileType.MOSTLY_BF16, "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[outtype]
        )  # fmt: skip
        if outtype == "q8_0":
            writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
        writer.add_vocab_size(config.vocab_size)
        writer.add_context_length(config.max_position_embeddings)
        writer.add_embedding_length(config.hidden_size)
        writer.add_block_count(config.num_hidden_layers)
        writer.add_feed_forward_length(config.intermediate_size)
        writer.add_head_count(config.num_attention_heads)
        writer.add_head_count_kv(config.num_key_value_heads)
        writer.add_key_length(config.head_dim)
        writer.add_value_length(config.head_dim)
        writer.add_rope_dimension_count(config.head_dim)
        writer.add_rope_freq_base(float(config.rope_parameters["rope_theta"]))
        writer.add_layer_norm_rms_eps(float(config.rms_norm_eps))
        if config.use_moe:
            writer.add_expert_count(config.num_experts)
            writer.add_expert_used_count(config.num_experts_per_tok)
            writer.add_expert_feed_forward_length(config.moe_intermediate_size)
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre(GGUF_PRE_TOKENIZER)
        writer.add_token_list(tokens)
        writer.add_token_types(types)
        special.add_to_gguf(writer, quiet=True)
        if "bos" not in special.add_special_token:
            writer.add_add_bos_token(False)  # MiniMind's chat template writes <|im_start|> itself
        for name, tensor in tensors.items():
            array, raw_dtype = _tensor_for(gguf, name, tensor, outtype)
            writer.add_tensor(name, array, raw_dtype=raw_dtype)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.replace(tmp_file, output_path)
    except BaseException:
        tmp_file.unlink(missing_ok=True)
        raise
    return output_path


__all__ = [
    "GGUF_TYPES",
    "check_gguf_output",
    "export_gguf",
    "gguf_architecture",
    "gguf_tensors",
    "permute_for_llama",
    "unpermute_for_llama",
]
