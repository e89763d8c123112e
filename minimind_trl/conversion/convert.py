"""`minimind-trl convert`: native MiniMind checkpoints (`.pth` state dicts) -> Hugging Face folders.

The checkpoint is read safely (`weights_only=True`), its architecture inferred (`native_config`), the model
built and loaded strictly, and only then a `save_pretrained` folder written, atomically.
"""

import sys
from collections.abc import Mapping
from pathlib import Path

import torch
from minimind_trl_cli.conversion import convert_parser
from transformers.initialization import no_init_weights

from ..errors import ConversionError
from ..loading_utils import (
    check_finite_weights,
    check_output_apart,
    check_output_folder,
    check_state_dict_matches,
    check_writable,
    os_error_line,
    preview,
    resolve_dtype,
    write_folder_atomically,
)
from ..models.minimind.configuration_minimind import MiniMindConfig
from ..models.minimind.modeling_minimind import MiniMindForCausalLM
from ..models.minimind.tokenization_minimind import portable_tokenizer
from ..formats.native_config import (
    EMBED_KEY,
    assumed_settings,
    describe,
    infer_config,
    native_sidecar_path,
    parse_set_options,
    read_config_file,
)

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
        raise ConversionError(f"{path}: entries that are not tensors: {preview(not_tensors)}")
    return dict(obj)


# --------------------------------------------------------------------------- strict loading


def check_state_dict(model: torch.nn.Module, state_dict: Mapping[str, torch.Tensor], source: str = "checkpoint"):
    """Raise naming every missing, unexpected and mis-shaped key (before anything is loaded)."""
    check_state_dict_matches(
        model, state_dict, f"{source} does not match the inferred MiniMind architecture", ConversionError
    )
    floating = [key for key, value in state_dict.items() if not value.is_floating_point()]
    if floating:
        raise ConversionError(f"{source}: non-floating-point tensors: {preview(floating)}")
    check_finite_weights(state_dict, source, ConversionError)


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
    target = state_dict[EMBED_KEY].dtype if dtype == "auto" else resolve_dtype(dtype, ConversionError)
    return model.to(target)


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

    Everything is read, built and checked before anything is written. Returns the loaded model. `force` replaces
    an earlier output (a folder of model files); never the checkpoint, a folder holding it, or the user's files.
    """
    sources = [checkpoint, tokenizer, native_sidecar_path(checkpoint)]
    check_output_apart(output_dir, sources, ConversionError, "output_dir")
    check_output_folder(output_dir, force, ConversionError, "output_dir")
    check_writable(str(output_dir), ConversionError, "output_dir")
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

    try:  # a full disk midway leaves nothing (the folder is written aside and renamed into place)
        write_folder_atomically(output_dir, write, force=force, error=ConversionError)
    except OSError as exc:
        raise ConversionError(f"{output_dir}: cannot write the converted model ({os_error_line(exc)})") from exc
    return model


def _load_tokenizer(tokenizer_dir: str | Path):
    from transformers import AutoTokenizer

    try:
        return portable_tokenizer(AutoTokenizer.from_pretrained(str(tokenizer_dir)))
    except (OSError, ValueError) as exc:
        raise ConversionError(f"{tokenizer_dir}: cannot load a tokenizer: {exc}") from exc


# --------------------------------------------------------------------------- CLI


def main(argv: list[str] | None = None) -> int:
    """`minimind-trl convert`; user errors raise `ConversionError` (the `minimind-trl` command reports them)."""
    args = convert_parser().parse_args(argv)
    config_file = args.config
    if config_file is None and native_sidecar_path(args.checkpoint).is_file():
        config_file = native_sidecar_path(args.checkpoint)
        print(f"reading settings from {config_file} (written by `minimind-trl export --format native`; --set wins)")
    check_output_apart(args.output_dir, [config_file], ConversionError, "output_dir")
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
    config = model.config
    print(f"{args.checkpoint}: {describe(config)}")
    for line in assumed_settings(config, overrides, args.num_attention_heads):
        print(line)
    print(f"wrote {Path(args.output_dir)} ({str(model.dtype).removeprefix('torch.')}, safetensors)")
    return 0

