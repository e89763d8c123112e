"""Where a LoRA adapter's base model is, recorded so that the adapter folder can move.

PEFT records the base in `adapter_config.json` (`base_model_name_or_path`) as the policy was named when training
started, relative to that working folder: `out/run/_base_model` for a native `.pth` policy converted into the run's
own folder, which is wrong as soon as the folder moves or `merge-lora` runs elsewhere. A run's adapters record it
instead (`record_portable_base`) as

* a path relative to the adapter's folder when the base lies inside the run's output folder (`_base_model`, or
  `../_base_model` from `checkpoint-N`): it moves and is copied with the run;
* an absolute path for a local base elsewhere: it holds from any working folder while the base stays;
* a Hub id unchanged.

`locate_recorded_base` reads it back: an absolute path as it is, a relative one in the adapter's folder first, then
in the working folder (what PEFT itself would read, for adapters written elsewhere); two spellings of one folder
(`path_identity.file_id`) are one.
"""

import json
import os

from .loading_utils import looks_local
from .path_identity import file_id, position_in

ADAPTER_CONFIG = "adapter_config.json"


def portable_base(base: str, adapter_folder: str, run_folder: str) -> str:
    """What `adapter_folder` (inside `run_folder`) records as its base `base` (as PEFT named it: relative to the
    working folder, or a Hub id): see the module doc."""
    if not base or file_id(base) is None:
        return base  # a Hub id, or nothing local to point at
    inside = position_in(base, run_folder)  # by file identity: a symlinked or relative spelling is the same folder
    if inside is not None:  # `adapter_folder` is `run_folder` or a folder in it, spelled from it
        return os.path.relpath(os.path.join(os.path.realpath(run_folder), *inside), os.path.realpath(adapter_folder))
    return os.path.abspath(base)


def record_portable_base(saved_folder: str, final_folder: str, run_folder: str) -> None:
    """Rewrite the base in `saved_folder/adapter_config.json` (a save staged for `final_folder`) as `portable_base`
    says; a folder without an adapter is left alone."""
    path = os.path.join(saved_folder, ADAPTER_CONFIG)
    if not os.path.isfile(path):
        return
    with open(path, encoding="utf-8") as f:
        config = json.load(f)
    base = config.get("base_model_name_or_path")
    portable = portable_base(base, final_folder, run_folder) if isinstance(base, str) else base
    if portable != base:
        config["base_model_name_or_path"] = portable
        with open(path, "w", encoding="utf-8") as f:
            json.dump(config, f, indent=2, sort_keys=True)


def locate_recorded_base(recorded: str, adapter_dir: str) -> tuple[str | None, list[str]]:
    """The local folder an adapter's recorded base names, and every distinct folder it could name (more than one:
    ambiguous). (None, []) when no local folder matches: then it is a Hub id, or missing."""
    candidates = [recorded] if os.path.isabs(recorded) else [os.path.join(adapter_dir, recorded), recorded]
    found, seen = [], set()
    for candidate in candidates:
        identity = file_id(candidate)
        if identity is not None and os.path.isdir(candidate) and identity not in seen:
            seen.add(identity)
            found.append(candidate)
    return (found[0] if len(found) == 1 else None), found


def could_be_hub_id(name: str) -> bool:
    """Whether `name` is a valid Hub repository id that cannot only be a local path (`owner/name`, `name`)."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    if looks_local(name):
        return False
    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return True


__all__ = ["ADAPTER_CONFIG", "could_be_hub_id", "locate_recorded_base", "portable_base", "record_portable_base"]
