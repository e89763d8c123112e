"""MiniMind as a transformers model: both upstream generations, dense and MoE.

Built the way transformers builds Llama/Qwen3 today, because TRL, PEFT, DeepSpeed and vLLM's
transformers backend rely on those conventions: attention through ``ALL_ATTENTION_FUNCTIONS``,
the ``Cache`` API, masks from ``create_causal_mask``, positions derived from the attention mask,
``logits_to_keep``, gradient checkpointing layers, tied embeddings declared in
``_tied_weights_keys`` and the stock ``GenerationMixin.generate``.

Parameter names equal upstream MiniMind's state-dict keys, so native checkpoints load strictly.
The MoE load-balancing loss travels on the outputs (``aux_loss``) of both the backbone and the
causal LM, so a trainer adds it from the same forward that computes its log-probs.

Like the configuration file and its siblings (``feed_forward_minimind``, ``shared_prefix_minimind``), this module
imports nothing from ``minimind_trl``, because ``save_pretrained`` ships it and the modules it imports relatively for
``trust_remote_code=True`` users.
"""

import math
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass

import torch
from torch import nn

import transformers
from packaging.version import Version

# This file ships in saved folders, where any transformers may load it: name the version it needs before an import
# of a newer API fails with a bare ImportError (4.x lacks `initialization`, 5.19 `slice_logits_to_keep`, ...).
if Version(transformers.__version__).release < (5, 24):
    raise ImportError(
        f"MiniMind's modeling code needs transformers>=5.24, found {transformers.__version__} (it uses the "
        f"transformers 5.24 cache, initialisation, experts and output-capturing APIs): pip install -U "
        f"'transformers>=5.24'. With an older transformers, load a `minimind-trl export --format llama/qwen3/qwen3_moe` "
        f"folder (no remote code)."
    )

from transformers import initialization as init
from transformers.cache_utils import Cache, DynamicCache
from transformers.generation import GenerationMixin
from transformers.masking_utils import create_causal_mask
from transformers.modeling_layers import GenericForQuestionAnswering, GenericForSequenceClassification
from transformers.modeling_layers import GenericForTokenClassification, GradientCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutputWithPast, MoeCausalLMOutputWithPast
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS, dynamic_rope_update
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, PreTrainedModel, slice_logits_to_keep
from transformers.processing_utils import Unpack
from transformers.utils import TransformersKwargs, can_return_tuple, logging
from transformers.utils.deprecation import deprecate_kwarg
from transformers.utils.generic import merge_with_config_defaults
from transformers.utils.output_capturing import OutputRecorder, capture_outputs

from .configuration_minimind import MiniMindConfig
from .feed_forward_minimind import MiniMindMLP, MiniMindSparseMoeBlock
from .shared_prefix_minimind import PrefixKeysValues, SharedPrefix

logger = logging.get_logger(__name__)
_CAPTURED = ("hidden_states", "attentions", "router_logits")  # per-layer outputs `capture_outputs` can record


@dataclass
class MiniMindModelOutputWithPast(BaseModelOutputWithPast):
    """Backbone output plus the summed MoE load-balancing loss (set for MoE models in training mode only) and, with
    `output_router_logits=True`, each MoE layer's gate logits."""

    aux_loss: torch.Tensor | None = None
    router_logits: tuple[torch.Tensor, ...] | None = None


