"""What a native MiniMind checkpoint's tensors say about its architecture, and the settings they cannot show.

Upstream MiniMind saves bare state dicts: no config, no head count. `infer_config` reads the architecture from
tensor names and shapes and fills what the tensors cannot tell (MiniMind2's head count, RoPE, eps, routing)
from upstream's defaults of the detected architecture or the user's settings (upstream `MiniMindConfig` keyword
names of either architecture: `convert --set`, the recipe's `native_config`, or the sidecar
`<stem>.config.json` that `minimind-trl export --format native` writes next to the `.pth`).

What the tensors decide (and settings may only confirm):
  * generation: MiniMind-3 has `self_attn.q_norm`/`k_norm`; MiniMind2 has neither;
  * hidden size, layers, vocabulary, MLP and expert widths, MoE, routed and shared expert counts;
  * MiniMind-3: `head_dim` (from `q_norm`), hence query and key/value head counts;
  * MiniMind2: key/value heads once the query head count is known.

What they cannot: MiniMind2's query head count (`head_dim = hidden_size // heads` is not stored; a wrong count
that still fits the shapes, e.g. 4 instead of 8 at width 512, loads and gives different logits), top-k, RoPE
base and YaRN, norm eps, aux-loss settings.

Checks run names first (a foreign model is reported as not MiniMind, naming the keys), then the embedding tie,
then shapes and option values.
"""

import ast
import json
import math
import re
from collections.abc import Mapping
from pathlib import Path

import torch

from ..errors import ConversionError
from ..loading_utils import preview, state_dict_problems
from ..models.minimind.configuration_minimind import MINIMIND2, MINIMIND3, MiniMindConfig
from ..models.minimind.modeling_minimind import MiniMindForCausalLM

# Keyword names of upstream `MiniMindConfig` (either architecture) accepted by `--set` / `--config`.
UPSTREAM_CONFIG_KEYS = frozenset(
    {
        # both architectures
        "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "vocab_size",
        "intermediate_size", "hidden_act", "max_position_embeddings", "rms_norm_eps", "rope_theta",
        "inference_rope_scaling", "dropout", "flash_attn", "bos_token_id", "eos_token_id", "use_moe",
        "num_experts_per_tok", "norm_topk_prob",
        # MiniMind2 names
        "n_routed_experts", "n_shared_experts", "scoring_func", "aux_loss_alpha", "seq_aux",
        # MiniMind-3 names
        "head_dim", "tie_word_embeddings", "num_experts", "moe_intermediate_size", "router_aux_loss_coef",
    }
)  # fmt: skip
# Also accepted: an explicit YaRN dict, the pad id, and the generation (checked against the tensors).
EXTRA_CONFIG_KEYS = frozenset({"rope_scaling", "pad_token_id", "minimind_generation"})
ALLOWED_CONFIG_KEYS = UPSTREAM_CONFIG_KEYS | EXTRA_CONFIG_KEYS
# MiniMind2 spelling -> MiniMind-3 / minimind-trl spelling
_ALIASES = {"n_routed_experts": "num_experts", "aux_loss_alpha": "router_aux_loss_coef"}

