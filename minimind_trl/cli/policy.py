"""Where the policy comes from (a `save_pretrained` folder, a Hub id or a native MiniMind `.pth`), and how it loads.

TRL builds the policy *and* its frozen reference model from a path (`from_pretrained`, under DeepSpeed ZeRO-3
already partitioned at load), so a native `.pth` is first converted by the same code as `minimind-trl convert`
into `<output_dir>/_base_model` (the main process converts, the others wait; a resume reuses it). The `_`
prefix keeps it out of the Trainer's Hub uploads.
"""

import importlib.util
import json
import os
import sys
from dataclasses import dataclass

from ..conversion.convert import convert_checkpoint
from ..formats.native_config import assumed_settings, native_sidecar_path, read_config_file
from ..errors import ModelSourceError
from ..loading_utils import looks_local
from ..models.minimind.peft_defaults import MINIMIND_LORA_TARGETS
from ..models.minimind.tokenization_minimind import portable_tokenizer
from ..trainer.outputs.output_dir import CONVERTED_DIR
from ..trainer.speed.cpu_precision import runs_on_cpu

NATIVE_SUFFIXES = (".pth", ".pt")
SOURCE_MARKER = "minimind_source.json"


@dataclass(frozen=True)
class NativeConversion:
    """What converting a native `.pth` policy reads of the recipe: the checkpoint, the tokenizer it gets
    (`tokenizer_name_or_path`), its query heads (`native_num_attention_heads`) and `native_config`."""

    checkpoint: str
    tokenizer: str
    num_attention_heads: int | None = None
    settings: dict | None = None


@dataclass(frozen=True)
class PolicySource:
    """What `from_pretrained` gets (`path`), what the model card calls the base model (`base_model`) and, for a
    native `.pth`, its conversion into `path`."""

    path: str
    tokenizer_path: str
    base_model: str
    native: NativeConversion | None = None


def is_native_checkpoint(name_or_path: str) -> bool:
    return name_or_path.endswith(NATIVE_SUFFIXES)


def _looks_local(name_or_path: str) -> bool:
    return looks_local(name_or_path, NATIVE_SUFFIXES)


def check_model_source(model_name_or_path: str | None, tokenizer_name_or_path: str | None) -> None:
    """Everything about the policy's location that can be checked without loading anything."""
    if not model_name_or_path:
        raise ModelSourceError("model_name_or_path is required (a save_pretrained folder, Hub id or native .pth)")
    if not os.path.exists(model_name_or_path):
        if _looks_local(model_name_or_path):
            raise ModelSourceError(f"model_name_or_path: {model_name_or_path} does not exist")
    elif os.path.isdir(model_name_or_path) and not os.path.isfile(os.path.join(model_name_or_path, "config.json")):
        raise ModelSourceError(
            f"model_name_or_path: {model_name_or_path} has no config.json (not a save_pretrained folder)"
        )
    if is_native_checkpoint(model_name_or_path) and not tokenizer_name_or_path:
        raise ModelSourceError(
            f"model_name_or_path {model_name_or_path} is a native MiniMind checkpoint, which has no tokenizer: set "
            "tokenizer_name_or_path (e.g. MiniMind's model/ folder with tokenizer.json)"
        )
    if tokenizer_name_or_path and not os.path.exists(tokenizer_name_or_path) and _looks_local(tokenizer_name_or_path):
        raise ModelSourceError(f"tokenizer_name_or_path: {tokenizer_name_or_path} does not exist")


def _source_fingerprint(checkpoint: str, tokenizer: str, num_attention_heads: int | None, settings: dict) -> dict:
    stat = os.stat(checkpoint)
    return {
        "checkpoint": os.path.abspath(checkpoint),
        "size": stat.st_size,
        "mtime_ns": stat.st_mtime_ns,
        "tokenizer": os.path.abspath(tokenizer) if os.path.exists(tokenizer) else tokenizer,
        "num_attention_heads": num_attention_heads,
        "settings": settings,
    }


