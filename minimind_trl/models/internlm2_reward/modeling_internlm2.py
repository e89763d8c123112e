"""A native InternLM2 reward model: loads the published `internlm/internlm2-1_8b-reward` checkpoint without
`trust_remote_code`.

Why: MiniMind's GRPO scores completions with `internlm2-1_8b-reward`, whose published modelling code is
remote code written for transformers 4.x. On transformers 5 (which TRL 1.16 needs) it breaks, and one
reported failure is silent: its RoPE `inv_freq` is a non-persistent buffer that transformers 5 materialises
from the meta device without recomputing it (the class is not one transformers knows to re-initialise), so
the rotary angles come up as zeros and every score is wrong. The loader below rebuilds that buffer.

This module re-implements the architecture on transformers' own pieces (Llama's RMSNorm, rotary embedding
with transformers' RoPE-scaling functions, `apply_rotary_pos_emb`, the attention-function registry and
causal masks) with the *published parameter names*, so the checkpoint loads as is:

    model.tok_embeddings.weight                      [vocab, hidden]
    model.layers.N.attention_norm.weight             [hidden]
    model.layers.N.attention.wqkv.weight             [(heads + 2 * kv_heads) * head_dim, hidden]
    model.layers.N.attention.wo.weight               [hidden, heads * head_dim]
    model.layers.N.ffn_norm.weight                   [hidden]
    model.layers.N.feed_forward.w1/w3.weight         [intermediate, hidden]   (gate / up)
    model.layers.N.feed_forward.w2.weight            [hidden, intermediate]   (down)
    model.norm.weight                                [hidden]
    v_head.weight                                    [1, hidden]

`wqkv` is packed per key/value head: for each of the `kv_heads` groups, its `heads // kv_heads` query heads,
then its key head, then its value head (`head_dim` rows each). Query head `g * group + i` belongs to
key/value head `g`, which is the order transformers' `repeat_kv` assumes.

The reward is `v_head` applied to the final hidden state at the last real (attention-mask 1) position, which
callers fill with the reward token (`config.reward_token_id`, `<|reward|>` = 92527 in the published model).
Loading is strict: a missing, unexpected or mis-shaped tensor is an error that names it.

RoPE: the published config has `rope_scaling: null` (plain RoPE, theta 1e6, 32768 positions). The remote code
also knew `{"type": "linear" | "dynamic", "factor": f}`; both are supported here through transformers' RoPE
functions. One deliberate difference: the remote "dynamic" variant kept its enlarged base after one long input
(a sticky buffer), transformers' resets it for shorter inputs.
"""

from collections.abc import Mapping

import torch
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel
from transformers.activations import ACT2FN
from transformers.masking_utils import create_causal_mask
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutputWithPast, SequenceClassifierOutputWithPast
from transformers.models.llama.modeling_llama import (
    LlamaRMSNorm,
    LlamaRotaryEmbedding,
    apply_rotary_pos_emb,
    eager_attention_forward,
)
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS


SUPPORTED_ROPE_TYPES = ("default", "linear", "dynamic")


class InternLM2RewardConfig(PretrainedConfig):
    r"""Configuration of an InternLM2 reward model; the defaults are `internlm/internlm2-1_8b-reward`'s.

    Args:
        vocab_size (`int`, defaults to 92544): tokenizer size.
        hidden_size (`int`, defaults to 2048): model width.
        intermediate_size (`int`, defaults to 8192): SwiGLU width (`w1`/`w3` rows).
        num_hidden_layers (`int`, defaults to 24): decoder layers.
        num_attention_heads (`int`, defaults to 16): query heads.
        num_key_value_heads (`int`, defaults to 8): key/value heads (GQA), also the packing groups of `wqkv`.
        hidden_act (`str`, defaults to `"silu"`): MLP activation.
        max_position_embeddings (`int`, defaults to 32768): RoPE length (where dynamic NTK scaling starts).
        rms_norm_eps (`float`, defaults to 1e-5): RMSNorm epsilon.
        rope_theta (`float`, defaults to 1e6): RoPE base.
        rope_scaling (`dict`, *optional*): the published spelling `{"type": "linear" | "dynamic", "factor": f}`;
            None (the published value) means plain RoPE. Stored as transformers' `rope_parameters`.
        bias (`bool`, defaults to False): biases on `wqkv` and `wo` (the published model has none).
        reward_token_id (`int`, defaults to 92527): the token whose final hidden state is scored (`<|reward|>`).
        initializer_range (`float`, defaults to 0.02): std of the normal init for fresh (test) models.
    """

    model_type = "internlm2"

    def __init__(
        self,
        vocab_size: int = 92544,
        hidden_size: int = 2048,
        intermediate_size: int = 8192,
        num_hidden_layers: int = 24,
        num_attention_heads: int = 16,
        num_key_value_heads: int = 8,
        hidden_act: str = "silu",
        max_position_embeddings: int = 32768,
        rms_norm_eps: float = 1e-5,
        rope_theta: float = 1e6,
        rope_scaling: Mapping | None = None,
        rope_parameters: Mapping | None = None,
        bias: bool = False,
        reward_token_id: int = 92527,
        initializer_range: float = 0.02,
        pad_token_id: int | None = 2,
        bos_token_id: int = 1,
        eos_token_id: int = 2,
        tie_word_embeddings: bool = False,
        **kwargs,
    ):
        if hidden_size % num_attention_heads:
            raise ValueError(f"hidden_size ({hidden_size}) must be divisible by num_attention_heads ({num_attention_heads})")
        if num_attention_heads % num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({num_attention_heads}) must be a multiple of num_key_value_heads ({num_key_value_heads})"
            )
        # the remote code reads this; the computation is the same for any value, so it is dropped
        kwargs.pop("pretraining_tp", None)
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.head_dim = hidden_size // num_attention_heads
        self.hidden_act = hidden_act
        self.max_position_embeddings = max_position_embeddings
        self.rms_norm_eps = rms_norm_eps
        self.rope_theta = float(rope_theta)
        # transformers 5 keeps `rope_scaling` only as an alias of `rope_parameters`
        self.rope_parameters = _rope_parameters(rope_parameters, rope_scaling, self.rope_theta)
        self.bias = bias
        self.attention_dropout = 0.0
        self.reward_token_id = reward_token_id
        self.initializer_range = initializer_range
        super().__init__(
            pad_token_id=pad_token_id,
            bos_token_id=bos_token_id,
            eos_token_id=eos_token_id,
            tie_word_embeddings=tie_word_embeddings,
            **kwargs,
        )