# The value each accepted key takes, as upstream's `MiniMindConfig` uses it; checked before anything is built,
# so `--set rms_norm_eps=abc` is an error naming the key rather than a folder that fails later.
_POSITIVE_INTS = (
    "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "vocab_size",
    "intermediate_size", "max_position_embeddings", "num_experts_per_tok", "n_routed_experts", "num_experts",
    "head_dim", "moe_intermediate_size",
)  # fmt: skip
_BOOLS = ("inference_rope_scaling", "flash_attn", "use_moe", "norm_topk_prob", "seq_aux", "tie_word_embeddings")
_TOKEN_IDS = ("bos_token_id", "eos_token_id", "pad_token_id")
_POSITIVE_FLOATS = ("rms_norm_eps", "rope_theta")
_NON_NEGATIVE_FLOATS = ("aux_loss_alpha", "router_aux_loss_coef")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_option_value(key: str, value):
    """`value` as `MiniMindConfig` takes it for `key` (ints stay ints, numbers become floats), or a ConversionError."""
    from transformers.activations import ACT2FN

    if key == "max_position_embeddings":  # a context of one token cannot condition on anything
        ok, wanted = _is_int(value) and value >= 2, "an integer of at least 2 (the context length in tokens)"
    elif key in _POSITIVE_INTS:
        ok, wanted = _is_int(value) and value > 0, "a positive integer"
    elif key == "n_shared_experts":
        ok, wanted = _is_int(value) and value >= 0, "a non-negative integer"
    elif key in _TOKEN_IDS:
        ok, wanted = value is None or (_is_int(value) and value >= 0), "a token id (non-negative integer) or null"
    elif key in _BOOLS:
        ok, wanted = isinstance(value, bool), "true or false"
    elif key in _POSITIVE_FLOATS:
        ok, wanted = _is_number(value) and value > 0, "a positive number"
    elif key in _NON_NEGATIVE_FLOATS:
        ok, wanted = _is_number(value) and value >= 0, "a non-negative number"
    elif key == "dropout":
        ok, wanted = _is_number(value) and 0 <= value < 1, "a number in [0, 1)"
    elif key == "hidden_act":
        ok = isinstance(value, str) and value in ACT2FN
        wanted = f"one of transformers' activations ({', '.join(sorted(ACT2FN))})"
    elif key == "scoring_func":
        ok, wanted = value == "softmax", "'softmax' (the only gate upstream has)"
    elif key == "minimind_generation":
        ok, wanted = value in (MINIMIND2, MINIMIND3), f"{MINIMIND2!r} or {MINIMIND3!r}"
    elif key == "rope_scaling":
        ok, wanted = value is None or isinstance(value, Mapping), "a YaRN dict or null"
    else:
        raise ConversionError(f"unknown config key {key}")
    if not ok:
        raise ConversionError(f"{key}={value!r}: expected {wanted}")
    if key in _POSITIVE_FLOATS + _NON_NEGATIVE_FLOATS + ("dropout",):
        return float(value)
    return value

_LAYER_KEY = re.compile(r"^model\.layers\.(\d+)\.")
_SHARED_KEY = re.compile(r"^model\.layers\.0\.mlp\.shared_experts\.(\d+)\.")
_EXPERT_KEY = re.compile(r"^model\.layers\.0\.mlp\.experts\.(\d+)\.")
EMBED_KEY, LM_HEAD_KEY = "model.embed_tokens.weight", "lm_head.weight"



# --------------------------------------------------------------------------- settings


def parse_set_options(items: list[str]) -> dict:
    """`["rope_theta=1e4", "inference_rope_scaling=true"]` -> `{"rope_theta": 10000.0, ...}` (JSON or Python literals)."""
    overrides = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConversionError(f"--set {item!r}: expected KEY=VALUE")
        overrides[key] = _parse_literal(raw.strip())
    return overrides


def _parse_literal(raw: str):
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        pass
    try:
        return ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        return raw  # a bare word, e.g. hidden_act=gelu


def infer_config(
    state_dict: Mapping[str, torch.Tensor],
    num_attention_heads: int | None = None,
    overrides: Mapping | None = None,
    source: str = "checkpoint",
) -> MiniMindConfig:
    """Build the `MiniMindConfig` a native state dict was trained with.

    Args:
        state_dict: native MiniMind tensors (upstream key names).
        num_attention_heads: query heads; only MiniMind2 needs it (upstream default 8). For MiniMind-3 it
            is read from the shapes and a given value must agree.
        overrides: upstream `MiniMindConfig` keyword arguments of either architecture (see
            `UPSTREAM_CONFIG_KEYS`). Keys the shapes decide must agree with them; others are applied.
        source: name used in error messages (the file).
    """
    overrides = dict(overrides or {})
    unknown = sorted(set(overrides) - ALLOWED_CONFIG_KEYS)
    if unknown:
        raise ConversionError(
            f"unknown config key(s) {', '.join(unknown)}; accepted: upstream MiniMindConfig keywords "
            f"{', '.join(sorted(ALLOWED_CONFIG_KEYS))}"
        )
    overrides = {key: check_option_value(key, value) for key, value in overrides.items()}
    for alias, name in _ALIASES.items():
        if alias in overrides:
            value = overrides.pop(alias)
            if name in overrides and overrides[name] != value:
                raise ConversionError(f"{alias}={value!r} and {name}={overrides[name]!r} disagree (same setting)")
            overrides[name] = value
    if num_attention_heads is not None:
        check_option_value("num_attention_heads", num_attention_heads)
        if overrides.setdefault("num_attention_heads", num_attention_heads) != num_attention_heads:
            raise ConversionError(
                f"--num_attention_heads {num_attention_heads} and num_attention_heads="
                f"{overrides['num_attention_heads']!r} disagree"
            )

    shapes = _infer_from_shapes(state_dict, overrides, source)
    for key, inferred in shapes.items():
        if key in overrides and overrides[key] != inferred:
            raise ConversionError(
                f"{source}: {key}={overrides[key]!r} contradicts the checkpoint, whose tensors give {key}={inferred!r}"
            )
    kwargs = {**overrides, **shapes}
    try:
        return MiniMindConfig(**kwargs)
    except (ValueError, TypeError) as exc:
        raise ConversionError(f"{source}: invalid configuration {kwargs}: {exc}") from exc


