"""Loading InternLM2 reward models in the published checkpoint layout, natively and strictly.

The published remote code does not work on transformers 5 (its RoPE buffers come up as zeros), so the weights are
read here into `InternLM2ForRewardModel` (transformers' own pieces) and the non-persistent buffers are rebuilt.
"""

import json
import os
from pathlib import Path

import torch
from transformers import PretrainedConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from ...loading_utils import check_state_dict_matches
from ...loading_utils import resolve_dtype as resolve_dtype_name
from .modeling_internlm2 import InternLM2ForRewardModel, InternLM2RewardConfig

CHECKPOINT_FILES = (
    "model.safetensors.index.json",
    "model.safetensors",
    "pytorch_model.bin.index.json",
    "pytorch_model.bin",
)

def resolve_model_folder(path_or_repo: str | os.PathLike, revision: str | None = None, allow_patterns=None) -> Path:
    """A local folder as is; otherwise a Hub repo id, fetched with `huggingface_hub.snapshot_download`."""
    path = Path(path_or_repo).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise NotADirectoryError(f"{path} is a file; pass the folder that holds config.json and the weights")
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(str(path_or_repo), revision=revision, allow_patterns=allow_patterns))
    except Exception as error:  # re-raised with the path the user gave; the cause is kept
        raise OSError(f"{path_or_repo} is neither a local folder nor a downloadable Hub repo: {error}") from error


def load_internlm2_state_dict(folder: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The tensors of a checkpoint folder in the published layout, on CPU.

    Reads, in this order of preference, `model.safetensors.index.json` (sharded), `model.safetensors`,
    `pytorch_model.bin.index.json` or `pytorch_model.bin` (`torch.load(weights_only=True)`).
    """
    folder = Path(folder)
    found = next((folder / name for name in CHECKPOINT_FILES if (folder / name).is_file()), None)
    if found is None:
        raise FileNotFoundError(f"{folder}: no checkpoint found (looked for {', '.join(CHECKPOINT_FILES)})")
    if found.name.endswith(".index.json"):
        weight_map = json.loads(found.read_text(encoding="utf-8")).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise ValueError(f"{found}: no 'weight_map' in the index")
        shards = sorted(set(weight_map.values()))
    else:
        weight_map, shards = None, [found.name]

    state: dict[str, torch.Tensor] = {}
    for shard in shards:
        shard_path = folder / shard
        if not shard_path.is_file():
            raise FileNotFoundError(f"{found}: shard {shard} is missing")
        tensors = _read_tensor_file(shard_path)
        if weight_map is not None:
            listed = {name for name, file in weight_map.items() if file == shard}
            if set(tensors) != listed:
                raise ValueError(
                    f"{shard_path}: tensors disagree with {found.name}: not in the shard "
                    f"{sorted(listed - set(tensors))}, not in the index {sorted(set(tensors) - listed)}"
                )
        duplicated = sorted(set(tensors) & set(state))
        if duplicated:
            raise ValueError(f"{shard_path}: tensors already loaded from another shard: {duplicated}")
        state.update(tensors)
    return state


def _read_tensor_file(path: Path) -> dict[str, torch.Tensor]:
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(path, device="cpu")
    state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ValueError(f"{path}: expected a flat state dict of tensors")
    return state


def resolve_dtype(dtype, config: PretrainedConfig, device: torch.device) -> torch.dtype:
    """None/"auto": the checkpoint's dtype on GPU, float32 on CPU (half-precision matmuls are slow there)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype in (None, "auto"):
        if device.type == "cpu":
            return torch.float32
        dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None) or "float32"
        if isinstance(dtype, torch.dtype):
            return dtype
    return resolve_dtype_name(dtype, ValueError)


def load_internlm2_reward_model(
    path_or_repo: str | os.PathLike,
    *,
    dtype: torch.dtype | str | None = None,
    device: torch.device | str | None = None,
    attn_implementation: str = "sdpa",
    revision: str | None = None,
) -> InternLM2ForRewardModel:
    """Load an InternLM2 reward model from a folder or Hub repo in the published layout, strictly, in eval mode.

    Args:
        path_or_repo: a folder with `config.json` (incl. `reward_token_id`) and the weights, or a Hub repo id
            such as `"internlm/internlm2-1_8b-reward"`.
        dtype: `torch.float32`/`float16`/`bfloat16` or their names; None: float16 (the checkpoint's) on GPU,
            float32 on CPU.
        device: where to put the model (default CPU).
        attn_implementation: `"sdpa"` (default), `"eager"` (the published code's) or any registered kernel.
        revision: Hub revision.
    """
    folder = resolve_model_folder(
        path_or_repo, revision, allow_patterns=["*.json", "*.safetensors", "*.bin", "tokenizer.model"]
    )
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise FileNotFoundError(f"{folder}: config.json is missing")
    raw_config = json.loads(config_file.read_text(encoding="utf-8"))
    if "reward_token_id" not in raw_config:
        raise ValueError(f"{config_file}: no 'reward_token_id' (is this an InternLM2 *reward* model?)")
    config = InternLM2RewardConfig.from_pretrained(folder)
    config._attn_implementation = attn_implementation
    device = torch.device(device or "cpu")
    dtype = resolve_dtype(dtype, config, device)

    state = load_internlm2_state_dict(folder)
    with torch.device("meta"):
        model = InternLM2ForRewardModel(config)
    check_state_dict_matches(
        model, state, f"{folder} does not match InternLM2ForRewardModel({type(config).__name__})", ValueError
    )
    model.load_state_dict({name: tensor.to(dtype) for name, tensor in state.items()}, strict=True, assign=True)
    del state
    # Non-persistent buffers are not in checkpoints; build them for real (this is what the remote code misses).
    model.model.rotary_emb = LlamaRotaryEmbedding(config)
    on_meta = [name for name, tensor in [*model.named_parameters(), *model.named_buffers()] if tensor.is_meta]
    if on_meta:
        raise RuntimeError(f"tensors left uninitialised after loading {folder}: {on_meta}")
    return model.to(device).eval().requires_grad_(False)


__all__ = ["load_internlm2_reward_model", "load_internlm2_state_dict", "resolve_dtype", "resolve_model_folder"]