def rms_norm(hidden_states: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """`weight * x * rsqrt(mean(x^2) + eps)` with fp32 statistics (also the decode kernel's norm)."""
    input_dtype = hidden_states.dtype
    hidden_states = hidden_states.to(torch.float32)
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    hidden_states = hidden_states * torch.rsqrt(variance + eps)
    return weight * hidden_states.to(input_dtype)


class MiniMindRMSNorm(nn.Module):
    """RMSNorm computed in fp32: `weight * x * rsqrt(mean(x^2) + eps)`."""

    def __init__(self, hidden_size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return rms_norm(hidden_states, self.weight, self.variance_epsilon)

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.variance_epsilon}"


def yarn_inv_freq(inv_freq: torch.Tensor, rope: dict, base: float) -> torch.Tensor:
    """Upstream MiniMind's YaRN: scale each frequency by `(1 - ramp) + ramp / factor`.

    Not transformers' `rope_type="yarn"`: upstream caps the ramp's upper bound at `dim // 2 - 1`
    (transformers at `dim - 1`) and divides by `max(high - low, 0.001)`, so small head_dim or low
    rope_theta give other frequencies than transformers would.
    """
    half = inv_freq.shape[0]
    dim = 2 * half
    orig_max, factor = rope["original_max_position_embeddings"], rope["factor"]

    def correction_dim(num_rotations: float) -> float:
        return dim * math.log(orig_max / (num_rotations * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(correction_dim(rope["beta_fast"])), 0)
    high = min(math.ceil(correction_dim(rope["beta_slow"])), half - 1)
    ramp = ((torch.arange(half, device=inv_freq.device).float() - low) / max(high - low, 0.001)).clamp(0, 1)
    return inv_freq * (1 - ramp + ramp / factor)


SUPPORTED_ROPE_TYPES = ("default", "yarn", "linear", "dynamic")


class MiniMindRotaryEmbedding(nn.Module):
    """Rotate-half RoPE for every `rope_type` MiniMind supports, read from `config.rope_parameters` when built.

    `default` and `yarn` are upstream MiniMind's arithmetic (YaRN exactly when upstream applies it: table longer than
    the original context). `linear` and `dynamic` are transformers' own (`ROPE_INIT_FUNCTIONS`, `dynamic_rope_update`).
    Any other type is refused here, so a `rope_parameters` set after the config was built is never ignored.
    """

    def __init__(self, config: MiniMindConfig):
        super().__init__()
        self.config = config
        self.rope_type = config.rope_parameters.get("rope_type", "default")
        self.max_seq_len_cached = self.original_max_seq_len = config.max_position_embeddings
        inv_freq, self.attention_scaling = self.compute_rope_parameters(config)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.register_buffer("original_inv_freq", inv_freq.clone(), persistent=False)

    @staticmethod
    def compute_rope_parameters(config: MiniMindConfig, device=None, seq_len=None, **kwargs) -> tuple[torch.Tensor, float]:
        rope = config.rope_parameters
        rope_type = rope.get("rope_type", "default")
        if rope_type not in SUPPORTED_ROPE_TYPES:
            raise ValueError(f"rope_parameters: rope type {rope_type!r} is not supported (MiniMind: {SUPPORTED_ROPE_TYPES})")
        if rope_type in ("linear", "dynamic"):
            return ROPE_INIT_FUNCTIONS[rope_type](config, device, seq_len=seq_len)
        base, dim = rope["rope_theta"], config.head_dim
        inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(device=device).float() / dim))
        if rope_type != "yarn":
            return inv_freq, 1.0
        # The constructor fills upstream's YaRN settings; a dict set afterwards in transformers' form may leave out
        # the original context (then `max_position_embeddings`, extended `factor` times) and the attention factor.
        rope = {"beta_fast": 32.0, "beta_slow": 1.0, **rope}
        table_length = config.max_position_embeddings
        if "original_max_position_embeddings" not in rope:
            rope["original_max_position_embeddings"] = table_length
            table_length = table_length * rope["factor"]
        if table_length / rope["original_max_position_embeddings"] > 1.0:
            inv_freq = yarn_inv_freq(inv_freq, rope, base)
        attention_factor = rope.get("attention_factor")
        if attention_factor is None:  # transformers' default
            attention_factor = 0.1 * math.log(rope["factor"]) + 1.0 if rope["factor"] > 1 else 1.0
        # upstream multiplies cos/sin by YaRN's attention factor even when the frequencies are left alone
        return inv_freq, float(attention_factor)

    compute_default_rope_parameters = compute_rope_parameters

    @torch.no_grad()
    @dynamic_rope_update  # recomputes `inv_freq` for rope_type="dynamic" only
    def forward(self, x: torch.Tensor, position_ids: torch.LongTensor) -> tuple[torch.Tensor, torch.Tensor]:
        inv_freq = self.inv_freq[None, :, None].float().expand(position_ids.shape[0], -1, 1).to(x.device)
        positions = position_ids[:, None, :].float()
        device_type = x.device.type if isinstance(x.device.type, str) and x.device.type != "mps" else "cpu"
        with torch.autocast(device_type=device_type, enabled=False):
            freqs = (inv_freq.float() @ positions.float()).transpose(1, 2)
            emb = torch.cat((freqs, freqs), dim=-1)
            cos = emb.cos() * self.attention_scaling
            sin = emb.sin() * self.attention_scaling
        return cos.to(dtype=x.dtype), sin.to(dtype=x.dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim: int = 1):
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    return (q * cos) + (rotate_half(q) * sin), (k * cos) + (rotate_half(k) * sin)