def _shape(state_dict: Mapping[str, torch.Tensor], key: str, source: str) -> tuple[int, ...]:
    if key not in state_dict:
        raise ConversionError(f"{source}: missing key {key}")
    return tuple(state_dict[key].shape)


def _infer_from_shapes(state_dict: Mapping[str, torch.Tensor], overrides: Mapping, source: str) -> dict:
    """Everything the tensors decide, as `MiniMindConfig` kwargs."""
    if EMBED_KEY not in state_dict:
        raise ConversionError(
            f"{source}: not a MiniMind state dict (no {EMBED_KEY}); its keys look like {preview(state_dict)}. "
            f"Expected the MiniMind2 / MiniMind-3 layout (2024 MiniMind-v1 names such as tok_embeddings are not supported)"
        )
    embed = _shape(state_dict, EMBED_KEY, source)
    if len(embed) != 2:
        raise ConversionError(f"{source}: {EMBED_KEY} has shape {list(embed)}, expected (vocab_size, hidden_size)")
    vocab_size, hidden_size = embed
    layer_ids = {int(m.group(1)) for key in state_dict if (m := _LAYER_KEY.match(key))}
    if not layer_ids:
        raise ConversionError(f"{source}: no model.layers.N.* tensors; its keys look like {preview(state_dict)}")
    num_layers = max(layer_ids) + 1

    prefix = "model.layers.0."
    generation = MINIMIND3 if f"{prefix}self_attn.q_norm.weight" in state_dict else MINIMIND2
    use_moe = f"{prefix}mlp.gate.weight" in state_dict
    # names first, then the tie, then shapes: a foreign model is reported as one, not by a tie or head-count check
    _check_key_names(state_dict, generation, num_layers, use_moe, source)
    tie_word_embeddings = _infer_tie(state_dict, generation, overrides.get("tie_word_embeddings"), source)

    q_out = _shape(state_dict, f"{prefix}self_attn.q_proj.weight", source)[0]
    k_out = _shape(state_dict, f"{prefix}self_attn.k_proj.weight", source)[0]

    if generation == MINIMIND3:
        head_dim = _shape(state_dict, f"{prefix}self_attn.q_norm.weight", source)[0]
        if q_out % head_dim or k_out % head_dim:
            raise ConversionError(
                f"{source}: q_proj ({q_out} rows) and k_proj ({k_out} rows) are not whole heads of "
                f"head_dim={head_dim} (the q_norm width)"
            )
        num_heads = q_out // head_dim
        if "num_attention_heads" in overrides and overrides["num_attention_heads"] != num_heads:
            raise ConversionError(
                f"{source}: num_attention_heads={overrides['num_attention_heads']!r} contradicts the checkpoint: "
                f"MiniMind-3 q_proj has {q_out} rows and q_norm gives head_dim={head_dim}, so it has {num_heads} heads"
            )
    else:
        num_heads = overrides.get("num_attention_heads", 8)  # upstream default; not recorded in the tensors
        if not isinstance(num_heads, int) or isinstance(num_heads, bool) or num_heads <= 0:
            raise ConversionError(f"num_attention_heads must be a positive integer, got {num_heads!r}")
        head_dim = hidden_size // num_heads
        if head_dim == 0 or q_out != num_heads * head_dim:
            raise ConversionError(
                f"{source}: num_attention_heads={num_heads} does not fit this MiniMind2 checkpoint: heads of "
                f"hidden_size//{num_heads}={head_dim} would make q_proj {num_heads * head_dim} rows, it has {q_out}. "
                f"Pass the head count the model was trained with (--num_attention_heads N)."
            )
        if k_out % head_dim:
            raise ConversionError(
                f"{source}: num_attention_heads={num_heads} gives head_dim={head_dim}, but k_proj has {k_out} rows, "
                f"not whole heads; pass the head count the model was trained with (--num_attention_heads N)"
            )
    if head_dim % 2:
        raise ConversionError(f"{source}: head_dim={head_dim} is odd; RoPE needs an even head_dim")
    num_kv_heads = k_out // head_dim
    if num_kv_heads == 0 or num_heads % num_kv_heads:
        raise ConversionError(
            f"{source}: {num_heads} query heads cannot share {num_kv_heads} key/value heads of head_dim={head_dim}"
        )

    inferred = {
        "minimind_generation": generation,
        "vocab_size": vocab_size,
        "hidden_size": hidden_size,
        "num_hidden_layers": num_layers,
        "num_attention_heads": num_heads,
        "num_key_value_heads": num_kv_heads,
    }
    if generation == MINIMIND3:
        inferred["head_dim"] = head_dim

    inferred["use_moe"] = use_moe
    if not use_moe:
        inferred["intermediate_size"] = _shape(state_dict, f"{prefix}mlp.gate_proj.weight", source)[0]
    else:
        num_experts = _shape(state_dict, f"{prefix}mlp.gate.weight", source)[0]
        expert_width = _shape(state_dict, f"{prefix}mlp.experts.0.gate_proj.weight", source)[0]
        shared_ids = {int(m.group(1)) for key in state_dict if (m := _SHARED_KEY.match(key))}
        inferred["num_experts"] = num_experts
        inferred["n_shared_experts"] = len(shared_ids)
        inferred["moe_intermediate_size"] = expert_width
        if shared_ids:
            # upstream MiniMind2 sizes the shared experts with intermediate_size
            inferred["intermediate_size"] = _shape(state_dict, f"{prefix}mlp.shared_experts.0.gate_proj.weight", source)[0]
        elif generation == MINIMIND2:
            inferred["intermediate_size"] = expert_width  # upstream MiniMind2 sizes routed experts with it too
        elif "intermediate_size" in overrides and "moe_intermediate_size" not in overrides:
            # MiniMind-3 MoE uses intermediate_size only as moe_intermediate_size's default; unused otherwise,
            # so it keeps upstream's formula unless given
            inferred["intermediate_size"] = expert_width

    if tie_word_embeddings is not None:
        inferred["tie_word_embeddings"] = tie_word_embeddings
    return inferred


