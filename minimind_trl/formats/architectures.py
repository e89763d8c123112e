"""Which transformers architecture computes a MiniMind model, and its config: Llama (MiniMind2 dense), Qwen3
(MiniMind-3 dense) or Qwen3-MoE (MiniMind-3 MoE). MiniMind's tensor names already are those architectures' names, so
the config is the whole mapping: `minimind-trl export` writes it next to the weights, and vLLM (`minimind_trl.vllm_plugin`)
runs a MiniMind folder as the architecture it names.

Not expressible, so refused: MiniMind2 MoE (its always-on shared expert is added unweighted, which none of the three
has), MiniMind2 as Qwen3 and MiniMind-3 as Llama (q/k RMSNorm), and a YaRN that transformers computes with other
frequencies than upstream MiniMind. Light on purpose (torch, transformers and the model files only): vLLM's engine
processes import it.
"""

import torch
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from ..errors import ExportError
from ..models.minimind.configuration_minimind import MINIMIND2, MINIMIND3, MiniMindConfig
from ..models.minimind.modeling_minimind import MiniMindRotaryEmbedding

TARGET_FORMATS = {(MINIMIND2, False): "llama", (MINIMIND3, False): "qwen3", (MINIMIND3, True): "qwen3_moe"}
TARGET_CLASS_NAMES = {"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM"}


def target_format(config: MiniMindConfig) -> str | None:
    """The architecture a MiniMind variant is written as; None for MiniMind2 MoE, which has none."""
    return TARGET_FORMATS.get((config.minimind_generation, config.use_moe))


def _check_expressible(config: MiniMindConfig, fmt: str) -> None:
    generation, moe = config.minimind_generation, config.use_moe
    if generation == MINIMIND2 and moe:
        raise ExportError(
            f"--format {fmt}: MiniMind2 MoE cannot be written as Llama, Qwen3 or Qwen3-MoE: it adds an always-on "
            f"shared expert unweighted (none of them has one), has no per-head q/k RMSNorm (Qwen3/Qwen3-MoE always "
            f"apply one) and trains with a per-sequence balancing loss. Possible: --format native (upstream "
            f"MiniMind), or this Hugging Face folder as is (AutoModelForCausalLM with minimind-trl installed, or "
            f"trust_remote_code=True without it)."
        )
    right = TARGET_FORMATS[(generation, moe)]
    if fmt != right:
        why = {
            "llama": "MiniMind-3 normalises queries and keys per head (q_norm/k_norm); Llama has no such norm",
            "qwen3": "Qwen3 always applies a per-head q/k RMSNorm that MiniMind2 does not have"
            if generation == MINIMIND2
            else "this is a MoE model and Qwen3 is dense",
            "qwen3_moe": "this is a dense model"
            if moe is False
            else "Qwen3-MoE always applies a per-head q/k RMSNorm that MiniMind2 does not have",
        }[fmt]
        name = f"{'MiniMind2' if generation == MINIMIND2 else 'MiniMind-3'} {'MoE' if moe else 'dense'}"
        raise ExportError(f"--format {fmt}: {why}. {name} exports exactly as --format {right} (or native).")


def export_rope_parameters(config: MiniMindConfig) -> dict:
    """MiniMind's RoPE as transformers `rope_parameters`.

    MiniMind applies YaRN only when `max_position_embeddings / original_max_position_embeddings > 1`;
    transformers applies `rope_type="yarn"` unconditionally, so an inactive YaRN becomes plain RoPE.
    """
    rope = dict(config.rope_parameters)
    if rope["rope_type"] not in ("default", "yarn") or config.yarn_active:
        return rope  # other transformers types (checked by `check_rope_matches`) and an active YaRN: as they are
    if rope["rope_type"] == "yarn" and float(rope.get("attention_factor") or 1.0) != 1.0:
        raise ExportError(
            "YaRN with attention_factor != 1 that MiniMind does not apply to the frequencies (max_position_embeddings "
            "<= original_max_position_embeddings) has no transformers rope_parameters equivalent"
        )
    return {"rope_type": "default", "rope_theta": rope["rope_theta"]}


def check_rope_matches(config: MiniMindConfig, target_config, fmt: str) -> None:
    """Refuse a YaRN that transformers' `rope_type="yarn"` computes differently from MiniMind.

    Upstream caps YaRN's ramp at `head_dim // 2 - 1`, transformers at `head_dim - 1`; with a small head_dim or
    a low rope_theta the frequencies differ and the export would silently change the logits.
    """
    if target_config.rope_parameters["rope_type"] == "default":
        return
    ours, our_scaling = MiniMindRotaryEmbedding.compute_rope_parameters(config)
    theirs, their_scaling = ROPE_INIT_FUNCTIONS[target_config.rope_parameters["rope_type"]](target_config, None)
    if theirs.shape == ours.shape and torch.allclose(theirs, ours, rtol=1e-6, atol=0) and their_scaling == our_scaling:
        return
    worst = (theirs - ours).abs().div(ours).max().item() if theirs.shape == ours.shape else float("inf")
    raise ExportError(
        f"--format {fmt}: transformers' YaRN gives other RoPE frequencies than MiniMind's for head_dim="
        f"{config.head_dim}, rope_theta={config.rope_parameters['rope_theta']:g} (relative difference up to "
        f"{worst:.3g}, attention factor {their_scaling:g} vs {our_scaling:g}): upstream caps YaRN's ramp at "
        f"head_dim // 2 - 1, transformers at head_dim - 1, so the exported model would compute other logits. "
        f"Use --format native (upstream MiniMind), or this Hugging Face folder as is."
    )


def transformers_config(config: MiniMindConfig, fmt: str):
    """The transformers config (`LlamaConfig`, `Qwen3Config` or `Qwen3MoeConfig`) that computes what `config` does."""
    _check_expressible(config, fmt)
    target_config = _build_transformers_config(config, fmt)
    check_rope_matches(config, target_config, fmt)
    return target_config


def _build_transformers_config(config: MiniMindConfig, fmt: str):
    common = dict(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads,
        head_dim=config.head_dim,
        hidden_act=config.hidden_act,
        max_position_embeddings=config.max_position_embeddings,
        rms_norm_eps=config.rms_norm_eps,
        rope_parameters=export_rope_parameters(config),
        attention_bias=False,
        attention_dropout=config.attention_dropout,
        tie_word_embeddings=config.tie_word_embeddings,
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
        initializer_range=config.initializer_range,
    )
    if fmt == "llama":
        from transformers import LlamaConfig

        return LlamaConfig(mlp_bias=False, **common)
    if fmt == "qwen3":
        from transformers import Qwen3Config

        return Qwen3Config(use_sliding_window=False, **common)
    from transformers import Qwen3MoeConfig

    return Qwen3MoeConfig(
        use_sliding_window=False,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        num_experts=config.num_experts,
        num_experts_per_tok=config.num_experts_per_tok,
        moe_intermediate_size=config.moe_intermediate_size,
        norm_topk_prob=config.norm_topk_prob,
        router_aux_loss_coef=config.router_aux_loss_coef,
        **common,
    )


__all__ = [
    "TARGET_CLASS_NAMES",
    "TARGET_FORMATS",
    "check_rope_matches",
    "export_rope_parameters",
    "target_format",
    "transformers_config",
]