def repeat_kv(hidden_states: torch.Tensor, n_rep: int) -> torch.Tensor:
    """(batch, kv_heads, seq, dim) -> (batch, kv_heads * n_rep, seq, dim); each kv head serves n_rep query heads."""
    batch, num_key_value_heads, slen, head_dim = hidden_states.shape
    if n_rep == 1:
        return hidden_states
    hidden_states = hidden_states[:, :, None, :, :].expand(batch, num_key_value_heads, n_rep, slen, head_dim)
    return hidden_states.reshape(batch, num_key_value_heads * n_rep, slen, head_dim)


def eager_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    **kwargs: Unpack[TransformersKwargs],
):
    key_states = repeat_kv(key, module.num_key_value_groups)
    value_states = repeat_kv(value, module.num_key_value_groups)
    attn_weights = torch.matmul(query, key_states.transpose(2, 3)) * scaling
    if attention_mask is not None:
        attn_weights = attn_weights + attention_mask
    attn_weights = nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query.dtype)
    attn_weights = nn.functional.dropout(attn_weights, p=dropout, training=module.training)
    attn_output = torch.matmul(attn_weights, value_states)
    return attn_output.transpose(1, 2).contiguous(), attn_weights


def shared_additive_mask(config, mask: torch.Tensor | None) -> torch.Tensor | None:
    """A boolean SDPA mask as one additive fp32 mask (0 / -inf) for every layer, where attention is differentiated
    on CPU. torch's SDPA turns a boolean mask into exactly this inside every call and keeps that copy for the
    backward: one `[B, 1, L, L]` fp32 tensor per layer (4 x 21 MB for 16 x 578 tokens). Converted once, the layers
    share one, with the same values and so the same results. (There the query is fp32: `upcast_cpu_attention`.)"""
    if (
        isinstance(mask, torch.Tensor)
        and mask.dtype == torch.bool
        and mask.device.type == "cpu"
        and torch.is_grad_enabled()
        and config._attn_implementation == "sdpa"
    ):
        return torch.zeros(mask.shape, dtype=torch.float32).masked_fill_(mask.logical_not(), float("-inf"))
    return mask


def upcast_cpu_attention(config, query: torch.Tensor) -> bool:
    """Whether to run this attention in fp32: on CPU, torch's flash-attention *backward* in bf16/fp16 is ~2.5x slower
    than in fp32 (16 x 190 tokens: 79 vs 31 ms; benchmarks/README.md), so attention that will be differentiated
    runs in fp32 there. More precise than the half-precision call, never less; forwards without grad keep theirs."""
    half = query.dtype != torch.float32 or torch.is_autocast_enabled("cpu")
    return query.device.type == "cpu" and half and torch.is_grad_enabled() and config._attn_implementation == "sdpa"


