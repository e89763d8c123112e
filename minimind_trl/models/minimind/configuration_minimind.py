"""MiniMind configuration covering both upstream architectures (one per upstream generation).

MiniMind (jingyaogong/minimind) shipped two incompatible model definitions under the same
`model_type="minimind"`:

* ``"minimind2"`` (2025, upstream commit fea69cf): Llama-shaped; MoE with a softmax gate, top-2,
  shared experts and a sequence-level auxiliary loss (``aux_loss_alpha``, ``seq_aux``).
* ``"minimind3"`` (2026): Qwen3-shaped; per-head q/k RMSNorm, explicit ``head_dim``, MoE with top-1
  routing, no shared expert and ``router_aux_loss_coef``.

One config class describes both; ``minimind_generation`` selects the architecture and every
architecture-dependent default (norm eps, MLP width, MoE routing) follows upstream for that architecture (the key
keeps its name: configs saved with it load everywhere). Upstream keyword names of either architecture are accepted (``n_routed_experts`` and ``aux_loss_alpha``
are MiniMind2's names for ``num_experts`` and ``router_aux_loss_coef``).

This file must stay importable on its own (no ``minimind_trl`` imports): ``save_pretrained`` copies
it next to the weights for users who load with ``trust_remote_code=True`` without this package.
"""

import math

from transformers import PretrainedConfig

MINIMIND2 = "minimind2"
MINIMIND3 = "minimind3"
MODEL_ARCHITECTURES = (MINIMIND2, MINIMIND3)  # the two architectures (their GRPO records: minimind_trl.generations)

# Upstream's YaRN settings for `inference_rope_scaling=True` (identical in both architectures).
UPSTREAM_YARN = {
    "rope_type": "yarn",
    "factor": 16.0,
    "original_max_position_embeddings": 2048,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "attention_factor": 1.0,
}

# Generation-dependent upstream defaults (for arguments left as None).
_DEFAULTS = {
    MINIMIND2: {
        "hidden_size": 512,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-5,
        "num_experts_per_tok": 2,
        "n_shared_experts": 1,
        "router_aux_loss_coef": 0.01,
    },
    MINIMIND3: {
        "hidden_size": 768,
        "num_key_value_heads": 4,
        "rms_norm_eps": 1e-6,
        "num_experts_per_tok": 1,
        "n_shared_experts": 0,
        "router_aux_loss_coef": 5e-4,
    },
}