def _check_key_names(state_dict: Mapping[str, torch.Tensor], generation: str, num_layers: int, use_moe: bool, source):
    """Compare the key names with those of a MiniMind of the same generation, depth and expert layout."""
    expert_ids = {int(m.group(1)) for key in state_dict if (m := _EXPERT_KEY.match(key))}
    shared_ids = {int(m.group(1)) for key in state_dict if (m := _SHARED_KEY.match(key))}
    name = "MiniMind2" if generation == MINIMIND2 else "MiniMind-3"
    label = f"{name} {'MoE' if use_moe else 'dense'}, {num_layers} layers"
    if use_moe and not expert_ids:
        raise ConversionError(f"{source} is not a MiniMind checkpoint: it has a MoE gate but no mlp.experts.N tensors")
    names_only = MiniMindConfig(  # widths do not change key names; a meta-device skeleton costs nothing
        minimind_generation=generation, vocab_size=8, hidden_size=2, intermediate_size=1, num_hidden_layers=num_layers,
        num_attention_heads=1, num_key_value_heads=1, use_moe=use_moe, num_experts=max(expert_ids, default=0) + 1,
        num_experts_per_tok=1, n_shared_experts=len(shared_ids) if generation == MINIMIND2 else 0,
    )  # fmt: skip
    with torch.device("meta"):
        expected = MiniMindForCausalLM(names_only).state_dict().keys()
    problems = state_dict_problems(expected, state_dict)
    if problems:
        raise ConversionError(
            f"{source} is not a MiniMind checkpoint (or a damaged one): its key names do not match {label}: "
            + "; ".join(problems)
        )


def _infer_tie(state_dict: Mapping[str, torch.Tensor], generation: str, tie_requested, source: str) -> bool | None:
    """False when the checkpoint holds two different head and embedding tensors (allowed for MiniMind-3 only)."""
    if not _tied_tensors_differ(state_dict):
        return None
    if tie_requested:
        raise ConversionError(f"{source}: tie_word_embeddings=true, but {EMBED_KEY} and {LM_HEAD_KEY} differ")
    if tie_requested is None and generation == MINIMIND2:
        raise ConversionError(
            f"{source}: {EMBED_KEY} and {LM_HEAD_KEY} differ, but MiniMind2 always ties them, so this is not a "
            f"MiniMind2 checkpoint (an untied Llama-style model?) or a damaged one. If it is MiniMind2 trained "
            f"untied, pass --set tie_word_embeddings=false to keep both."
        )
    return False


