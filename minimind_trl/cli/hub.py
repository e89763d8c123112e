"""Hand-off of a trained policy to the Hub: the checks before a push.

`check_hub_repo` makes or finds the repository before any model loads (an unreachable Hub is one error line, not
a traceback after loading); `check_push_folder` makes sure a pushed folder loads without this package: weights as
safetensors, a tokenizer, and `config.json` with `auto_map` next to the modeling code and the modules it imports (or
a complete LoRA adapter).
"""

import json
import os

from ..errors import HubError, MiniMindTRLError, PushCheckError, RecipeError
from ..hub_uploads import create_hub_repo


def check_push_folder(folder: str) -> list[str]:
    """Check that `folder` loads without minimind-trl; returns the files that make it loadable."""
    if os.path.isfile(os.path.join(folder, "adapter_config.json")):
        required = ["adapter_config.json", "adapter_model.safetensors"]
    else:
        config_path = os.path.join(folder, "config.json")
        if not os.path.isfile(config_path):
            raise PushCheckError(f"{folder} has no config.json")
        with open(config_path) as f:
            config = json.load(f)
        auto_map = config.get("auto_map") or {}
        missing = [name for name in ("AutoConfig", "AutoModelForCausalLM") if name not in auto_map]
        if missing:
            raise PushCheckError(
                f"{config_path}: auto_map lacks {missing}; people without minimind-trl could not load it"
            )
        modules = _modules_with_their_imports(folder, {ref.split(".")[0] + ".py" for ref in auto_map.values()})
        weights = (
            "model.safetensors.index.json"
            if os.path.isfile(os.path.join(folder, "model.safetensors.index.json"))
            else "model.safetensors"
        )
        required = ["config.json", weights, *modules]
    required += ["tokenizer.json", "tokenizer_config.json"]
    absent = [name for name in required if not os.path.isfile(os.path.join(folder, name))]
    if absent:
        raise PushCheckError(f"{folder} lacks {absent}; refusing to push an incomplete model")
    return required


def _modules_with_their_imports(folder: str, modules: set[str]) -> list[str]:
    """`modules` and the sibling modules they import relatively, recursively, as transformers loads remote code
    (`modeling_minimind.py` imports `feed_forward_minimind.py` and `shared_prefix_minimind.py`)."""
    from transformers.dynamic_module_utils import get_relative_imports

    needed, pending = set(), set(modules)
    while pending:
        name = pending.pop()
        needed.add(name)
        path = os.path.join(folder, name)
        if os.path.isfile(path):
            pending |= {f"{module}.py" for module in get_relative_imports(path)} - needed
    return sorted(needed)


def check_hub_repo(training_args) -> str:
    """Before any model loads, for `--push_to_hub`: the repository id is one, and the Hub (`HF_ENDPOINT`) answers and
    makes or finds it, as the Trainer's constructor would later. Runs on the main process; every rank raises its
    verdict, an unreachable or refusing Hub as one `HubError` line. Returns the repository's id."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    repo_id = training_args.hub_model_id or os.path.basename(os.path.abspath(training_args.output_dir))
    try:
        validate_repo_id(repo_id)
    except HFValidationError as exc:
        flag = "hub_model_id" if training_args.hub_model_id else "push_to_hub without hub_model_id: output_dir's name"
        raise RecipeError(f"{flag} {repo_id!r} is not a Hub repository id ({str(exc).splitlines()[0]})") from None
    created = verdict_on_all_ranks(
        lambda: create_hub_repo(repo_id, token=training_args.hub_token, private=training_args.hub_private_repo),
        training_args.process_index == 0, training_args.world_size, HubError,
    )  # fmt: skip
    return created or repo_id


def verdict_on_all_ranks(check, is_main: bool, num_processes: int, error: type[MiniMindTRLError]):
    """`check()` on the main process; its `error` (the message) reaches every rank, which raises it. Returns what the
    check returned on the main process (None elsewhere)."""
    verdict, result = [None], None
    if is_main:
        try:
            result = check()
        except error as exc:
            verdict = [str(exc)]
    if num_processes > 1:
        from accelerate.utils import broadcast_object_list

        broadcast_object_list(verdict)
    if verdict[0] is not None:
        raise error(verdict[0])
    return result


__all__ = ["PushCheckError", "check_hub_repo", "check_push_folder", "verdict_on_all_ranks"]
