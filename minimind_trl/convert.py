"""Native MiniMind checkpoints (`.pth` state dicts) -> Hugging Face folders.

Upstream MiniMind saves bare state dicts (`torch.save({k: v.half() ...})`): no config, no head count.
This module reads one safely (`weights_only=True`), infers the architecture from tensor names and
shapes, fills what the tensors cannot tell (head count for MiniMind2, RoPE, eps, routing) from
upstream's defaults or the user's `--set KEY=VALUE` (upstream `MiniMindConfig` keyword names of either
generation), loads strictly and writes a `save_pretrained` folder.

What the tensors decide (and `--set` may only confirm):
  * generation: MiniMind-3 has `self_attn.q_norm`/`k_norm`; MiniMind2 has neither;
  * hidden size, layers, vocabulary, MLP and expert widths, MoE, routed and shared expert counts;
  * MiniMind-3: `head_dim` (from `q_norm`), hence query and key/value head counts;
  * MiniMind2: key/value heads once the query head count is known.

What they cannot: MiniMind2's query head count (`head_dim = hidden_size // heads` is not stored; a
wrong count that still fits the shapes, e.g. 4 instead of 8 at width 512, loads and gives different
logits), top-k, RoPE base and YaRN, norm eps, aux-loss settings. Those come from upstream's defaults of
the detected generation unless given, or from the sidecar `<stem>.config.json` that
`minimind-trl export --format native` writes next to the `.pth` (the CLI reads it when present).

Checks run names first (a foreign model is reported as not MiniMind, naming the keys), then the
embedding tie, then shapes and option values; the model is built before anything is written.
"""

import argparse
import ast
import json
import math
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path

import torch
from transformers.initialization import no_init_weights

from .configuration_minimind import MINIMIND2, MINIMIND3, MiniMindConfig
from .modeling_minimind import MiniMindForCausalLM


class ConversionError(ValueError):
    """A checkpoint, option or output path that cannot be converted; the message says which and why."""


