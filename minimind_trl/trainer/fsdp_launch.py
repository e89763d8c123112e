"""FSDP2 under `accelerate launch` (recipes/accelerate/fsdp.yaml): what accelerate, transformers and TRL leave undone.

* What a launch may ask for (`check_fsdp_launch`, while the config is built, before any model loads): FSDP2
  (`fsdp_version: 2`) saving `FULL_STATE_DICT`. With `SHARDED_STATE_DICT` transformers writes no `model.safetensors`,
  neither in a checkpoint nor at the end (only torch.distributed.checkpoint shards, whose metadata a resume reads
  with plain `pickle.load`); FSDP1 is accelerate's legacy path, which nothing here runs.
* FSDP on CPU (`shard_on_cpu`): accelerate 1.16 makes an FSDP launch FSDP only on accelerators; on CPU its
  `AcceleratorState` stays `MULTI_CPU` and the run trained with DDP, every process holding the whole model, without
  a word. torch's FSDP2 (`fully_shard`) runs on CPU with gloo, so the trainer gives such a launch the FSDP state
  accelerate would have given it on GPUs, before anything is prepared.
* Saving (`whole_model_saving`): FSDP2 shards a module in place by swapping its class for `FSDP<Class>`, defined in
  torch; `save_pretrained` then copies torch's FSDP sources into the folder as the model's code and names them in
  `config.json`'s `auto_map`. The gathered weights are saved as the policy's own class, each tied weight once (the
  gathered copies no longer share storage, so transformers would write `lm_head.weight` beside the embedding).
"""

import os
from contextlib import contextmanager

from ..errors import RecipeError

FSDP_CONFIG = "recipes/accelerate/fsdp.yaml"


def fsdp_requested() -> bool:
    """Whether `accelerate launch` was given an FSDP config (it sets `ACCELERATE_USE_FSDP` for every process)."""
    return os.environ.get("ACCELERATE_USE_FSDP", "false").lower() in ("1", "true")


def launch_plugin():
    """accelerate's `FullyShardedDataParallelPlugin` as the launch configured it (read from the environment, with
    accelerate's own defaults), or None when the launch is not FSDP. A configuration accelerate refuses, or FSDP1,
    is a `RecipeError` naming the accelerate config."""
    if not fsdp_requested():
        return None
    from accelerate.utils import FullyShardedDataParallelPlugin

    version = os.environ.get("FSDP_VERSION", "1")  # accelerate's default when the config names none
    if version != "2":
        raise RecipeError(
            f"fsdp_version: {version} in the accelerate config: minimind-trl runs FSDP2 (fully_shard); set "
            f"fsdp_version: 2 (as {FSDP_CONFIG} does)"
        )
    try:
        return FullyShardedDataParallelPlugin()
    except (ValueError, RuntimeError, KeyError) as exc:
        raise RecipeError(f"the accelerate FSDP config: {exc}") from exc


def check_fsdp_launch() -> None:
    """Refuse, naming the setting, an FSDP launch this package does not run (see the module docstring)."""
    plugin = launch_plugin()
    if plugin is None:
        return
    state_dict_type = plugin.state_dict_type.name
    if state_dict_type != "FULL_STATE_DICT":
        raise RecipeError(
            f"fsdp_state_dict_type: {state_dict_type} in the accelerate config: transformers would save no "
            "model.safetensors (neither in checkpoints nor at the end), and resuming reads torch.distributed.checkpoint's "
            f"pickled metadata; set fsdp_state_dict_type: FULL_STATE_DICT (as {FSDP_CONFIG} does)"
        )


def shard_on_cpu(accelerator) -> bool:
    """Give a CPU launch with an FSDP config the FSDP state accelerate gives it on GPUs (`AcceleratorState`'s FSDP
    branch: distributed type, plugin, mixed precision); returns whether it did. Call it right after the accelerator
    is built, before anything is prepared."""
    from accelerate import PartialState
    from accelerate.utils import DistributedType

    state = accelerator.state
    if state.distributed_type != DistributedType.MULTI_CPU or not fsdp_requested():
        return False
    plugin = launch_plugin()
    if state.mixed_precision != "no":
        plugin.set_mixed_precision(state.mixed_precision)
    state.fsdp_plugin = plugin
    state.distributed_type = DistributedType.FSDP
    PartialState._shared_state["distributed_type"] = DistributedType.FSDP  # as AcceleratorState records it
    return True


def unsharded_class(model) -> type:
    """The class `fully_shard` replaced by its `FSDP<Class>` subclass (the class itself for a module it did not
    shard)."""
    from torch.distributed.fsdp import FSDPModule

    cls = type(model)
    if not issubclass(cls, FSDPModule):
        return cls
    return next(base for base in cls.__bases__ if not issubclass(base, FSDPModule))


@contextmanager
def whole_model_saving(model):
    """Inside the block `model` is its own class again (`save_pretrained` copies that class's code and names it in
    `config.json`); FSDP2's class is back afterwards, for training to go on."""
    sharded_class, own_class = type(model), unsharded_class(model)
    model.__class__ = own_class
    try:
        yield
    finally:
        model.__class__ = sharded_class


def tied_weights_once(model, state_dict: dict) -> dict:
    """`state_dict` without the weights `model` ties to another one it holds (`all_tied_weights_keys`: target ->
    source), as `save_pretrained` leaves them out of an unsharded model's file."""
    tied = getattr(model, "all_tied_weights_keys", None) or {}
    return {key: value for key, value in state_dict.items() if not (key in tied and tied[key] in state_dict)}


__all__ = [
    "FSDP_CONFIG",
    "check_fsdp_launch",
    "fsdp_requested",
    "launch_plugin",
    "shard_on_cpu",
    "tied_weights_once",
    "unsharded_class",
    "whole_model_saving",
]
