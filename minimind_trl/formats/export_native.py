"""MiniMind -> upstream MiniMind's native `.pth` state dict, plus a JSON sidecar of its config.

The state dict is the one upstream loads with `load_state_dict(strict=True)` (same keys, both tied keys). A bare
`.pth` does not record the head count, RoPE or routing settings, so `<stem>.config.json` beside it holds the
upstream `MiniMindConfig` kwargs (`minimind-trl convert --config` and the GRPO command read it back).

On floor 3 with the rewards, below the trainer (docs/architecture.md#layers): the trainer writes upstream's `.pth`
beside every checkpoint with it, as upstream's `train_grpo.py` saves.
"""

import json
import os
import tempfile
import zipfile
from collections.abc import Mapping
from pathlib import Path

import torch

from ..errors import ExportError
from ..loading_utils import check_output_file
from ..models.minimind.configuration_minimind import MINIMIND2, UPSTREAM_YARN, MiniMindConfig
from ..models.minimind.modeling_minimind import MiniMindForCausalLM
from .native_config import native_sidecar_path

def to_native_state_dict(
    model: torch.nn.Module | Mapping[str, torch.Tensor],
    config: MiniMindConfig | None = None,
    dtype: torch.dtype | None = None,
) -> dict[str, torch.Tensor]:
    """Upstream MiniMind's state dict for `model` (or a gathered state dict plus its config), on CPU.

    Checked against the architecture: every upstream key (both tied keys included), nothing else, so a
    trainer can call it at save time and upstream's `load_state_dict(strict=True)` accepts the result.
    `dtype=torch.float16` gives what upstream's trainers save.
    """
    if isinstance(model, Mapping):
        if config is None:
            raise ExportError("to_native_state_dict: a bare state dict needs its MiniMindConfig")
        state_dict = dict(model)
    else:
        config = model.config if config is None else config
        state_dict = model.state_dict()
    if getattr(config, "model_type", None) != "minimind":
        raise ExportError(f"not a MiniMind model (model_type={getattr(config, 'model_type', None)!r})")
    with torch.device("meta"):
        skeleton = MiniMindForCausalLM(config).state_dict()
    if config.tie_word_embeddings and "lm_head.weight" not in state_dict and "model.embed_tokens.weight" in state_dict:
        state_dict["lm_head.weight"] = state_dict["model.embed_tokens.weight"]  # a deduplicated (safetensors) dict
    missing = [key for key in skeleton if key not in state_dict]
    unexpected = [key for key in state_dict if key not in skeleton]
    if missing or unexpected:
        raise ExportError(
            f"state dict does not match MiniMind's keys (a PEFT or wrapped model? merge adapters first): "
            f"missing {missing[:6]}, unexpected {unexpected[:6]}"
        )
    return {key: state_dict[key].detach().to("cpu", dtype=dtype).contiguous() for key in skeleton}