def convert_native_policy(
    checkpoint: str,
    tokenizer: str,
    output_dir: str,
    num_attention_heads: int | None = None,
    native_config: dict | None = None,
) -> str:
    """Convert a native `.pth` into `<output_dir>/_base_model` unless an identical conversion is already there.

    As `minimind-trl convert` does, settings the tensors cannot show come from the `<stem>.config.json` sidecar
    that `minimind-trl export --format native` writes beside the checkpoint, when there is one, and from the
    recipe's `native_config` (which wins, as `convert --set` does); each one still assumed is said on stderr."""
    sidecar = native_sidecar_path(checkpoint)
    settings = read_config_file(sidecar) if sidecar.is_file() else {}
    settings.update(native_config or {})
    folder = os.path.join(output_dir, CONVERTED_DIR)
    marker = os.path.join(folder, SOURCE_MARKER)
    fingerprint = _source_fingerprint(checkpoint, tokenizer, num_attention_heads, settings)
    if os.path.isfile(marker):
        with open(marker) as f:
            if json.load(f) == fingerprint:
                return folder
    model = convert_checkpoint(
        checkpoint,
        folder,
        num_attention_heads=num_attention_heads,
        overrides=settings,
        tokenizer=tokenizer,
        dtype="float32",
        force=True,
    )
    for line in assumed_settings(model.config, settings, num_attention_heads):
        print(f"{checkpoint}: {line}", file=sys.stderr)
    with open(marker, "w") as f:
        json.dump(fingerprint, f, indent=2)
    return folder


def check_policy_weights(name_or_path: str, revision: str = "main") -> None:
    """Refuse a MiniMind policy folder whose weights do not fit its config (wrong generation, width, missing tensors).

    TRL loads the policy and the reference with a plain `from_pretrained`, which (transformers' contract) initialises
    missing weights at random and only reports them; the loading info of one load here makes that an error.
    """
    from transformers import AutoConfig

    from ..loading_utils import loading_info_problems, whole_model_loading
    from ..models.minimind.modeling_minimind import MiniMindForCausalLM

    try:
        config = AutoConfig.from_pretrained(name_or_path, revision=revision)
    except (OSError, ValueError):
        return  # not readable without remote code or the Hub: TRL's own loading reports it
    if config.model_type != "minimind":
        return
    with whole_model_loading():
        _, info = MiniMindForCausalLM.from_pretrained(name_or_path, revision=revision, output_loading_info=True)
    problems = loading_info_problems(info)
    if problems:
        raise ModelSourceError(
            f"model_name_or_path: the weights in {name_or_path} do not fit its config "
            f"({config.minimind_generation}, hidden_size {config.hidden_size}): {problems}"
        )


def policy_source(model_args, script_args, output_dir: str) -> PolicySource:
    """Where the policy loads from (the run plan's part: its location is checked, nothing is read): a folder or Hub
    id as it is, a native `.pth` from its conversion in `<output_dir>/_base_model`. `native_config` applies to a
    native `.pth` only."""
    name = model_args.model_name_or_path
    tokenizer = script_args.tokenizer_name_or_path
    check_model_source(name, tokenizer)
    if not is_native_checkpoint(name):
        if getattr(script_args, "native_config", None):
            raise ModelSourceError(
                f"native_config applies to a native .pth policy; {name} is a Hugging Face folder or Hub id whose "
                f"config.json already records these settings (remove native_config)"
            )
        return PolicySource(path=name, tokenizer_path=tokenizer or name, base_model=name)
    folder = os.path.join(output_dir, CONVERTED_DIR)
    native = NativeConversion(name, tokenizer, script_args.native_num_attention_heads,
                              getattr(script_args, "native_config", None))  # fmt: skip
    return PolicySource(path=folder, tokenizer_path=folder, base_model=name, native=native)


def prepare_policy(source: PolicySource, revision: str = "main") -> PolicySource:
    """Make `source.path` loadable: convert a native `.pth` there (the caller runs this on the main process first),
    or check a MiniMind folder's weights (at `revision`) against its config."""
    native = source.native
    if native is None:
        check_policy_weights(source.path, revision=revision)
        return source
    convert_native_policy(
        native.checkpoint, native.tokenizer, os.path.dirname(source.path), native.num_attention_heads, native.settings
    )
    return source


