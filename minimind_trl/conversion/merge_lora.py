"""`minimind-trl merge-lora ADAPTER_DIR OUTPUT_DIR`: fold a LoRA adapter into its base model.

A `--use_peft` run saves only the adapter (`adapter_config.json` + `adapter_model.safetensors`). Merging gives
a full MiniMind folder (safetensors, config with `auto_map` and the modeling code, tokenizer) that loads with
`from_pretrained` like any other, exports with `minimind-trl export` and pushes to the Hub. The output folder
is written atomically (a temporary folder renamed into place).
"""

import json
import logging
import os

from minimind_trl_cli.conversion import merge_lora_parser

from ..errors import MergeError
from ..loading_utils import (
    DTYPES,
    check_output_apart,
    check_output_folder,
    check_writable,
    os_error_line,
    write_folder_atomically,
)

logger = logging.getLogger(__name__)


ADAPTER_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")


def read_adapter_config(adapter_dir: str) -> dict:
    """The adapter's `adapter_config.json`, checked to be a LoRA adapter with its weights beside it."""
    path = os.path.join(adapter_dir, "adapter_config.json")
    if not os.path.isfile(path):
        raise MergeError(f"{adapter_dir} is not a LoRA adapter folder (no adapter_config.json)")
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError) as exc:
        raise MergeError(f"{path}: not a readable adapter config ({type(exc).__name__}: {exc})") from exc
    if not isinstance(config, dict) or config.get("peft_type", "LORA") != "LORA":
        kind = config.get("peft_type") if isinstance(config, dict) else type(config).__name__
        raise MergeError(f"{path}: not a LoRA adapter config (peft_type {kind!r}); merge-lora merges LoRA adapters")
    if not any(os.path.isfile(os.path.join(adapter_dir, name)) for name in ADAPTER_WEIGHTS):
        names = " or ".join(ADAPTER_WEIGHTS)
        raise MergeError(f"{adapter_dir}: no adapter weights ({names}) beside adapter_config.json")
    return config


def _has_tokenizer(folder: str) -> bool:
    return os.path.isfile(os.path.join(folder, "tokenizer_config.json"))


def merge_lora(
    adapter_dir: str, output_dir: str, base_model: str | None = None, dtype: str = "float32", force: bool = False
):
    """Load base + adapter, merge the LoRA weights into the base layers and save the full model."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import minimind_trl  # noqa: F401  (registers MiniMind with the Auto classes)
    from ..models.minimind.tokenization_minimind import portable_tokenizer

    config = read_adapter_config(adapter_dir)
    base = base_model or config.get("base_model_name_or_path")
    if not base:
        raise MergeError(f"{adapter_dir}/adapter_config.json names no base model; pass --base_model")
    if not os.path.exists(base) and (os.path.isabs(base) or base.startswith(".")):
        raise MergeError(
            f"base model {base} (from {'--base_model' if base_model else 'adapter_config.json'}) does not exist"
        )
    if dtype not in DTYPES:
        raise MergeError(f"dtype must be float32, bfloat16 or float16, got {dtype!r}")
    recorded = config.get("base_model_name_or_path")
    if base_model and recorded and os.path.normpath(base_model) != os.path.normpath(recorded):
        logger.warning(
            "--base_model %s differs from the base the adapter was trained on (%s, in adapter_config.json); the "
            "merge is only meaningful if they hold the same weights",
            base_model,
            recorded,
        )
    check_output_apart(output_dir, [adapter_dir, base], MergeError, "output_dir")
    check_output_folder(output_dir, force, MergeError, "output_dir")
    check_writable(output_dir, MergeError, "output_dir")

    model = AutoModelForCausalLM.from_pretrained(base, dtype=DTYPES[dtype])
    try:
        merged = PeftModel.from_pretrained(model, adapter_dir).merge_and_unload()
    except (RuntimeError, ValueError, KeyError) as exc:  # shapes or target modules of another base model
        raise MergeError(
            f"{adapter_dir} does not fit the base model {base} ({type(exc).__name__}: {str(exc).splitlines()[0]}); "
            "pass the base it was trained on with --base_model"
        ) from exc
    merged.config._name_or_path = output_dir
    tokenizer = portable_tokenizer(AutoTokenizer.from_pretrained(adapter_dir if _has_tokenizer(adapter_dir) else base))

    def write(folder):
        merged.save_pretrained(folder)
        tokenizer.save_pretrained(folder)

    try:
        write_folder_atomically(output_dir, write, force=force, error=MergeError)
    except OSError as exc:
        raise MergeError(f"{output_dir}: cannot write the merged model ({os_error_line(exc)})") from exc
    return merged


def main(argv: list[str] | None = None) -> int:
    """`minimind-trl merge-lora`; user errors raise `MergeError` (the `minimind-trl` command reports them)."""
    args = merge_lora_parser().parse_args(argv)
    merge_lora(args.adapter_dir, args.output_dir, base_model=args.base_model, dtype=args.dtype, force=args.force)
    print(f"merged {args.adapter_dir} into {args.output_dir}")
    return 0


__all__ = ["MergeError", "main", "merge_lora"]
