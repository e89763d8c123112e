"""An independent reference of upstream MiniMind's forward pass, for tests only.

Written from the behaviour that ../shared/fixtures/minimind-upstream/README.md documents, not from
minimind_trl (nothing here imports it), so that tests of the package can compare against upstream on
checkpoints the fixtures do not cover: other widths, head counts, expert counts, YaRN settings.

Everything is a function of a bare upstream state dict (upstream's key names) and upstream
`MiniMindConfig` keyword arguments of one generation ("minimind2" or "minimind3"). The arithmetic runs
in float64, so float32 rounding of upstream and of the package both sit far inside the test tolerances.
`test_reference_reproduces_upstream_fixtures` (tests/conversion/test_convert.py) proves it on all four fixtures.
"""

import math

import torch
import torch.nn.functional as F

MINIMIND2, MINIMIND3 = "minimind2", "minimind3"

# upstream `MiniMindConfig` keyword defaults of each generation (the MoE ones under their own names)
_COMMON_DEFAULTS = dict(
    num_hidden_layers=8, num_attention_heads=8, vocab_size=6400, hidden_act="silu", max_position_embeddings=32768,
    rope_theta=1e6, inference_rope_scaling=False, use_moe=False, norm_topk_prob=True, dropout=0.0, flash_attn=True,
)  # fmt: skip
_DEFAULTS = {
    MINIMIND2: dict(
        _COMMON_DEFAULTS, hidden_size=512, num_key_value_heads=2, rms_norm_eps=1e-5, num_experts_per_tok=2,
        n_routed_experts=4, n_shared_experts=1, scoring_func="softmax", aux_loss_alpha=0.01, seq_aux=True,
    ),
    MINIMIND3: dict(
        _COMMON_DEFAULTS, hidden_size=768, num_key_value_heads=4, rms_norm_eps=1e-6, num_experts_per_tok=1,
        num_experts=4, router_aux_loss_coef=5e-4, tie_word_embeddings=True,
    ),
}  # fmt: skip
# what upstream's `inference_rope_scaling=True` switches on
UPSTREAM_YARN = dict(factor=16, original_max_position_embeddings=2048, beta_fast=32, beta_slow=1, attention_factor=1.0)
_ACTIVATIONS = {"silu": F.silu, "gelu": F.gelu, "relu": F.relu}


