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

from ..adapter_base import ADAPTER_CONFIG, could_be_hub_id, locate_recorded_base
from ..errors import MergeError
from ..loading_utils import (
    DTYPES,
    check_output_apart,
    check_output_folder,
    check_writable,
    os_error_line,
    write_folder_atomically,
)
from ..path_identity import file_id

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


def recorded_base(config: dict, adapter_dir: str) -> tuple[str, str]:
    """The base model `adapter_config.json` records, found as `adapter_base.locate_recorded_base` says (in the
    adapter's folder, then the working folder), or the recorded Hub id; and where it came from, for messages."""
    recorded = config.get("base_model_name_or_path")
    if not recorded:
        raise MergeError(f"{adapter_dir}/{ADAPTER_CONFIG} names no base model; pass --base_model")
    found, candidates = locate_recorded_base(recorded, adapter_dir)
    if len(candidates) > 1:
        raise MergeError(
            f"{adapter_dir}/{ADAPTER_CONFIG} records the base model {recorded!r}, which names two folders: "
            f"{candidates[0]} (beside the adapter) and {os.path.abspath(candidates[1])} (in the working folder); "
            "pass the one it was trained on with --base_model"
        )
    if found is not None:
        return found, ADAPTER_CONFIG
    where = recorded if os.path.isabs(recorded) else f"{os.path.join(adapter_dir, recorded)} nor {recorded}"
    if not could_be_hub_id(recorded):
        raise MergeError(
            f"{adapter_dir}/{ADAPTER_CONFIG} records the base model {recorded!r}, which is not there (neither "
            f"{where}); pass the base it was trained on with --base_model"
        )
    return recorded, f"{ADAPTER_CONFIG}; not a folder here, neither {where}, so a Hub id"


def warn_if_not_the_recorded_base(base_model: str, config: dict, adapter_dir: str) -> None:
    """Warn when `--base_model` is not the folder (by file identity) or Hub id the adapter records."""
    recorded = config.get("base_model_name_or_path")
    if not recorded:
        return
    found, _ = locate_recorded_base(recorded, adapter_dir)
    same = file_id(base_model) == file_id(found) if found and file_id(base_model) else base_model == recorded
    if not same:
        logger.warning(
            "--base_model %s differs from the base the adapter was trained on (%s, in %s); the merge is only "
            "meaningful if they hold the same weights",
            base_model,
            found or recorded,
            ADAPTER_CONFIG,
        )


def merge_lora(
    adapter_dir: str, output_dir: str, base_model: str | None = None, dtype: str = "float32", force: bool = False
):
    """Load base + adapter, merge the LoRA weights into the base layers and save the full model."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import minimind_trl  # noqa: F401  (registers MiniMind with the Auto classes)
    from ..models.minimind.tokenization_minimind import portable_tokenizer

    config = read_adapter_config(adapter_dir)
    base, source = (base_model, "--base_model") if base_model else recorded_base(config, adapter_dir)
    if not os.path.exists(base) and not could_be_hub_id(base):
        raise MergeError(f"base model {base} (from {source}) does not exist")
    if dtype not in DTYPES:
        raise MergeError(f"dtype must be float32, bfloat16 or float16, got {dtype!r}")
    if base_model:
        warn_if_not_the_recorded_base(base_model, config, adapter_dir)
    check_output_apart(output_dir, [adapter_dir, base], MergeError, "output_dir")
    check_output_folder(output_dir, force, MergeError, "output_dir")
    check_writable(output_dir, MergeError, "output_dir")

    try:  # a Hub id offline or not there, a folder that is not a model: one line, never the Hub's own traceback
        model = AutoModelForCausalLM.from_pretrained(base, dtype=DTYPES[dtype])
        tokenizer_source = adapter_dir if _has_tokenizer(adapter_dir) else base
        tokenizer = portable_tokenizer(AutoTokenizer.from_pretrained(tokenizer_source))
    except (OSError, ValueError) as exc:
        raise MergeError(
            f"cannot load the base model {base} (from {source}): {str(exc).strip().splitlines()[0]}; pass the base "
            "the adapter was trained on with --base_model"
        ) from exc
    try:
        merged = PeftModel.from_pretrained(model, adapter_dir).merge_and_unload()
    except (RuntimeError, ValueError, KeyError) as exc:  # shapes or target modules of another base model
        raise MergeError(
            f"{adapter_dir} does not fit the base model {base} ({type(exc).__name__}: {str(exc).splitlines()[0]}); "
            "pass the base it was trained on with --base_model"
        ) from exc
    merged.config._name_or_path = output_dir

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