# Keyword names of upstream `MiniMindConfig` (either generation) accepted by `--set` / `--config`.
UPSTREAM_CONFIG_KEYS = frozenset(
    {
        # both generations
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

    if key in _POSITIVE_INTS:
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

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}

_LAYER_KEY = re.compile(r"^model\.layers\.(\d+)\.")
_SHARED_KEY = re.compile(r"^model\.layers\.0\.mlp\.shared_experts\.(\d+)\.")
_EXPERT_KEY = re.compile(r"^model\.layers\.0\.mlp\.experts\.(\d+)\.")
EMBED_KEY, LM_HEAD_KEY = "model.embed_tokens.weight", "lm_head.weight"


# --------------------------------------------------------------------------- reading


def load_native_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """Read a native checkpoint safely: a `.pth`/`.pt`/`.bin` state dict (`weights_only=True`) or `.safetensors`.

    Upstream's `*_resume.pth` training states are accepted too: their weights sit under `"model"`.
    """
    path = Path(path)
    if not path.is_file():
        raise ConversionError(f"{path}: no such checkpoint file")
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            obj = load_file(str(path), device="cpu")
        else:
            obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # re-raised with the file name: truncated, not a checkpoint, unsafe pickle
        raise ConversionError(
            f"{path}: cannot be read as a PyTorch state dict (truncated or not a checkpoint?): "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    if isinstance(obj, Mapping) and "model" in obj and "optimizer" in obj and isinstance(obj["model"], Mapping):
        print(f"{path}: upstream training-resume file; converting its 'model' weights", file=sys.stderr)
        obj = obj["model"]
    if not isinstance(obj, Mapping) or not obj:
        raise ConversionError(f"{path}: expected a non-empty dict of tensors, got {type(obj).__name__}")
    not_tensors = [key for key, value in obj.items() if not isinstance(value, torch.Tensor)]
    if not_tensors:
        raise ConversionError(f"{path}: entries that are not tensors: {_preview(not_tensors)}")
    return dict(obj)


# --------------------------------------------------------------------------- config inference


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
        overrides: upstream `MiniMindConfig` keyword arguments of either generation (see
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
                f"--num-attention-heads {num_attention_heads} and num_attention_heads="
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
            f"{source}: not a MiniMind state dict (no {EMBED_KEY}); its keys look like {_preview(state_dict)}. "
            f"Expected the MiniMind2 / MiniMind-3 layout (2024 MiniMind-v1 names such as tok_embeddings are not supported)"
        )
    embed = _shape(state_dict, EMBED_KEY, source)
    if len(embed) != 2:
        raise ConversionError(f"{source}: {EMBED_KEY} has shape {list(embed)}, expected (vocab_size, hidden_size)")
    vocab_size, hidden_size = embed
    layer_ids = {int(m.group(1)) for key in state_dict if (m := _LAYER_KEY.match(key))}
    if not layer_ids:
        raise ConversionError(f"{source}: no model.layers.N.* tensors; its keys look like {_preview(state_dict)}")
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
                f"Pass the head count the model was trained with (--num-attention-heads N)."
            )
        if k_out % head_dim:
            raise ConversionError(
                f"{source}: num_attention_heads={num_heads} gives head_dim={head_dim}, but k_proj has {k_out} rows, "
                f"not whole heads; pass the head count the model was trained with (--num-attention-heads N)"
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
    problems = _key_problems(expected, state_dict)
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


# --------------------------------------------------------------------------- strict loading


def _key_problems(expected, state_dict: Mapping[str, torch.Tensor]) -> list[str]:
    """Missing and unexpected keys against `expected` (key names, or a mapping of names to shapes, whose
    mis-shaped keys are reported too), as message parts; empty when everything fits."""
    missing = [key for key in expected if key not in state_dict]
    unexpected = [key for key in state_dict if key not in expected]
    shapes = expected if isinstance(expected, Mapping) else {}
    misshaped = [
        f"{key} {list(state_dict[key].shape)} (expected {list(shape)})"
        for key, shape in shapes.items()
        if key in state_dict and tuple(state_dict[key].shape) != shape
    ]
    named = (("missing", missing), ("unexpected", unexpected), ("mis-shaped", misshaped))
    return [f"{kind} keys ({len(keys)}): {_preview(keys)}" for kind, keys in named if keys]


def check_state_dict(model: torch.nn.Module, state_dict: Mapping[str, torch.Tensor], source: str = "checkpoint"):
    """Raise naming every missing, unexpected and mis-shaped key (before anything is loaded)."""
    expected = {key: tuple(value.shape) for key, value in model.state_dict().items()}
    problems = _key_problems(expected, state_dict)
    if problems:
        raise ConversionError(f"{source} does not match the inferred MiniMind architecture: " + "; ".join(problems))
    floating = [key for key, value in state_dict.items() if not value.is_floating_point()]
    if floating:
        raise ConversionError(f"{source}: non-floating-point tensors: {_preview(floating)}")


def model_from_state_dict(
    state_dict: Mapping[str, torch.Tensor], config: MiniMindConfig, source: str = "checkpoint"
) -> MiniMindForCausalLM:
    """A float32 `MiniMindForCausalLM` holding exactly `state_dict` (strict: nothing half-loads)."""
    try:  # a config that passed its own checks can still name e.g. an unknown activation
        with torch.device("meta"):
            skeleton = MiniMindForCausalLM(config)
    except (KeyError, TypeError, ValueError) as exc:
        message = f"{source}: cannot build a MiniMind from this configuration: {type(exc).__name__}: {exc}"
        raise ConversionError(message) from exc
    check_state_dict(skeleton, state_dict, source)
    with no_init_weights():  # every parameter is overwritten below; random init would cost seconds
        model = MiniMindForCausalLM(config)
    model.tie_weights()  # post_init ties only when it initialises
    model.load_state_dict(state_dict, strict=True)  # copies into the fp32 parameters (fp16 -> fp32 is exact)
    if config.tie_word_embeddings and model.lm_head.weight is not model.model.embed_tokens.weight:
        raise ConversionError("internal error: lm_head is not tied to the embeddings after loading")
    return model.eval()


def load_native_checkpoint(
    path: str | Path,
    num_attention_heads: int | None = None,
    overrides: Mapping | None = None,
    dtype: str | torch.dtype = "float32",
) -> MiniMindForCausalLM:
    """Read, infer and strictly load a native checkpoint; `dtype="auto"` keeps the checkpoint's dtype."""
    state_dict = load_native_state_dict(path)
    config = infer_config(state_dict, num_attention_heads, overrides, source=str(path))
    model = model_from_state_dict(state_dict, config, source=str(path))
    target = state_dict[EMBED_KEY].dtype if dtype == "auto" else _dtype(dtype)
    return model.to(target)


def _dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ConversionError(f"dtype must be one of {', '.join(DTYPES)} or auto, got {dtype!r}")
    return DTYPES[dtype]


# --------------------------------------------------------------------------- writing


def write_folder_atomically(output_dir: str | Path, write: Callable[[Path], None], force: bool = False) -> Path:
    """Run `write(tmp_dir)` in a temporary folder next to `output_dir`, then rename it into place.

    A failure leaves nothing behind (no half-written output, no new parent folders); an existing non-empty
    `output_dir` is only replaced with `force=True`, and only once the new folder is complete.
    """
    output_dir = Path(output_dir).absolute()
    if output_dir.exists() and not output_dir.is_dir():
        raise ConversionError(f"{output_dir} exists and is not a folder")
    if output_dir.is_dir() and any(output_dir.iterdir()) and not force:
        raise ConversionError(f"{output_dir} exists and is not empty (use --force to replace it)")
    created = [parent for parent in reversed(output_dir.parents) if not parent.exists()]
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp_dir = Path(tempfile.mkdtemp(prefix=f".{output_dir.name}.tmp-", dir=output_dir.parent))
    try:
        write(tmp_dir)
        _share_like_new_files(tmp_dir)
        if output_dir.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{output_dir.name}.old-", dir=output_dir.parent))
            old.rmdir()
            output_dir.rename(old)
            tmp_dir.rename(output_dir)
            shutil.rmtree(old)
        else:
            tmp_dir.rename(output_dir)
    except BaseException:
        shutil.rmtree(tmp_dir, ignore_errors=True)
        for parent in reversed(created):
            if parent.is_dir() and not any(parent.iterdir()):
                parent.rmdir()
        raise
    return output_dir


def _share_like_new_files(folder: Path) -> None:
    """Give the finished folder the permissions of a plainly created one (temp dirs and files are private)."""
    umask = os.umask(0)
    os.umask(umask)
    folder.chmod(0o777 & ~umask)
    for path in folder.rglob("*"):
        path.chmod((0o777 if path.is_dir() else 0o666) & ~umask)


def convert_checkpoint(
    checkpoint: str | Path,
    output_dir: str | Path,
    num_attention_heads: int | None = None,
    overrides: Mapping | None = None,
    tokenizer: str | Path | None = None,
    dtype: str = "float32",
    force: bool = False,
) -> MiniMindForCausalLM:
    """Native checkpoint -> `save_pretrained` folder (safetensors, config with `auto_map`, modeling code).

    Everything is read, built and checked before anything is written. Returns the loaded model.
    """
    model = load_native_checkpoint(checkpoint, num_attention_heads, overrides, dtype=dtype)
    try:  # the summary the CLI prints reads every field; a config it cannot print must not be written
        describe(model.config)
    except (KeyError, TypeError, ValueError) as exc:
        raise ConversionError(f"{checkpoint}: invalid configuration: {type(exc).__name__}: {exc}") from exc
    tok = _load_tokenizer(tokenizer) if tokenizer is not None else None

    def write(folder: Path) -> None:
        model.save_pretrained(folder)
        if tok is not None:
            tok.save_pretrained(folder)

    write_folder_atomically(output_dir, write, force=force)
    return model


def _load_tokenizer(tokenizer_dir: str | Path):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(tokenizer_dir))
    except (OSError, ValueError) as exc:
        raise ConversionError(f"{tokenizer_dir}: cannot load a tokenizer: {exc}") from exc


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


def _preview(keys, limit: int = 6) -> str:
    keys = list(keys)
    shown = ", ".join(str(key) for key in keys[:limit])
    return shown + (f", ... ({len(keys) - limit} more)" if len(keys) > limit else "")


# --------------------------------------------------------------------------- CLI


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="minimind-trl convert",
        description="Convert a native MiniMind checkpoint (upstream .pth state dict, fp16 or fp32) into a Hugging "
        "Face folder that AutoModelForCausalLM loads. The architecture is read from the tensors; MiniMind2's query "
        "head count is not stored in them (upstream default 8).",
    )
    parser.add_argument("checkpoint", help="native state dict: .pth (upstream trainers), .bin or .safetensors")
    parser.add_argument("output_dir", help="folder to write (created; must not exist or be empty unless --force)")
    parser.add_argument(
        "--num-attention-heads", type=int, default=None,
        help="query heads the model was trained with; MiniMind2 cannot be checked beyond the tensor shapes "
        "(default: 8, upstream's); MiniMind-3 reads it from the shapes",
    )  # fmt: skip
    parser.add_argument("--tokenizer", default=None, help="tokenizer folder to save alongside (e.g. upstream model/)")
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help="an upstream MiniMindConfig keyword of either generation, e.g. inference_rope_scaling=true, "
        "rope_theta=1e4, num_experts_per_tok=2, aux_loss_alpha=0.02 (values are JSON/Python literals; repeatable)",
    )  # fmt: skip
    parser.add_argument(
        "--config", default=None, metavar="JSON",
        help="a JSON file of the same keywords (default: the sidecar CHECKPOINT_STEM.config.json that "
        "`minimind-trl export --format native` writes, if present); --set wins",
    )  # fmt: skip
    parser.add_argument(
        "--dtype", default="float32", choices=[*DTYPES, "auto"],
        help="weights dtype of the folder (default float32: fp16 -> fp32 is lossless; auto keeps the checkpoint's)",
    )  # fmt: skip
    parser.add_argument("--force", action="store_true", help="replace a non-empty OUTPUT_DIR")
    return parser


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


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    config_file = args.config
    if config_file is None and native_sidecar_path(args.checkpoint).is_file():
        config_file = native_sidecar_path(args.checkpoint)
        print(f"reading settings from {config_file} (written by `minimind-trl export --format native`; --set wins)")
    try:
        overrides = read_config_file(config_file) if config_file else {}
        overrides.update(parse_set_options(args.overrides))
        model = convert_checkpoint(
            args.checkpoint,
            args.output_dir,
            num_attention_heads=args.num_attention_heads,
            overrides=overrides,
            tokenizer=args.tokenizer,
            dtype=args.dtype,
            force=args.force,
        )
    except ConversionError as exc:
        print(f"minimind-trl convert: error: {exc}", file=sys.stderr)
        return 1
    config = model.config
    print(f"{args.checkpoint}: {describe(config)}")
    if config.minimind_generation == MINIMIND2 and args.num_attention_heads is None and "num_attention_heads" not in overrides:
        print(f"note: MiniMind2 checkpoints do not record the head count; ASSUMED upstream's default "
              f"{config.num_attention_heads} (it fits the shapes, but so may others: pass --num-attention-heads N "
              f"if the model was trained with another, or the logits will be wrong)")  # fmt: skip
    print(f"wrote {Path(args.output_dir)} ({str(model.dtype).removeprefix('torch.')}, safetensors)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