def resolve_policy(model_args, script_args, training_args) -> PolicySource:
    """The policy's `from_pretrained` path (`policy_source`), converting a native `.pth` on the main process first."""
    source = policy_source(model_args, script_args, training_args.output_dir)
    if source.native is None:
        return prepare_policy(source, model_args.model_revision)
    with training_args.main_process_first(local=training_args.save_on_each_node, desc="converting the native policy"):
        return prepare_policy(source, model_args.model_revision)


def load_tokenizer(tokenizer_path: str, revision: str = "main"):
    """The policy's tokenizer, left-padded (TRL generates from left-padded prompts); it must have a chat template."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(
            tokenizer_path, revision=revision, padding_side="left", truncation_side="left"
        )
        tokenizer = portable_tokenizer(tokenizer)  # checkpoints and Hub pushes load on transformers 4.57 too
    except (OSError, ValueError) as exc:
        raise ModelSourceError(f"cannot load a tokenizer from {tokenizer_path}: {exc}") from exc
    if not tokenizer.chat_template:
        raise ModelSourceError(
            f"the tokenizer at {tokenizer_path} has no chat template; MiniMind's RLAIF prompts are conversations"
        )
    return tokenizer


def lora_config(model_args):
    """TRL's `get_peft_config`, with MiniMind's default LoRA targets written out (the list the package registers
    with PEFT), so the recipe record and the run card name them."""
    from trl import get_peft_config

    if model_args.use_peft and not model_args.lora_target_modules and not model_args.lora_target_parameters:
        model_args.lora_target_modules = list(MINIMIND_LORA_TARGETS)
    return get_peft_config(model_args)


def quantization_config(model_args, training_args):
    """TRL's `get_quantization_config` (the policy's weights in bitsandbytes 4 or 8 bits, trained through a LoRA
    adapter: QLoRA), or None; refused, naming the flag, where it cannot run: on CPU (bitsandbytes quantizes for
    CUDA), without bitsandbytes, without `use_peft` (quantized weights cannot be trained themselves)."""
    from trl import get_quantization_config

    flags = [flag for flag in ("load_in_4bit", "load_in_8bit") if getattr(model_args, flag)]
    if not flags:
        return None
    flag = f"--{flags[0]} true"  # TRL's ModelConfig refuses both at once
    if not model_args.use_peft:
        raise ModelSourceError(
            f"{flag}: quantized weights cannot be trained themselves; train a LoRA adapter on them (QLoRA): add "
            "--use_peft true (docs/training.md#qlora-a-quantized-policy)"
        )
    if runs_on_cpu(training_args.use_cpu):
        raise ModelSourceError(
            f"{flag}: bitsandbytes quantizes the policy for a CUDA GPU, and this run is on the CPU; leave the flag out "
            "(MiniMind's sizes train unquantized on a CPU)"
        )
    if importlib.util.find_spec("bitsandbytes") is None:
        raise ModelSourceError(f"{flag} needs the bitsandbytes package, which is not installed: pip install bitsandbytes")
    return get_quantization_config(model_args)


def model_init_kwargs(model_args, training_args) -> dict:
    """`from_pretrained` arguments for the policy and the reference model (no remote code on the default path)."""
    kwargs = {
        "revision": model_args.model_revision,
        "dtype": model_args.dtype,
        "attn_implementation": model_args.attn_implementation,
        "trust_remote_code": training_args.trust_remote_code,
    }
    kwargs.update(training_args.model_init_kwargs or {})
    return kwargs


__all__ = [
    "CONVERTED_DIR",
    "MINIMIND_LORA_TARGETS",
    "ModelSourceError",
    "NativeConversion",
    "PolicySource",
    "check_model_source",
    "check_policy_weights",
    "convert_native_policy",
    "is_native_checkpoint",
    "load_tokenizer",
    "lora_config",
    "model_init_kwargs",
    "policy_source",
    "prepare_policy",
    "quantization_config",
    "resolve_policy",
]