def _rope_parameters(rope_parameters: Mapping | None, rope_scaling: Mapping | None, rope_theta: float) -> dict:
    """The published `rope_scaling` (`"type"`, `"factor"`) in transformers' `rope_parameters` form."""
    if rope_parameters is not None:
        params = dict(rope_parameters)
    elif rope_scaling is not None:
        params = dict(rope_scaling)
    else:
        params = {"rope_type": "default"}
    rope_type = params.pop("type", None) or params.get("rope_type") or "default"
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(f"rope_scaling type {rope_type!r} is not supported (InternLM2 knows {SUPPORTED_ROPE_TYPES})")
    params["rope_type"] = rope_type
    params.setdefault("rope_theta", rope_theta)
    if rope_type != "default" and "factor" not in params:
        raise ValueError(f"rope_scaling of type {rope_type!r} needs a 'factor'")
    return params


class InternLM2MLP(nn.Module):
    """SwiGLU with InternLM2's names: w1 = gate, w3 = up, w2 = down."""

    def __init__(self, config: InternLM2RewardConfig):
        super().__init__()
        self.w1 = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.w3 = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.w2 = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)
        self.act_fn = ACT2FN[config.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(self.act_fn(self.w1(x)) * self.w3(x))


class InternLM2Attention(nn.Module):
    """GQA attention with InternLM2's packed `wqkv` (see the module docstring for the packing)."""

    def __init__(self, config: InternLM2RewardConfig, layer_idx: int):
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.head_dim = config.head_dim
        self.num_heads = config.num_attention_heads
        self.num_key_value_heads = config.num_key_value_heads
        self.num_key_value_groups = self.num_heads // self.num_key_value_heads
        self.scaling = self.head_dim**-0.5
        self.is_causal = True
        self.wqkv = nn.Linear(
            config.hidden_size, (self.num_heads + 2 * self.num_key_value_heads) * self.head_dim, bias=config.bias
        )
        self.wo = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=config.bias)

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor | None = None,
        **kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        batch, length, _ = hidden_states.shape
        # [B, T, kv_heads, group + 2, head_dim]: per kv head, its query heads, then the key, then the value
        qkv = self.wqkv(hidden_states).view(batch, length, self.num_key_value_heads, self.num_key_value_groups + 2, self.head_dim)
        query = qkv[..., : self.num_key_value_groups, :].reshape(batch, length, self.num_heads, self.head_dim)
        query, key, value = query.transpose(1, 2), qkv[..., -2, :].transpose(1, 2), qkv[..., -1, :].transpose(1, 2)

        cos, sin = position_embeddings
        query, key = apply_rotary_pos_emb(query, key, cos, sin)
        attention_interface = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, eager_attention_forward)
        attn_output, attn_weights = attention_interface(
            self, query, key, value, attention_mask, dropout=0.0, scaling=self.scaling, **kwargs
        )
        attn_output = attn_output.reshape(batch, length, -1).contiguous()
        return self.wo(attn_output), attn_weights


class InternLM2DecoderLayer(GradientCheckpointingLayer):
    def __init__(self, config: InternLM2RewardConfig, layer_idx: int):
        super().__init__()
        self.attention = InternLM2Attention(config, layer_idx)
        self.feed_forward = InternLM2MLP(config)
        self.attention_norm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.ffn_norm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, hidden_states, position_embeddings, attention_mask=None, **kwargs) -> torch.Tensor:
        attended, _ = self.attention(self.attention_norm(hidden_states), position_embeddings, attention_mask, **kwargs)
        hidden_states = hidden_states + attended
        return hidden_states + self.feed_forward(self.ffn_norm(hidden_states))