class MiniMindAttention(nn.Module):
    """Grouped-query attention; MiniMind-3 adds per-head q/k RMSNorm before RoPE."""

    def __init__(self, config: MiniMindConfig, layer_idx: int):
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.head_dim = config.head_dim
        self.num_key_value_groups = config.num_attention_heads // config.num_key_value_heads
        self.scaling = self.head_dim**-0.5
        self.attention_dropout = config.attention_dropout
        self.is_causal = True
        self.q_proj = nn.Linear(config.hidden_size, config.num_attention_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, config.num_key_value_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, config.num_key_value_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(config.num_attention_heads * self.head_dim, config.hidden_size, bias=False)
        if config.use_qk_norm:
            self.q_norm = MiniMindRMSNorm(self.head_dim, eps=config.rms_norm_eps)
            self.k_norm = MiniMindRMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor | None,
        cache: Cache | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        input_shape = hidden_states.shape[:-1]
        hidden_shape = (*input_shape, -1, self.head_dim)

        query_states = self.q_proj(hidden_states).view(hidden_shape)
        key_states = self.k_proj(hidden_states).view(hidden_shape)
        value_states = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        if self.config.use_qk_norm:
            query_states, key_states = self.q_norm(query_states), self.k_norm(key_states)
        query_states, key_states = query_states.transpose(1, 2), key_states.transpose(1, 2)

        cos, sin = position_embeddings
        query_states, key_states = apply_rotary_pos_emb(query_states, key_states, cos, sin)

        if cache is not None:
            key_states, value_states = cache.update(key_states, value_states, self.layer_idx, kwargs=kwargs)
        shared_prefix = kwargs.pop("shared_prefix", None)
        if shared_prefix is not None:  # a prefix computed once for several rows (MiniMindModel's shared_prefix_length)
            key_states, value_states = shared_prefix(self.layer_idx, key_states, value_states)

        attention_interface: Callable = ALL_ATTENTION_FUNCTIONS.get_interface(
            self.config._attn_implementation, eager_attention_forward
        )
        output_dtype = value_states.dtype
        upcast = upcast_cpu_attention(self.config, query_states)
        if upcast:
            query_states, key_states, value_states = query_states.float(), key_states.float(), value_states.float()
            if attention_mask is not None and attention_mask.is_floating_point():
                attention_mask = attention_mask.float()
        with torch.autocast("cpu", enabled=False) if upcast else nullcontext():
            attn_output, attn_weights = attention_interface(
                self,
                query_states,
                key_states,
                value_states,
                attention_mask,
                dropout=0.0 if not self.training else self.attention_dropout,
                scaling=self.scaling,
                **kwargs,
            )
        if upcast:
            attn_output = attn_output.to(output_dtype)
        attn_output = attn_output.reshape(*input_shape, -1).contiguous()
        return self.resid_dropout(self.o_proj(attn_output)), attn_weights


class MiniMindDecoderLayer(GradientCheckpointingLayer):
    """Pre-norm block; returns `(hidden_states, routing)`, the MoE block's `routing_stats` (None for dense layers and
    in eval), so the load-balancing loss survives gradient checkpointing."""

    def __init__(self, config: MiniMindConfig, layer_idx: int):
        super().__init__()
        self.self_attn = MiniMindAttention(config, layer_idx)
        self.input_layernorm = MiniMindRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = MiniMindRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.mlp = MiniMindSparseMoeBlock(config) if config.use_moe else MiniMindMLP(config, config.intermediate_size)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache: Cache | None = None,
        use_cache: bool | None = False,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        residual = hidden_states
        hidden_states, _ = self.self_attn(
            hidden_states=self.input_layernorm(hidden_states),
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
            use_cache=use_cache,
            position_embeddings=position_embeddings,
            **kwargs,
        )
        hidden_states = residual + hidden_states

        residual = hidden_states
        hidden_states = self.mlp(self.post_attention_layernorm(hidden_states))
        routing = None
        if isinstance(hidden_states, tuple):
            hidden_states, routing = hidden_states
        return residual + hidden_states, routing


class MiniMindPreTrainedModel(PreTrainedModel):
    config: MiniMindConfig
    config_class = MiniMindConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["MiniMindDecoderLayer"]
    _supports_flash_attn = True
    _supports_sdpa = True
    _supports_flex_attn = True
    _supports_attention_backend = True
    _can_compile_fullgraph = True
    _can_record_outputs = {
        "hidden_states": MiniMindDecoderLayer,
        "attentions": MiniMindAttention,
        "router_logits": OutputRecorder(nn.Linear, layer_name="mlp.gate"),  # MoE layers' gates (none when dense)
    }

    def __init__(self, config: MiniMindConfig, *inputs, **kwargs):
        super().__init__(config, *inputs, **kwargs)
        self._can_compile_fullgraph = not config.use_moe  # expert dispatch has data-dependent shapes

    @classmethod
    def _can_set_experts_implementation(cls) -> bool:
        # transformers looks for `@use_experts_implementation` in this module's source; MiniMind's experts carry it in
        # feed_forward_minimind.py, so answer as transformers' own generic layer classes do
        return True

    def get_correct_experts_implementation(self, requested_experts: str | None) -> str:
        # transformers picks `grouped_mm` when none is asked for; MiniMind keeps upstream's expert loop (its exact
        # arithmetic) unless `experts_implementation` asks for another
        return super().get_correct_experts_implementation("eager" if requested_experts is None else requested_experts)

    # TRL reads and switches checkpointing by transformers' former names around every rollout; transformers 5 renamed
    # them (`*activation_checkpointing*`) and warns at each use of an old one: the same, without the warning
    @property
    def is_gradient_checkpointing(self) -> bool:
        return any(getattr(module, "gradient_checkpointing", False) for module in self.modules())

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs=None, **kwargs):
        self._activation_checkpointing_enable(gradient_checkpointing_kwargs, **kwargs)

    def gradient_checkpointing_disable(self):
        self._activation_checkpointing_disable()

    def save_pretrained(self, *args, **kwargs):
        # vLLM's transformers backend looks the backbone up through auto_map["AutoModel"]; transformers only
        # records the saved class (AutoModelForCausalLM), so name the backbone too when shipping remote code.
        if getattr(type(self), "_auto_class", None) is not None:
            self.config.auto_map = {**(getattr(self.config, "auto_map", None) or {}), "AutoModel": "modeling_minimind.MiniMindModel"}
        return super().save_pretrained(*args, **kwargs)

    def _init_weights(self, module):
        # non-persistent buffers are not in checkpoints; recompute them after meta-device loading (with MiniMind's
        # own RoPE: transformers' generic branch would compute its own YaRN)
        if isinstance(module, MiniMindRotaryEmbedding):
            inv_freq, _ = module.compute_rope_parameters(module.config, device=module.inv_freq.device)
            init.copy_(module.inv_freq, inv_freq)
            init.copy_(module.original_inv_freq, inv_freq)
            return
        super()._init_weights(module)


