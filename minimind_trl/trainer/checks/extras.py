"""Optional packages a recipe switches on, checked before any model loads.

TRL imports vLLM when the trainer builds its rollout engine and transformers imports liger-kernel when training
starts, both after the policy, the reference and the reward model have loaded, and both fail there with a library
traceback. `check_extras` names the missing package first (`minimind-trl grpo`'s run plan, and
`MiniMindGRPOTrainer` before it loads anything). DeepSpeed is checked while the config is built
(`require_deepspeed_extra`), the logging integrations by the run plan.
"""

import os

from ...errors import RecipeError

# option -> (is it on, the module to find, how to install it)
EXTRAS = {
    "use_vllm": (lambda args: args.use_vllm, "vllm", "pip install vllm (docs/vllm.md)"),
    "use_liger_kernel": (lambda args: args.use_liger_kernel, "liger_kernel", "pip install liger-kernel"),
}


def _installed(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def missing_extra(args, options=tuple(EXTRAS)) -> str | None:
    """The message naming the first of `options` that needs a package that is not installed, or None."""
    for option in options:
        enabled, module, install = EXTRAS[option]
        if enabled(args) and not _installed(module):
            return f"{option}: true needs the {module} package, which is not installed: {install}"
    return None


def check_extras(args, options=tuple(EXTRAS)) -> None:
    """A `RecipeError` naming the option and the package when one of `options` needs a package that is not
    installed."""
    message = missing_extra(args, options)
    if message is not None:
        raise RecipeError(message)


def accelerate_flag(name: str) -> bool:
    """A switch `accelerate launch` sets in the environment (`ACCELERATE_USE_CPU`, `ACCELERATE_USE_DEEPSPEED`), read
    as transformers reads it (`strtobool`: y/yes/t/true/on/1 or n/no/f/false/off/0), so the package and the Trainer
    never disagree; another value is a `RecipeError` naming the variable, not transformers' unnamed `ValueError`."""
    from transformers.utils.generic import strtobool

    value = os.environ.get(name, "false")
    try:
        return bool(strtobool(value))
    except ValueError:
        raise RecipeError(f"environment variable {name}={value!r} must be true or false (1/0, yes/no, on/off)") \
            from None


def require_deepspeed_extra(args) -> None:
    """ZeRO (`accelerate launch` with a DeepSpeed config, or `deepspeed:`) without DeepSpeed installed: one line naming
    the extra, instead of transformers' version-check traceback while the arguments are parsed."""
    requested = args.deepspeed is not None or accelerate_flag("ACCELERATE_USE_DEEPSPEED")
    if requested and not _installed("deepspeed"):
        raise ValueError(
            "DeepSpeed ZeRO was requested (an accelerate DeepSpeed config or `deepspeed:`) but DeepSpeed is not "
            "installed: pip install 'minimind-trl[deepspeed]'"
        )


__all__ = ["EXTRAS", "accelerate_flag", "check_extras", "missing_extra", "require_deepspeed_extra"]