class InternLM2PreTrainedModel(PreTrainedModel):
    config: InternLM2RewardConfig
    config_class = InternLM2RewardConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["InternLM2DecoderLayer"]
    _supports_flash_attn = True
    _supports_sdpa = True
    _supports_flex_attn = True
    _supports_attention_backend = True


class InternLM2Model(InternLM2PreTrainedModel):
    """The decoder stack; returns the final (normed) hidden states. Scoring only: no KV cache."""

    def __init__(self, config: InternLM2RewardConfig):
        super().__init__(config)
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, config.pad_token_id)
        self.layers = nn.ModuleList(InternLM2DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = LlamaRotaryEmbedding(config)
        self.gradient_checkpointing = False
        self.post_init()

    def get_input_embeddings(self):
        return self.tok_embeddings

    def set_input_embeddings(self, value):
        self.tok_embeddings = value

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        **kwargs,
    ) -> BaseModelOutputWithPast:
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids or inputs_embeds")
        if inputs_embeds is None:
            inputs_embeds = self.tok_embeddings(input_ids)
        if position_ids is None:
            position_ids = padding_aware_position_ids(attention_mask, inputs_embeds.shape[:2], inputs_embeds.device)
        causal_mask = create_causal_mask(
            config=self.config,
            inputs_embeds=inputs_embeds,
            attention_mask=attention_mask,
            cache=None,
            position_ids=position_ids,
        )
        hidden_states = inputs_embeds
        position_embeddings = self.rotary_emb(hidden_states, position_ids)
        for layer in self.layers:
            hidden_states = layer(hidden_states, position_embeddings, causal_mask, **kwargs)
        return BaseModelOutputWithPast(last_hidden_state=self.norm(hidden_states))


class InternLM2ForRewardModel(InternLM2PreTrainedModel):
    """InternLM2 with the scalar `v_head`; `logits` is the score at each row's last real position, shape [B, 1]."""

    def __init__(self, config: InternLM2RewardConfig):
        super().__init__(config)
        self.model = InternLM2Model(config)
        self.v_head = nn.Linear(config.hidden_size, 1, bias=False)
        self.post_init()

    def get_input_embeddings(self):
        return self.model.tok_embeddings

    def set_input_embeddings(self, value):
        self.model.tok_embeddings = value

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        **kwargs,
    ) -> SequenceClassifierOutputWithPast:
        hidden_states = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            **kwargs,
        ).last_hidden_state
        values = self.v_head(hidden_states).squeeze(-1)  # [B, T]
        last = last_real_positions(attention_mask, values.shape, values.device)
        scores = values.gather(1, last.unsqueeze(1))  # [B, 1]
        return SequenceClassifierOutputWithPast(logits=scores)

    @torch.no_grad()
    def get_score(self, tokenizer, conversation: list[dict[str, str]]) -> float:
        """The published remote-code API (`model.get_score(tokenizer, messages)`), for drop-in use."""
        input_ids = torch.tensor([reward_token_ids(tokenizer, conversation, self.config.reward_token_id)])
        return self(input_ids=input_ids.to(self.device)).logits[0, 0].float().item()


def reward_token_ids(tokenizer, conversation: list[dict[str, str]], reward_token_id: int) -> list[int]:
    """The ids an InternLM2 reward model scores: the conversation rendered with the reward tokenizer's chat
    template (no extra specials), ending with the reward token (appended unless the template put it there)."""
    rendered = tokenizer.apply_chat_template(list(conversation), tokenize=False, add_generation_prompt=False)
    ids = list(tokenizer(rendered, add_special_tokens=False)["input_ids"])
    if not ids or ids[-1] != reward_token_id:
        ids.append(reward_token_id)
    return ids


def padding_aware_position_ids(attention_mask: torch.Tensor | None, shape, device) -> torch.LongTensor:
    """0, 1, 2, ... over each row's real tokens whichever side is padded (pad positions get 0)."""
    if attention_mask is None:
        return torch.arange(shape[1], device=device).unsqueeze(0).expand(shape[0], -1)
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def last_real_positions(attention_mask: torch.Tensor | None, shape, device) -> torch.LongTensor:
    """Index of each row's last position whose attention mask is 1 (the last column without a mask), on `device`
    (the scores' device: without a mask nothing else says where the index must live)."""
    batch, length = shape
    if attention_mask is None:
        return torch.full((batch,), length - 1, dtype=torch.long, device=device)
    mask = attention_mask.bool()
    if not bool(mask.any(-1).all()):
        raise ValueError("every row needs at least one real token (attention_mask all zero in some row)")
    return (length - 1 - mask.flip(-1).long().argmax(-1)).to(torch.long)


__all__ = ["InternLM2ForRewardModel", "InternLM2Model", "InternLM2RewardConfig", "reward_token_ids"]