class MiniMindModel(MiniMindPreTrainedModel):
    # loading the backbone alone from a causal-LM checkpoint leaves its head behind
    _keys_to_ignore_on_load_unexpected = [r"^lm_head\."]

    def __init__(self, config: MiniMindConfig):
        super().__init__(config)
        self.vocab_size = config.vocab_size
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.dropout = nn.Dropout(config.dropout)
        self.layers = nn.ModuleList(
            [MiniMindDecoderLayer(config, layer_idx) for layer_idx in range(config.num_hidden_layers)]
        )
        self.norm = MiniMindRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = MiniMindRotaryEmbedding(config)
        self.gradient_checkpointing = False
        self.post_init()

    @merge_with_config_defaults
    @capture_outputs
    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        shared_prefix_length: int | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> MiniMindModelOutputWithPast:
        r"""
        shared_prefix_length (`int`, *optional*):
            Rows whose first `shared_prefix_length` token ids and attention-mask values are equal (GRPO's completions
            of one prompt) get that prefix computed once (`shared_prefix_minimind`); the outputs, `aux_loss` included,
            are the plain forward's up to summation order. Where it cannot apply (no two rows share their prefix, a
            cache, `use_cache`, `inputs_embeds`, explicit positions, dropout in training, reentrant checkpointing,
            per-layer outputs, attention other than sdpa/eager) the plain forward runs; the log says why, once.
        """
        if (input_ids is None) ^ (inputs_embeds is not None):
            raise ValueError("You must specify exactly one of input_ids or inputs_embeds")
        if shared_prefix_length:
            unsupported = self._unshareable_call(
                shared_prefix_length, input_ids, attention_mask, position_ids, cache, use_cache, kwargs
            )
            prefix = None if unsupported else SharedPrefix.find(input_ids, attention_mask, shared_prefix_length)
            if prefix is not None:
                return self._forward_shared_prefix(input_ids, attention_mask, prefix, **kwargs)
            reason = unsupported or "no two rows of a batch share their prefix ids and mask"
            logger.info_once(f"shared_prefix_length: prefixes computed row by row ({reason}); said once")
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)
        if use_cache and cache is None:
            cache = DynamicCache(config=self.config)
        if position_ids is None:
            position_ids = self._position_ids(inputs_embeds, attention_mask, cache)

        if not isinstance(causal_mask := attention_mask, dict):
            causal_mask = create_causal_mask(
                config=self.config,
                inputs_embeds=inputs_embeds,
                attention_mask=attention_mask,
                cache=cache,
                position_ids=position_ids,
            )
        else:
            causal_mask = causal_mask["full_attention"]
        hidden_states, routing = self._decoder_stack(
            self.dropout(inputs_embeds), causal_mask, position_ids, cache=cache, use_cache=use_cache, **kwargs
        )
        return MiniMindModelOutputWithPast(
            last_hidden_state=hidden_states,
            cache=cache if use_cache else None,
            aux_loss=self._aux_loss(routing, inputs_embeds.shape[1], hidden_states.device),
        )

    def _decoder_stack(self, hidden_states, causal_mask, position_ids, **kwargs):
        """The decoder layers and the final norm: the hidden states and each layer's MoE routing statistics."""
        causal_mask = shared_additive_mask(self.config, causal_mask)
        position_embeddings = self.rotary_emb(hidden_states, position_ids)
        routing = []
        for decoder_layer in self.layers[: self.config.num_hidden_layers]:
            hidden_states, layer_routing = decoder_layer(
                hidden_states,
                attention_mask=causal_mask,
                position_embeddings=position_embeddings,
                position_ids=position_ids,
                **kwargs,
            )
            routing.append(layer_routing)
        return self.norm(hidden_states), routing

    def _aux_loss(self, routing: list, seq_len: int, device) -> torch.Tensor | None:
        """The MoE load-balancing loss of rows of `seq_len` tokens, summed over the layers. Like Mixtral/Qwen3-MoE,
        none unless there is one to train: upstream's is 0 for dense models and in eval."""
        if not (self.config.use_moe and self.training):
            return None
        aux_loss = torch.zeros((), dtype=torch.float32, device=device)
        for layer, layer_routing in zip(self.layers, routing):
            if layer_routing is not None:
                aux_loss = aux_loss + layer.mlp.load_balancing_loss(layer_routing, seq_len)
        return aux_loss

    def _unshareable_call(self, length, input_ids, attention_mask, position_ids, cache, use_cache, kwargs):
        """Why a call asking for `shared_prefix_length` runs the plain forward instead (a string), or None."""
        config = self.config
        reentrant = [
            layer._gradient_checkpointing_func
            for layer in self.layers
            if layer.gradient_checkpointing and self.training and torch.is_grad_enabled()
        ]
        if input_ids is None or attention_mask is None or attention_mask.ndim != 2:
            return "it needs input_ids and a 2D attention mask"
        if not 0 < length < input_ids.shape[1]:
            return f"a prefix of {length} tokens leaves no suffix in rows of {input_ids.shape[1]}"
        if cache is not None or use_cache or position_ids is not None:
            return "not with a cache, use_cache or explicit position_ids"
        if config._attn_implementation not in ("sdpa", "eager"):
            return f"attention {config._attn_implementation!r}: sdpa and eager only"
        if config._attn_implementation == "eager" and config.use_moe and self.training:
            if not attention_mask[:, :length].all():  # eager's padded queries attend evenly to every key of the pass
                return "eager attention: left padding's routing, which the MoE loss counts, depends on the rows' ends"
        if self.training and (config.dropout or config.attention_dropout):
            return "dropout in training would draw one mask per prefix instead of one per row"
        if any(getattr(func, "keywords", {}).get("use_reentrant", True) for func in reentrant):
            return "reentrant activation checkpointing would not differentiate the prefix's keys and values"
        if any(kwargs.get(f"output_{k}", getattr(config, f"output_{k}", False)) for k in _CAPTURED):
            return "per-layer outputs (hidden states, attentions, router logits) were asked for"
        return None

    def _forward_shared_prefix(self, input_ids, attention_mask, prefix: SharedPrefix, **kwargs):
        """The prefix pass over one row per distinct prefix, then the rest of every row attending to its prefix's
        keys and values. Masks and positions are the plain forward's, cut to each pass."""
        length, (count, total) = prefix.length, input_ids.shape
        weight = self.embed_tokens.weight
        position_ids = self._position_ids(input_ids, attention_mask, None)
        causal_mask = create_causal_mask(
            config=self.config,
            inputs_embeds=weight.new_empty(()).expand(count, total, weight.shape[1]),  # shape and dtype only
            attention_mask=attention_mask,
            cache=None,
            position_ids=position_ids,
            allow_is_causal_skip=False,
        )
        kwargs["use_cache"] = False
        rows = prefix.rows
        keys_values = PrefixKeysValues(prefix)
        prefix_states, prefix_routing = self._decoder_stack(
            self.embed_tokens(input_ids[rows, :length]),
            causal_mask[rows, :, :length, :length],
            position_ids[rows, :length],
            shared_prefix=keys_values,
            **kwargs,
        )
        suffix_states, suffix_routing = self._decoder_stack(
            self.embed_tokens(input_ids[:, length:]),
            causal_mask[:, :, length:, :],
            position_ids[:, length:],
            shared_prefix=keys_values.reader(),
            **kwargs,
        )
        routing = [
            None if p is None else prefix.per_row(p) + s for p, s in zip(prefix_routing, suffix_routing, strict=True)
        ]
        return MiniMindModelOutputWithPast(
            last_hidden_state=torch.cat([prefix.per_row(prefix_states), suffix_states], dim=1),
            aux_loss=self._aux_loss(routing, total, suffix_states.device),
        )

    @staticmethod
    def _position_ids(inputs_embeds, attention_mask, cache) -> torch.LongTensor:
        """Positions count real tokens only, so a left-padded row sees the positions it would see alone."""
        seq_len = inputs_embeds.shape[1]
        past_seen = cache.get_seq_length() if cache is not None else 0
        if attention_mask is not None and attention_mask.ndim == 2 and attention_mask.shape[1] == past_seen + seq_len:
            position_ids = attention_mask.long().cumsum(-1) - 1
            position_ids = position_ids.masked_fill(attention_mask == 0, 0)
            return position_ids[:, -seq_len:]
        position_ids = torch.arange(past_seen, past_seen + seq_len, device=inputs_embeds.device)
        return position_ids.unsqueeze(0).expand(inputs_embeds.shape[0], -1)