def default_intermediate_size(hidden_size: int, generation: str) -> int:
    """Upstream's MLP width: 8/3*H rounded up to 64 (MiniMind2), pi*H rounded up to 64 (MiniMind-3)."""
    if generation == MINIMIND2:
        return 64 * ((int(hidden_size * 8 / 3) + 63) // 64)
    return math.ceil(hidden_size * math.pi / 64) * 64


class MiniMindConfig(PretrainedConfig):
    r"""Configuration of a MiniMind causal LM.

    Args:
        minimind_generation (`str`, defaults to `"minimind2"`): `"minimind2"` or `"minimind3"` (see module doc).
        vocab_size (`int`, defaults to 6400): MiniMind's tokenizer size.
        hidden_size (`int`, *optional*): model width (upstream default 512 for MiniMind2, 768 for MiniMind-3).
        intermediate_size (`int`, *optional*): SwiGLU width; upstream's formula of the generation when None.
        num_hidden_layers (`int`, defaults to 8): decoder layers.
        num_attention_heads (`int`, defaults to 8): query heads.
        num_key_value_heads (`int`, *optional*): key/value heads (GQA); 2 (MiniMind2) or 4 (MiniMind-3) when None.
        head_dim (`int`, *optional*): per-head width; `hidden_size // num_attention_heads` when None
            (MiniMind2 always uses that value).
        hidden_act (`str`, defaults to `"silu"`): MLP activation.
        max_position_embeddings (`int`, defaults to 32768): RoPE table length; also decides whether YaRN applies.
        rms_norm_eps (`float`, *optional*): 1e-5 (MiniMind2) or 1e-6 (MiniMind-3) when None.
        rope_theta (`float`, *optional*): RoPE base (1e6); stored in `rope_parameters["rope_theta"]`.
        inference_rope_scaling (`bool`, defaults to False): upstream's switch for YaRN (factor 16 from 2048).
        rope_scaling (`dict`, *optional*): upstream's explicit YaRN dict (`"type": "yarn"`); wins over
            `inference_rope_scaling`.
        rope_parameters (`dict`, *optional*): transformers-5 form of the two above (`rope_type` "default",
            "yarn" (upstream's YaRN arithmetic), or transformers' "linear" / "dynamic" with a `factor`; `rope_theta`);
            what `save_pretrained` writes and what wins when given.
        dropout (`float`, defaults to 0.0): embedding, attention and residual dropout (upstream's single knob).
        flash_attn (`bool`, defaults to True): kept for round trips to upstream configs; the attention kernel is
            chosen by transformers' `attn_implementation` instead.
        use_moe (`bool`, defaults to False): replace every MLP with a mixture of experts.
        num_experts (`int`, defaults to 4): routed experts (MiniMind2 name: `n_routed_experts`).
        num_experts_per_tok (`int`, *optional*): experts per token; 2 (MiniMind2) or 1 (MiniMind-3) when None.
        n_shared_experts (`int`, *optional*): always-on experts added unweighted (MiniMind2 only; 1 by default).
        moe_intermediate_size (`int`, *optional*): expert width; `intermediate_size` when None.
        norm_topk_prob (`bool`, defaults to True): renormalise the selected gate weights to sum to one.
        scoring_func (`str`, defaults to `"softmax"`): gate scoring (upstream supports softmax only).
        router_aux_loss_coef (`float`, *optional*): load-balancing loss weight (MiniMind2 name: `aux_loss_alpha`);
            0.01 (MiniMind2) or 5e-4 (MiniMind-3) when None.
        seq_aux (`bool`, defaults to True): MiniMind2's per-sequence balancing loss (token-level when False).
        tie_word_embeddings (`bool`, defaults to True): share `lm_head` with the token embedding.
        initializer_range (`float`, defaults to 0.02): std of the normal init for fresh models.
    """

    model_type = "minimind"
    keys_to_ignore_at_inference = ["past_key_values", "cache"]
    # the backbone's pipeline-parallel plan, as Llama/Qwen3 declare it; the tensor-parallel plan depends on the
    # generation (q/k norms) and on MoE, so `__init__` builds it (`_tp_plan`)
    base_model_pp_plan = {
        "embed_tokens": (["input_ids"], ["inputs_embeds"]),
        "layers": (["hidden_states", "attention_mask"], ["hidden_states"]),
        "norm": (["hidden_states"], ["hidden_states"]),
    }
    attribute_map = {"n_routed_experts": "num_experts", "aux_loss_alpha": "router_aux_loss_coef"}

    def __init__(
        self,
        minimind_generation: str = MINIMIND2,
        vocab_size: int = 6400,
        hidden_size: int | None = None,
        intermediate_size: int | None = None,
        num_hidden_layers: int = 8,
        num_attention_heads: int = 8,
        num_key_value_heads: int | None = None,
        head_dim: int | None = None,
        hidden_act: str = "silu",
        max_position_embeddings: int = 32768,
        rms_norm_eps: float | None = None,
        rope_theta: float | None = None,
        inference_rope_scaling: bool = False,
        rope_scaling: dict | None = None,
        rope_parameters: dict | None = None,
        dropout: float = 0.0,
        flash_attn: bool = True,
        use_moe: bool = False,
        num_experts: int | None = None,
        num_experts_per_tok: int | None = None,
        n_shared_experts: int | None = None,
        moe_intermediate_size: int | None = None,
        norm_topk_prob: bool = True,
        scoring_func: str = "softmax",
        router_aux_loss_coef: float | None = None,
        seq_aux: bool = True,
        tie_word_embeddings: bool = True,
        initializer_range: float = 0.02,
        use_cache: bool = True,
        bos_token_id: int = 1,
        eos_token_id: int = 2,
        pad_token_id: int | None = 0,
        **kwargs,
    ):
        # MiniMind2 spelled two MoE fields differently; accept them as aliases.
        n_routed_experts = kwargs.pop("n_routed_experts", None)
        aux_loss_alpha = kwargs.pop("aux_loss_alpha", None)
        if num_experts is None:
            num_experts = n_routed_experts if n_routed_experts is not None else 4
        if router_aux_loss_coef is None:
            router_aux_loss_coef = aux_loss_alpha
        # Written by older exports of this config; derived below.
        kwargs.pop("use_qk_norm", None)
        # TRL's SFTTrainer stamps Mixtral's `output_router_logits` onto any config with a `router_aux_loss_coef`;
        # MiniMind has no router-logits output (its loss travels as `aux_loss`), so a saved flag is dropped here.
        kwargs.pop("output_router_logits", None)

        if minimind_generation not in MODEL_ARCHITECTURES:
            raise ValueError(f"minimind_generation must be one of {MODEL_ARCHITECTURES}, got {minimind_generation!r}")
        defaults = _DEFAULTS[minimind_generation]
        hidden_size = defaults["hidden_size"] if hidden_size is None else hidden_size
        if minimind_generation == MINIMIND2 and head_dim not in (None, hidden_size // num_attention_heads):
            raise ValueError(
                f"MiniMind2 derives head_dim from hidden_size // num_attention_heads "
                f"({hidden_size // num_attention_heads}); head_dim={head_dim} needs minimind_generation='minimind3'"
            )
        if scoring_func != "softmax":
            raise ValueError(f"scoring_func={scoring_func!r} is not supported (upstream MiniMind only has 'softmax')")

        self.minimind_generation = minimind_generation
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = (
            default_intermediate_size(hidden_size, minimind_generation) if intermediate_size is None else intermediate_size
        )
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = defaults["num_key_value_heads"] if num_key_value_heads is None else num_key_value_heads
        self.head_dim = hidden_size // num_attention_heads if head_dim is None else head_dim
        if num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )
        self.hidden_act = hidden_act
        self.max_position_embeddings = max_position_embeddings
        self.rms_norm_eps = defaults["rms_norm_eps"] if rms_norm_eps is None else rms_norm_eps
        self.rope_parameters = _rope_parameters(rope_parameters, rope_scaling, rope_theta, inference_rope_scaling)
        self.inference_rope_scaling = self.rope_parameters["rope_type"] == "yarn"
        self.dropout = dropout
        self.attention_dropout = dropout
        self.flash_attn = flash_attn
        self.use_moe = use_moe
        self.num_experts = num_experts
        self.num_experts_per_tok = (
            defaults["num_experts_per_tok"] if num_experts_per_tok is None else num_experts_per_tok
        )
        if n_shared_experts is None:
            n_shared_experts = defaults["n_shared_experts"]
        if minimind_generation == MINIMIND3 and n_shared_experts:
            raise ValueError("MiniMind-3 has no shared experts; n_shared_experts must be 0")
        self.n_shared_experts = n_shared_experts
        self.moe_intermediate_size = self.intermediate_size if moe_intermediate_size is None else moe_intermediate_size
        self.norm_topk_prob = norm_topk_prob
        self.scoring_func = scoring_func
        self.router_aux_loss_coef = (
            defaults["router_aux_loss_coef"] if router_aux_loss_coef is None else router_aux_loss_coef
        )
        self.seq_aux = seq_aux
        self.initializer_range = initializer_range
        self.use_cache = use_cache
        self.base_model_tp_plan = _tp_plan(self.minimind_generation, self.use_moe, self.n_shared_experts)
        if self.use_moe and self.num_experts_per_tok > self.num_experts:
            raise ValueError(
                f"num_experts_per_tok ({self.num_experts_per_tok}) exceeds num_experts ({self.num_experts})"
            )
        super().__init__(
            bos_token_id=bos_token_id,
            eos_token_id=eos_token_id,
            pad_token_id=pad_token_id,
            tie_word_embeddings=tie_word_embeddings,
            **kwargs,
        )

    @classmethod
    def from_dict(cls, config_dict: dict, **kwargs):
        """Configs written by upstream MiniMind carry no `minimind_generation`; tell the generations apart by the
        keys each one writes, so an upstream MiniMind-3 folder is not read as MiniMind2."""
        if "minimind_generation" not in config_dict and "minimind_generation" not in kwargs:
            config_dict = {**config_dict, "minimind_generation": infer_generation_from_keys(config_dict)}
        return super().from_dict(config_dict, **kwargs)

    @property
    def use_qk_norm(self) -> bool:
        """MiniMind-3 normalises queries and keys per head before RoPE."""
        return self.minimind_generation == MINIMIND3

    @property
    def yarn_active(self) -> bool:
        """Upstream applies YaRN only when the RoPE table is longer than the original context."""
        if self.rope_parameters["rope_type"] != "yarn":
            return False
        original = self.rope_parameters.get("original_max_position_embeddings")
        if original is None:  # transformers' form: the table is the original context, extended `factor` times
            return self.rope_parameters["factor"] > 1.0
        return self.max_position_embeddings / original > 1.0


def _tp_plan(generation: str, use_moe: bool, n_shared_experts: int) -> dict:
    """The backbone's tensor-parallel plan (Llama/Qwen3's), naming only modules this variant has. With it the tied
    `embed_tokens` is sharded together with the head's `lm_head` plan."""
    plan = {f"layers.*.self_attn.{name}": "colwise" for name in ("q_proj", "k_proj", "v_proj")}
    if generation == MINIMIND3:
        plan.update({f"layers.*.self_attn.{name}": "replicated_with_grad_allreduce" for name in ("q_norm", "k_norm")})
    plan["layers.*.self_attn.o_proj"] = "rowwise"
    mlps = ["layers.*.mlp"] if not use_moe else ["layers.*.mlp.experts.*"] + (["layers.*.mlp.shared_experts.*"] if n_shared_experts else [])
    for mlp in mlps:
        plan.update({f"{mlp}.gate_proj": "colwise", f"{mlp}.up_proj": "colwise", f"{mlp}.down_proj": "rowwise"})
    return plan


# keys only one generation's upstream `MiniMindConfig` writes
_MINIMIND2_ONLY_KEYS = ("n_routed_experts", "aux_loss_alpha", "seq_aux", "n_shared_experts", "scoring_func")
_MINIMIND3_ONLY_KEYS = ("num_experts", "router_aux_loss_coef", "moe_intermediate_size", "head_dim")


def infer_generation_from_keys(config_dict: dict) -> str:
    """The MiniMind generation of an upstream config dict, from the field names only that generation uses."""
    has_v2 = [key for key in _MINIMIND2_ONLY_KEYS if key in config_dict]
    has_v3 = [key for key in _MINIMIND3_ONLY_KEYS if key in config_dict]
    if has_v2 and has_v3:
        raise ValueError(
            f"config mixes MiniMind2 keys {has_v2} and MiniMind-3 keys {has_v3}; set `minimind_generation` explicitly"
        )
    return MINIMIND3 if has_v3 else MINIMIND2


def _rope_parameters(rope_parameters, rope_scaling, rope_theta, inference_rope_scaling) -> dict:
    """Normalise upstream's (`rope_theta`, `inference_rope_scaling`, `rope_scaling`) to `rope_parameters`."""
    from_rope_parameters = rope_parameters is not None
    if rope_parameters is None:
        if rope_scaling is None and inference_rope_scaling:
            rope_scaling = UPSTREAM_YARN
        rope_parameters = dict(rope_scaling) if rope_scaling is not None else {"rope_type": "default"}
    else:
        rope_parameters = dict(rope_parameters)
    # upstream spells the key "type"; transformers spells it "rope_type"
    rope_type = rope_parameters.pop("type", None) or rope_parameters.get("rope_type") or "default"
    # upstream's `rope_scaling` is always YaRN (its code reads YaRN's fields whatever the type); transformers'
    # `rope_parameters` may also ask for its own linear or dynamic-NTK scaling
    supported = ("default", "yarn", "linear", "dynamic") if from_rope_parameters else ("default", "yarn")
    if rope_type not in supported:
        raise ValueError(
            f"rope type {rope_type!r} is not supported (MiniMind: 'default', 'yarn', or transformers' 'linear'/'dynamic'"
            " in rope_parameters)"
        )
    if rope_type in ("linear", "dynamic") and not isinstance(rope_parameters.get("factor"), (int, float)):
        raise ValueError(f"rope type {rope_type!r} needs a numeric `factor` in rope_parameters")
    rope_parameters["rope_type"] = rope_type
    if rope_theta is not None:
        rope_parameters["rope_theta"] = float(rope_theta)
    rope_parameters.setdefault("rope_theta", 1e6)
    if rope_type == "yarn":
        for key, value in UPSTREAM_YARN.items():
            rope_parameters.setdefault(key, value)
    return rope_parameters


__all__ = ["MiniMindConfig", "MINIMIND2", "MINIMIND3", "MODEL_ARCHITECTURES", "UPSTREAM_YARN", "default_intermediate_size", "infer_generation_from_keys"]
