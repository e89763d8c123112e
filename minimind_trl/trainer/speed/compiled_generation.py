"""Rollouts through transformers' static KV cache and a `torch.compile`d forward (`compile_generation`).

At MiniMind's sizes a decoding step on a GPU is a few hundred small kernels, so kernel launches, not FLOPs, set its
time (benchmarks/README.md). transformers' answer is a static cache with a compiled forward, and with
`mode="reduce-overhead"` the compiled step is replayed as a CUDA graph. TRL's `GRPOTrainer` cannot reach it: it builds
its generation config with `disable_compile=True` and refuses that key in `generation_kwargs`. `compile_generation`
sets a torch.compile mode on the trainer's generation config after TRL built it: a static cache, compilation allowed,
that mode. transformers compiles on some accelerators only; the setting compiles on any device (`CompileConfig`'s own
switch), on CPU in place of the lean sampler, whose decode kernel is the measured CPU path.

The first rollout pays the compilation, and a later one a recompilation whenever its prompts need a larger cache than
any before (the cache is sized for the longest call so far) or its batch size changes (an agent's turns do). MoE
policies compile in pieces: the experts' routing has data-dependent shapes (graph breaks). Refused where it would be
silently undone or is unverified: activation checkpointing (TRL switches it off and on around every rollout, and each
switch adds a hook that forces a recompilation, until torch gives up and runs eagerly), DeepSpeed ZeRO-3 and FSDP
(weights gathered for each rollout), and the settings of the lean sampler or of the cache it replaces.

Which mode, if any, is faster on a GPU is what `benchmarks/gpu_check.sh`'s `bench_compile` part measures; none is the
default until a GPU measurement says so.
"""

import logging

from ...errors import RecipeError
from ..checks.weight_partitioning import weight_partitioning
from ..trl_private import compile_on_any_device

logger = logging.getLogger(__name__)

# torch.compile's modes
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def check_compile_generation(args) -> None:
    """The config's value and the settings it cannot go with, each named (called while the config is built)."""
    mode = args.compile_generation
    if isinstance(mode, str) and mode.lower() == "none":
        args.compile_generation = mode = None  # the command line's spelling of None
    if mode is None:
        return
    if mode not in COMPILE_MODES:
        raise RecipeError(f"compile_generation must be one of {', '.join(COMPILE_MODES)} or None, got {mode!r}")
    if args.use_vllm:
        raise RecipeError("compile_generation compiles transformers' generate; with use_vllm: true vLLM generates")
    if args.use_transformers_continuous_batching:
        raise RecipeError("compile_generation needs transformers' generate, not use_transformers_continuous_batching")
    if args.cache_implementation not in (None, "static"):
        raise RecipeError(
            f"compile_generation needs cache_implementation: static (or unset), got {args.cache_implementation!r}"
        )
    clashing = sorted({"cache_implementation", "compile_config", "disable_compile"} & set(args.generation_kwargs or {}))
    if clashing:
        raise RecipeError(f"compile_generation sets {', '.join(clashing)} itself: remove it from generation_kwargs")
    if args.activation_checkpointing or args.gradient_checkpointing:
        raise RecipeError(
            "compile_generation with activation_checkpointing: TRL switches checkpointing off and on around every "
            "rollout, and each switch forces a recompilation until torch runs the forward eagerly; set one of them off"
        )
    if args.sampling_weights_dtype not in (None, "auto"):
        raise RecipeError("sampling_weights_dtype is the lean sampler's, which compile_generation replaces")


def compile_generation(trainer) -> bool:
    """Switch the trainer's generation config to the static cache and the compiled forward of
    `args.compile_generation`; False when it is unset (nothing changed)."""
    from transformers import CompileConfig

    mode = trainer.args.compile_generation
    if mode is None:
        return False
    if weight_partitioning(trainer) is not None:
        raise RecipeError("compile_generation with DeepSpeed ZeRO-3 or FSDP (weights gathered per rollout) is not "
                          "verified; unset it, or train with ZeRO-2")  # fmt: skip
    config = trainer.generation_config
    config.cache_implementation = "static"
    config.disable_compile = False
    config.compile_config = CompileConfig(mode=mode)
    compile_on_any_device(config.compile_config)  # as asked: transformers compiles on some accelerators only
    if trainer.accelerator.device.type == "cpu":
        logger.info("compile_generation: %s on CPU, in place of the lean sampler (its decode kernel is the CPU path "
                    "measured in benchmarks/README.md)", mode)  # fmt: skip
    return True


__all__ = ["COMPILE_MODES", "check_compile_generation", "compile_generation"]