class MiniMindForCausalLM(MiniMindPreTrainedModel, GenerationMixin):
    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
    _tp_plan = {"lm_head": "colwise_gather_output"}
    _pp_plan = {"lm_head": (["hidden_states"], ["logits"])}

    def __init__(self, config: MiniMindConfig):
        super().__init__(config)
        self.model = MiniMindModel(config)
        self.vocab_size = config.vocab_size
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        **kwargs: Unpack[TransformersKwargs],
    ) -> MoeCausalLMOutputWithPast:
        r"""
        `aux_loss` is the summed MoE load-balancing loss of this forward: a tensor for MoE models in training mode,
        `None` otherwise (dense models and eval mode, where upstream's loss is 0).
        As upstream, it is *not* added to `loss`; trainers add it with their own weight.
        """
        outputs: MiniMindModelOutputWithPast = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            **kwargs,
        )
        hidden_states = slice_logits_to_keep(outputs.last_hidden_state, logits_to_keep)
        logits = self.lm_head(hidden_states)
        loss = None
        if labels is not None:
            loss = self.loss_function(logits=logits, labels=labels, vocab_size=self.config.vocab_size, **kwargs)
        return MoeCausalLMOutputWithPast(
            loss=loss,
            aux_loss=outputs.aux_loss,
            logits=logits,
            cache=outputs.cache,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
            router_logits=outputs.router_logits,
        )