def upstream_config_kwargs(config: MiniMindConfig) -> dict:
    """The upstream `MiniMindConfig(**kwargs)` of this model's generation (names of that generation).

    Also what `minimind-trl convert --config` accepts, so a native export round-trips the whole config.
    """
    if config.rope_parameters["rope_type"] not in ("default", "yarn"):
        raise ExportError(
            f"rope_parameters: rope type {config.rope_parameters['rope_type']!r} (transformers' scaling) has no upstream "
            "MiniMind equivalent (upstream only has YaRN); export to a transformers format instead"
        )
    kwargs = {
        "minimind_generation": config.minimind_generation,
        "hidden_size": config.hidden_size,
        "num_hidden_layers": config.num_hidden_layers,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "vocab_size": config.vocab_size,
        "intermediate_size": config.intermediate_size,
        "hidden_act": config.hidden_act,
        "max_position_embeddings": config.max_position_embeddings,
        "rms_norm_eps": config.rms_norm_eps,
        "rope_theta": config.rope_parameters["rope_theta"],
        "inference_rope_scaling": config.rope_parameters["rope_type"] == "yarn",
        "dropout": config.dropout,
        "flash_attn": config.flash_attn,
        "bos_token_id": config.bos_token_id,
        "eos_token_id": config.eos_token_id,
        "use_moe": config.use_moe,
        "num_experts_per_tok": config.num_experts_per_tok,
        "norm_topk_prob": config.norm_topk_prob,
    }
    rope = {k: v for k, v in config.rope_parameters.items() if k not in ("rope_theta", "rope_type")}
    if kwargs["inference_rope_scaling"] and rope != {k: v for k, v in UPSTREAM_YARN.items() if k != "rope_type"}:
        kwargs["rope_scaling"] = {"type": "yarn", **rope}  # non-default YaRN (minimind-trl extension)
    if config.minimind_generation == MINIMIND2:
        kwargs.update(
            n_routed_experts=config.num_experts,
            n_shared_experts=config.n_shared_experts,
            scoring_func=config.scoring_func,
            aux_loss_alpha=config.router_aux_loss_coef,
            seq_aux=config.seq_aux,
        )
        if config.moe_intermediate_size != config.intermediate_size:
            kwargs["moe_intermediate_size"] = config.moe_intermediate_size  # minimind-trl extension
        if not config.tie_word_embeddings:
            kwargs["tie_word_embeddings"] = False  # minimind-trl extension
    else:
        kwargs.update(
            head_dim=config.head_dim,
            tie_word_embeddings=config.tie_word_embeddings,
            num_experts=config.num_experts,
            moe_intermediate_size=config.moe_intermediate_size,
            router_aux_loss_coef=config.router_aux_loss_coef,
        )
    return kwargs


def export_native(
    model: torch.nn.Module,
    output_path: str | Path,
    dtype: torch.dtype | None = None,
    force: bool = False,
    write_config: bool = True,
) -> Path:
    """Write `model` as upstream's `.pth` (+ `<stem>.config.json` with its upstream config kwargs), atomically."""
    output_path = Path(output_path).absolute()
    check_native_outputs(output_path, force, write_config)
    sidecar = native_sidecar_path(output_path)
    state_dict = to_native_state_dict(model, dtype=dtype)
    output_path.parent.mkdir(parents=True, exist_ok=True)
    written = []
    try:
        tmp = _tmp_file(output_path)
        written.append(tmp)
        torch.save(state_dict, tmp)
        if write_config:
            tmp_config = _tmp_file(sidecar)
            written.append(tmp_config)
            tmp_config.write_text(json.dumps(upstream_config_kwargs(model.config), indent=2) + "\n")
            os.replace(tmp_config, sidecar)
        os.replace(tmp, output_path)
    except BaseException:
        for path in written:
            path.unlink(missing_ok=True)
        raise
    return output_path


def _is_json_object(path: Path) -> bool:
    try:
        return isinstance(json.loads(path.read_text(encoding="utf-8")), dict)
    except (OSError, ValueError):
        return False


def check_native_outputs(output_path: str | Path, force: bool, write_config: bool = True) -> None:
    """The `.pth` (a `torch.save` archive) and its `<stem>.config.json` sidecar (a JSON object) may be written:
    absent, or replaced with `force` only when they are what this export writes."""
    check_output_file(output_path, force, zipfile.is_zipfile, "torch.save (.pth)", ExportError)
    if write_config:
        check_output_file(native_sidecar_path(output_path), force, _is_json_object, "JSON config", ExportError)


def _tmp_file(target: Path) -> Path:
    fd, name = tempfile.mkstemp(prefix=f".{target.name}.tmp-", dir=target.parent)
    os.close(fd)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(name, 0o666 & ~umask)  # mkstemp files are private; the result should not be
    return Path(name)



__all__ = ["check_native_outputs", "export_native", "to_native_state_dict", "upstream_config_kwargs"]