def resolve_config(generation: str, **kwargs) -> dict:
    """Upstream's resolved config for `MiniMindConfig(**kwargs)` of `generation`, under generation-neutral names."""
    defaults = _DEFAULTS[generation]
    unknown = set(kwargs) - set(defaults) - {"intermediate_size", "head_dim", "moe_intermediate_size"}
    if unknown:
        raise TypeError(f"not an upstream {generation} MiniMindConfig keyword: {sorted(unknown)}")
    if generation == MINIMIND3 and "n_shared_experts" in kwargs:
        raise TypeError("MiniMind-3 has no shared experts")
    if generation == MINIMIND2 and "head_dim" in kwargs:
        raise TypeError("MiniMind2 derives head_dim from hidden_size // num_attention_heads")
    cfg = {**defaults, **kwargs, "generation": generation}
    width = cfg["hidden_size"]
    if "intermediate_size" not in kwargs:
        if generation == MINIMIND2:  # 8/3 of the width, rounded up to a multiple of 64
            cfg["intermediate_size"] = 64 * math.ceil(int(width * 8 / 3) / 64)
        else:  # pi times the width, rounded up to a multiple of 64
            cfg["intermediate_size"] = 64 * math.ceil(width * math.pi / 64)
    cfg.setdefault("head_dim", width // cfg["num_attention_heads"])
    cfg["rope_scaling"] = dict(UPSTREAM_YARN) if cfg["inference_rope_scaling"] else None
    if generation == MINIMIND2:
        cfg.update(
            n_experts=cfg["n_routed_experts"], n_shared=cfg["n_shared_experts"], aux_coef=cfg["aux_loss_alpha"],
            expert_size=cfg["intermediate_size"], tied=True,  # MiniMind2 always ties lm_head to the embedding
        )  # fmt: skip
    else:
        cfg.update(
            n_experts=cfg["num_experts"], n_shared=0, aux_coef=cfg["router_aux_loss_coef"],
            expert_size=cfg.get("moe_intermediate_size", cfg["intermediate_size"]), tied=cfg["tie_word_embeddings"],
        )  # fmt: skip
    return cfg


# --------------------------------------------------------------------------- checkpoints


def state_dict_shapes(cfg: dict) -> dict[str, tuple[int, ...]]:
    """Upstream's state-dict keys, in file order, with their shapes."""
    width, head_dim = cfg["hidden_size"], cfg["head_dim"]
    q_rows, kv_rows = cfg["num_attention_heads"] * head_dim, cfg["num_key_value_heads"] * head_dim

    def mlp(prefix: str, inner: int) -> dict:
        return {f"{prefix}gate_proj.weight": (inner, width), f"{prefix}down_proj.weight": (width, inner),
                f"{prefix}up_proj.weight": (inner, width)}  # fmt: skip

    shapes = {"model.embed_tokens.weight": (cfg["vocab_size"], width)}
    for layer in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        shapes.update({
            f"{p}self_attn.q_proj.weight": (q_rows, width), f"{p}self_attn.k_proj.weight": (kv_rows, width),
            f"{p}self_attn.v_proj.weight": (kv_rows, width), f"{p}self_attn.o_proj.weight": (width, q_rows),
        })  # fmt: skip
        if cfg["generation"] == MINIMIND3:
            shapes.update({f"{p}self_attn.q_norm.weight": (head_dim,), f"{p}self_attn.k_norm.weight": (head_dim,)})
        shapes.update({f"{p}input_layernorm.weight": (width,), f"{p}post_attention_layernorm.weight": (width,)})
        if not cfg["use_moe"]:
            shapes.update(mlp(f"{p}mlp.", cfg["intermediate_size"]))
            continue
        experts = {}
        for e in range(cfg["n_experts"]):
            experts.update(mlp(f"{p}mlp.experts.{e}.", cfg["expert_size"]))
        gate = {f"{p}mlp.gate.weight": (cfg["n_experts"], width)}
        if cfg["generation"] == MINIMIND2:
            shapes.update(experts | gate)
            for s in range(cfg["n_shared"]):
                shapes.update(mlp(f"{p}mlp.shared_experts.{s}.", cfg["intermediate_size"]))
        else:
            shapes.update(gate | experts)
    shapes.update({"model.norm.weight": (width,), "lm_head.weight": (cfg["vocab_size"], width)})
    return shapes


def random_state_dict(cfg: dict, seed: int) -> dict[str, torch.Tensor]:
    """Random upstream-style fp32 weights: matrices ~ N(0, 1/fan_in), norms scaled by U[0.5, 1.5) like the fixtures.

    Tied models get one tensor under both keys, as upstream's `state_dict()`.
    """
    generator = torch.Generator().manual_seed(seed)
    state_dict = {}
    for key, shape in state_dict_shapes(cfg).items():
        if key == "lm_head.weight" and cfg["tied"]:
            state_dict[key] = state_dict["model.embed_tokens.weight"]
        elif len(shape) == 2:
            state_dict[key] = torch.randn(shape, generator=generator) * shape[1] ** -0.5
        else:
            state_dict[key] = torch.rand(shape, generator=generator) + 0.5
    return state_dict


def save_like_upstream_trainer(state_dict: dict[str, torch.Tensor], path) -> dict[str, torch.Tensor]:
    """`torch.save({k: v.half()})` as upstream's trainers do (tied tensors become two copies); returns the saved dict."""
    half = {key: value.half() for key, value in state_dict.items()}
    torch.save(half, path)
    return half


# --------------------------------------------------------------------------- forward


def rope_frequencies(cfg: dict) -> tuple[torch.Tensor, float]:
    """Per-pair rotation frequencies and the cos/sin multiplier, with upstream's YaRN when it applies.

    YaRN interpolates each frequency between itself and itself / factor along a linear ramp over the pair
    index, between bounds found from beta_fast / beta_slow rotations in the original context. Upstream keeps
    the bounds inside [0, dim/2 - 1] (floor / ceil), guards an empty ramp with 0.001, and applies YaRN only
    when the RoPE table is longer than the original context. The attention factor applies regardless.
    """
    dim, base = cfg["head_dim"], float(cfg["rope_theta"])
    pairs = dim // 2
    freqs = [base ** (-2.0 * i / dim) for i in range(pairs)]
    yarn, multiplier = cfg["rope_scaling"], 1.0
    if yarn is not None:
        multiplier = yarn["attention_factor"]
        original = yarn["original_max_position_embeddings"]
        if cfg["max_position_embeddings"] / original > 1:

            def pair_index(rotations: float) -> float:  # the pair that turns `rotations` times in `original` tokens
                return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

            start = max(math.floor(pair_index(yarn["beta_fast"])), 0)
            end = min(math.ceil(pair_index(yarn["beta_slow"])), pairs - 1)
            for i in range(pairs):
                weight = min(max((i - start) / max(end - start, 0.001), 0.0), 1.0)
                freqs[i] *= (1 - weight) + weight / yarn["factor"]
    return torch.tensor(freqs, dtype=torch.float64), multiplier


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return weight * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE on (B, T, heads, head_dim): pair i is (x[i], x[i + head_dim/2])."""
    first, second = x.chunk(2, dim=-1)
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]
    return torch.cat([first * cos - second * sin, second * cos + first * sin], dim=-1)


def _swiglu(x: torch.Tensor, w: dict, prefix: str, act) -> torch.Tensor:
    gated = act(x @ w[f"{prefix}gate_proj.weight"].T) * (x @ w[f"{prefix}up_proj.weight"].T)
    return gated @ w[f"{prefix}down_proj.weight"].T


def _attention(x, w, p, cfg, cos, sin, key_mask):
    batch, length, _ = x.shape
    heads, kv_heads, head_dim = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    q = (x @ w[f"{p}q_proj.weight"].T).view(batch, length, heads, head_dim)
    k = (x @ w[f"{p}k_proj.weight"].T).view(batch, length, kv_heads, head_dim)
    v = (x @ w[f"{p}v_proj.weight"].T).view(batch, length, kv_heads, head_dim)
    if cfg["generation"] == MINIMIND3:  # per-head norms over head_dim, before RoPE
        q = _rms_norm(q, w[f"{p}q_norm.weight"], cfg["rms_norm_eps"])
        k = _rms_norm(k, w[f"{p}k_norm.weight"], cfg["rms_norm_eps"])
    q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
    # GQA: query head h reads key/value head h // (heads / kv_heads), i.e. each kv head serves a block of queries
    serving = torch.arange(heads) // (heads // kv_heads)
    k, v = k[:, :, serving], v[:, :, serving]
    scores = torch.einsum("bihd,bjhd->bhij", q, k) / math.sqrt(head_dim)
    future = torch.ones(length, length, dtype=torch.bool).triu(1)
    scores = scores.masked_fill(future, float("-inf"))
    if key_mask is not None:  # upstream: a large finite penalty on padded key columns, not -inf
        scores = scores + (1.0 - key_mask[:, None, None, :]) * -1e9
    out = torch.einsum("bhij,bjhd->bihd", scores.softmax(-1), v).reshape(batch, length, heads * head_dim)
    return out @ w[f"{p}o_proj.weight"].T


def _moe(x, w, p, cfg, act, training):
    """Softmax-routed top-k experts and the load-balancing loss (train mode only)."""
    batch, length, width = x.shape
    tokens = x.reshape(-1, width)
    n_experts, top_k, generation = cfg["n_experts"], cfg["num_experts_per_tok"], cfg["generation"]
    scores = (tokens @ w[f"{p}gate.weight"].T).softmax(-1)
    weights, chosen = scores.topk(top_k, dim=-1)
    # MiniMind2 renormalises the chosen weights only when it picks more than one expert; MiniMind-3 always
    if cfg["norm_topk_prob"] and (top_k > 1 or generation == MINIMIND3):
        weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
    every_expert = torch.stack([_swiglu(tokens, w, f"{p}experts.{e}.", act) for e in range(n_experts)], dim=1)
    out = (every_expert[torch.arange(len(tokens))[:, None], chosen] * weights[..., None]).sum(1)
    for s in range(cfg["n_shared"]):  # always on, unweighted
        out = out + _swiglu(tokens, w, f"{p}shared_experts.{s}.", act)

    aux = torch.zeros((), dtype=x.dtype)
    if training and cfg["aux_coef"] > 0:
        picks = F.one_hot(chosen, n_experts).to(x.dtype)  # (tokens, slot, expert)
        if generation == MINIMIND3:  # per slot: share of all tokens sent to e, times e's mean score; summed
            aux = (picks.mean(0) * scores.mean(0)).sum() * n_experts * cfg["aux_coef"]
        elif cfg["seq_aux"]:  # per sequence: e's picks relative to a uniform share, times e's mean score
            per_row = picks.view(batch, length * top_k, n_experts).sum(1) / (length * top_k / n_experts)
            aux = (per_row * scores.view(batch, length, n_experts).mean(1)).sum(1).mean() * cfg["aux_coef"]
        else:  # over all tokens: e's share of all picks, times e's mean score, times the expert count
            share = picks.reshape(-1, n_experts).mean(0)
            aux = (share * n_experts * scores.mean(0)).sum() * cfg["aux_coef"]
    return out.view(batch, length, width), aux


@torch.no_grad()
def forward(state_dict, cfg: dict, input_ids, attention_mask=None, training: bool = False) -> dict:
    """Upstream's `model(input_ids, attention_mask=...)`: logits, final hidden states and the summed aux loss.

    Positions are column indices (upstream never derives them from the mask); padded key columns get -1e9.
    Outputs at padded query positions are arbitrary, as upstream's are. `training` only switches the MoE
    aux loss on (dropout is 0).
    """
    w = {key: value.to(torch.float64) for key, value in state_dict.items()}
    act, eps = _ACTIVATIONS[cfg["hidden_act"]], cfg["rms_norm_eps"]
    length = input_ids.shape[1]
    freqs, multiplier = rope_frequencies(cfg)
    angles = torch.arange(length, dtype=torch.float64)[:, None] * freqs[None, :]
    cos, sin = angles.cos() * multiplier, angles.sin() * multiplier
    key_mask = None if attention_mask is None else attention_mask.to(torch.float64)

    h = w["model.embed_tokens.weight"][input_ids]
    aux = torch.zeros((), dtype=torch.float64)
    for layer in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        x = _rms_norm(h, w[f"{p}input_layernorm.weight"], eps)
        h = h + _attention(x, w, f"{p}self_attn.", cfg, cos, sin, key_mask)
        x = _rms_norm(h, w[f"{p}post_attention_layernorm.weight"], eps)
        if cfg["use_moe"]:
            y, layer_aux = _moe(x, w, f"{p}mlp.", cfg, act, training)
            aux = aux + layer_aux
        else:
            y = _swiglu(x, w, f"{p}mlp.", act)
        h = h + y
    h = _rms_norm(h, w["model.norm.weight"], eps)
    return {"logits": (h @ w["lm_head.weight"].T).float(), "hidden_states": h.float(), "aux_loss": aux.float()}
