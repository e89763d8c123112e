"""Modules that moved, importable under their former names for one more release.

Python code (`from minimind_trl.trainer.advantages import register_adv_est`) and recipes
(`loss_type: minimind_trl.trainer.policy_losses:...`, a demo's reward as `module:function`) written against an
earlier layout keep working: the old name resolves to the module's new home (the same module object, so a
registry filled through either name is one registry) with a `DeprecationWarning` naming the new one. The package's
`__init__` installs the finder; `MOVED` is the one table of moves.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

_TRAINER_GROUPS = {
    "algorithm": ("advantages", "policy_losses", "loss_aggregation", "dynamic_sampling", "seams", "seam_choice"),
    "speed": ("fast_sampling", "decode_kernel", "fast_logprobs", "cpu_precision", "prompt_sharing"),
    "outputs": ("output_dir", "checkpointing", "checkpointed_training", "run_identity", "run_safety", "model_card"),
    "rollouts": ("vllm_rollouts", "tool_loop_checks"),
    "checks": ("config_ranges", "extras", "reward_checks"),
}

MOVED: dict[str, str] = {
    **{f"minimind_trl.trainer.{name}": f"minimind_trl.trainer.{group}.{name}"
       for group, names in _TRAINER_GROUPS.items() for name in names},  # fmt: skip
    **{f"minimind_trl.conversion.{name}": f"minimind_trl.formats.{name}"
       for name in ("architectures", "native_config", "export_native")},  # fmt: skip
    "minimind_trl.cli.demo": "minimind_trl.demos.default",
    **{f"minimind_trl.cli.demo_{name}": f"minimind_trl.demos.{name}"
       for name in ("agent", "agent_task", "held_out", "minimind3", "model", "output_dir", "progress", "reward_model",
                    "variants")},  # fmt: skip
}


class _Alias(importlib.abc.Loader):
    def __init__(self, new_name: str):
        self.new_name = new_name
        self.spec = None

    def create_module(self, spec):
        module = importlib.import_module(self.new_name)
        self.spec = module.__spec__
        return module

    def exec_module(self, module):
        # The module ran when it was imported under its own name. The import by the alias set its `__spec__` to
        # the alias's: put back, so the module stays what it was.
        module.__spec__ = self.spec


class MovedModuleFinder(importlib.abc.MetaPathFinder):
    """Finds a former module name in `MOVED` and hands out the module under its new name."""

    def find_spec(self, fullname, path=None, target=None):
        new_name = MOVED.get(fullname)
        if new_name is None:
            return None
        warnings.warn(f"{fullname} moved to {new_name}; import it from there (the old name goes in a later release)",
                      DeprecationWarning, stacklevel=2)  # fmt: skip
        return importlib.util.spec_from_loader(fullname, _Alias(new_name))


def install() -> None:
    """Put the finder on `sys.meta_path` once per process."""
    if not any(isinstance(finder, MovedModuleFinder) for finder in sys.meta_path):
        sys.meta_path.append(MovedModuleFinder())


__all__ = ["MOVED", "MovedModuleFinder", "install"]
