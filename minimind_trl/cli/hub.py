"""Hand-off of a trained policy to the Hub: the checks before a push.

`check_push_folder` makes sure a pushed folder loads without this package: weights as safetensors, a tokenizer,
and `config.json` with `auto_map` next to the modeling code and the modules it imports (or a complete LoRA adapter).
"""

import json
import os

from ..errors import PushCheckError


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


def check_push_on_all_ranks(trainer) -> None:
    """`check_push_folder` on the main process; every rank raises its verdict (pushing saves collectively)."""
    from accelerate.utils import broadcast_object_list

    verdict = [None]
    if trainer.is_world_process_zero():
        try:
            check_push_folder(trainer.args.output_dir)
        except PushCheckError as exc:
            verdict = [str(exc)]
    if trainer.accelerator.num_processes > 1:
        broadcast_object_list(verdict)
    if verdict[0] is not None:
        raise PushCheckError(verdict[0])


__all__ = ["PushCheckError", "check_push_folder", "check_push_on_all_ranks"]