def _tied_tensors_differ(state_dict: Mapping[str, torch.Tensor]) -> bool:
    if LM_HEAD_KEY not in state_dict:
        return False  # reported as a missing key by the strict check
    embed, head = state_dict[EMBED_KEY], state_dict[LM_HEAD_KEY]
    if embed.shape != head.shape:
        return True
    return not torch.equal(embed.to(torch.float32), head.to(torch.float32))


def describe(config: MiniMindConfig) -> str:
    """One line a user can check against what they trained."""
    generation = "MiniMind2" if config.minimind_generation == MINIMIND2 else "MiniMind-3"
    parts = [
        f"{generation} {'MoE' if config.use_moe else 'dense'}",
        f"hidden {config.hidden_size}",
        f"{config.num_hidden_layers} layers",
        f"{config.num_attention_heads} heads x {config.head_dim}",
        f"{config.num_key_value_heads} kv heads",
        f"vocab {config.vocab_size}",
        f"intermediate {config.intermediate_size}",
    ]
    if config.use_moe:
        parts.append(
            f"{config.num_experts} experts (top-{config.num_experts_per_tok}, width {config.moe_intermediate_size}, "
            f"{config.n_shared_experts} shared)"
        )
    rope = config.rope_parameters
    parts.append(f"rope_theta {rope['rope_theta']:g}" + (" + YaRN" if config.yarn_active else ""))
    parts.append(f"eps {config.rms_norm_eps:g}")
    return ", ".join(parts)


def assumed_settings(config: MiniMindConfig, overrides: Mapping | None = None, num_attention_heads: int | None = None):
    """One warning line per setting the tensors cannot show that `config` took from upstream's defaults.

    `overrides` are the settings the user gave (`--set`, `--config`/sidecar, the recipe's `native_config`); each
    line names the key and how to override it, since a wrong guess loads strictly and only changes the logits.
    """
    given = set(overrides or {})
    how = "convert: --set {key}=VALUE; grpo recipe: native_config: {{{key}: VALUE}}"
    lines = []
    if config.minimind_generation == MINIMIND2 and num_attention_heads is None and "num_attention_heads" not in given:
        lines.append(
            f"warning: MiniMind2 checkpoints do not record the head count; ASSUMED upstream's default "
            f"{config.num_attention_heads} (it fits the shapes, but so may others; if the model was trained with "
            f"another, the logits will be wrong: convert --num_attention_heads N; grpo recipe: "
            f"native_num_attention_heads: N)"
        )
    if config.use_moe and "num_experts_per_tok" not in given:
        lines.append(
            f"warning: num_experts_per_tok={config.num_experts_per_tok} ASSUMED (MoE top-k is not in the tensors; "
            f"upstream's default for this generation); if trained otherwise: " + how.format(key="num_experts_per_tok")
        )
    if not given & {"inference_rope_scaling", "rope_scaling"}:
        lines.append(
            f"warning: inference_rope_scaling={str(config.inference_rope_scaling).lower()} ASSUMED (YaRN is not in "
            f"the tensors; upstream's default); if the model runs with YaRN: "
            + how.format(key="inference_rope_scaling")
        )
    if "rope_theta" not in given:
        lines.append(
            f"warning: rope_theta={config.rope_parameters['rope_theta']:g} ASSUMED (the RoPE base is not in the "
            f"tensors; upstream's default); if trained otherwise: " + how.format(key="rope_theta")
        )
    return lines


def native_sidecar_path(checkpoint: str | Path) -> Path:
    """`m.pth` -> `m.config.json`: the upstream config kwargs `minimind-trl export --format native` writes beside it."""
    checkpoint = Path(checkpoint)
    return checkpoint.with_name(checkpoint.stem + ".config.json")


def read_config_file(path: str | Path) -> dict:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ConversionError(f"{path}: cannot read a JSON config: {exc}") from exc
    if not isinstance(data, dict):
        raise ConversionError(f"{path}: expected a JSON object of MiniMindConfig keywords")
    return data



__all__ = [
    "ALLOWED_CONFIG_KEYS",
    "EMBED_KEY",
    "assumed_settings",
    "LM_HEAD_KEY",
    "UPSTREAM_CONFIG_KEYS",
    "check_option_value",
    "describe",
    "infer_config",
    "native_sidecar_path",
    "parse_set_options",
    "read_config_file",
]