# The heads in-tree LMs get from transformers' generic classes (TRL's RewardTrainer and value models load
# `AutoModelForSequenceClassification`). The generic `__init__`s build the backbone with `AutoModel.from_config`,
# which a folder loaded with `trust_remote_code` cannot resolve, so these build `MiniMindModel` directly.


class MiniMindForSequenceClassification(GenericForSequenceClassification, MiniMindPreTrainedModel):
    def __init__(self, config: MiniMindConfig):
        MiniMindPreTrainedModel.__init__(self, config)
        self.num_labels = config.num_labels
        self.model = MiniMindModel(config)
        self.score = nn.Linear(config.hidden_size, self.num_labels, bias=False)
        self.post_init()


class MiniMindForTokenClassification(GenericForTokenClassification, MiniMindPreTrainedModel):
    def __init__(self, config: MiniMindConfig):
        MiniMindPreTrainedModel.__init__(self, config)
        self.num_labels = config.num_labels
        self.model = MiniMindModel(config)
        dropout = getattr(config, "classifier_dropout", None)
        self.dropout = nn.Dropout(0.1 if dropout is None else dropout)
        self.score = nn.Linear(config.hidden_size, config.num_labels, bias=getattr(config, "token_classification_bias", True))
        self.post_init()


class MiniMindForQuestionAnswering(GenericForQuestionAnswering, MiniMindPreTrainedModel):
    def __init__(self, config: MiniMindConfig):
        MiniMindPreTrainedModel.__init__(self, config)
        self.model = MiniMindModel(config)
        self.qa_outputs = nn.Linear(config.hidden_size, 2)
        self.post_init()


__all__ = [
    "MiniMindPreTrainedModel",
    "MiniMindModel",
    "MiniMindForCausalLM",
    "MiniMindForSequenceClassification",
    "MiniMindForTokenClassification",
    "MiniMindForQuestionAnswering",
    "MiniMindModelOutputWithPast",
]
