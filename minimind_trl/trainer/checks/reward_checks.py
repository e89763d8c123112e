"""Checks on what users hand the trainer: its `model` and `reward_funcs` arguments, and what reward functions
return at every step. TRL turns a wrong type into a Hub lookup (`"format"` as a reward-model id) or a tensor
error deep in `_calculate_rewards`, and lets an infinite reward through into the advantages."""

import functools
import math
import numbers
import os
from contextlib import contextmanager

from ...errors import ModelSourceError, RewardFunctionError, RewardSpecError
from ...loading_utils import looks_local


def _missing_local_path(name: str) -> bool:
    """A string that can only be a local path (absolute, `./`, `~`, several folders, a weights file) and is not
    there: TRL would look it up on the Hub and blame the connection."""
    local = looks_local(name, (".pth", ".pt", ".bin", ".safetensors"))
    return local and not os.path.exists(os.path.expanduser(name))


def _check_hub_reward_model(name: str) -> None:
    """A reward-model string that is not a local path must be readable as a Hub id (or from the Hub cache): a
    relative path such as `models/rm` looks like `owner/name`, and TRL would blame the connection."""
    from ...rewards.registry import read_reward_model_config

    read_reward_model_config(name, what="reward_funcs: reward model")


def _environments_may_reward(environment_factory) -> bool:
    """Whether environments from `environment_factory` (one factory, or a dict of them) may define `get_reward`,
    which TRL then takes as a reward source. A factory that is a class is read without building an environment; any
    other callable may return anything, so TRL, which builds one to look, decides."""
    if environment_factory is None:
        return False
    factories = environment_factory.values() if isinstance(environment_factory, dict) else [environment_factory]
    return any(not isinstance(factory, type) or callable(getattr(factory, "get_reward", None)) for factory in factories)


def check_trainer_arguments(model, reward_funcs, environment_factory=None) -> None:
    """`TypeError`s that say what is expected, before TRL reads (or looks up on the Hub) anything. Rewards may come
    from `reward_funcs`, from environments that define `get_reward` (TRL adds one reward per such environment
    class), or both; with neither, TRL's own error, raised here before any model loads."""
    import torch.nn as nn

    if not isinstance(model, (str, nn.Module)):
        raise TypeError(
            f"model must be a path or Hub id (str) or a loaded model (PreTrainedModel), got {type(model).__name__} "
            f"{model!r}"
        )
    if isinstance(model, str) and _missing_local_path(model):
        raise ModelSourceError(f"model: {model} does not exist (a local path; Hub ids look like 'owner/name')")
    funcs = [] if reward_funcs is None else reward_funcs if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
    if not funcs and not _environments_may_reward(environment_factory):
        raise RewardSpecError(
            "No reward source provided: pass reward_funcs (a reward function or a list of them, e.g. [format_reward]), "
            "or an environment_factory whose environments define get_reward"
        )
    from ...rewards.registry import REWARDS

    for func in funcs:
        if isinstance(func, str) and func in REWARDS:
            raise TypeError(
                f"reward_funcs: {func!r} is the name of a built-in reward of `minimind-trl grpo` recipes; the trainer "
                f"takes functions: pass e.g. `from {REWARDS[func].module} import {REWARDS[func].python}` (a string here "
                "is a reward-model path or Hub id)"
            )
        if isinstance(func, str) and _missing_local_path(func):
            raise RewardSpecError(
                f"reward_funcs: reward model {func} does not exist (a local path; Hub ids look like 'owner/name')"
            )
        if isinstance(func, str) and not os.path.exists(os.path.expanduser(func)):
            _check_hub_reward_model(func)
        if not (isinstance(func, (str, nn.Module)) or callable(func)):
            raise TypeError(
                f"reward_funcs: {func!r} ({type(func).__name__}) is not a reward: expected a function returning one "
                "number per completion, a reward model, or a reward model's path/Hub id"
            )


def check_weighted_rewards(trainer, rewards_per_func) -> None:
    """Finite rewards whose weighted sum is not (1e38 x weight 10 overflows float32): name the reward, its value
    and its weight, where the advantages would only see an infinite score."""
    import torch

    weights = trainer.reward_weights.to(rewards_per_func.device, rewards_per_func.dtype)
    weighted = rewards_per_func * weights.unsqueeze(0)
    totals = weighted.nansum(dim=1)
    bad = (~torch.isfinite(totals)).nonzero()
    if not len(bad):
        return
    row = int(bad[0])
    terms = [
        f"{name} {rewards_per_func[row, i].item():.3g} x weight {weights[i].item():g}"
        for i, name in enumerate(trainer.reward_func_names)
        if not torch.isnan(rewards_per_func[row, i])
    ]
    raw_inf = [name for i, name in enumerate(trainer.reward_func_names) if torch.isinf(rewards_per_func[row, i])]
    step = trainer.state.global_step + 1
    if raw_inf:
        raise RewardFunctionError(
            f"reward {', '.join(raw_inf)} at step {step} returned an infinite score ({'; '.join(terms)}); rewards "
            "must be finite"
        )
    raise RewardFunctionError(
        f"at step {step} the weighted reward sum overflows {rewards_per_func.dtype} to {totals[row].item()}: "
        f"{' + '.join(terms)} (reward_weights {weights.tolist()}); scale the reward or its weight down so that "
        "every reward x weight, and their sum, stays finite"
    )


def reward_output_problem(output, expected: int) -> str | None:
    """What is wrong with a reward function's return value (None when it is one finite number or None each)."""
    if hasattr(output, "tolist") and not isinstance(output, (str, bytes)):  # numpy arrays, tensors
        output = output.tolist()
    if not isinstance(output, (list, tuple)):
        return f"{type(output).__name__} {_short(output)} instead of a list of rewards"
    if len(output) != expected:
        return f"{len(output)} rewards for {expected} completions"
    for index, value in enumerate(output):
        if value is None:
            continue
        if isinstance(value, (str, bytes)) or not isinstance(value, numbers.Real):
            return f"{type(value).__name__} {_short(value)} at position {index}"
        if math.isinf(float(value)):
            return f"{value} at position {index} (rewards must be finite; None marks a completion it cannot score)"
    return None


def _short(value, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


@contextmanager
def checked_reward_funcs(trainer, expected: int):
    """Inside the block, the trainer's plain (synchronous) reward functions check what they return and name
    themselves and the step in any failure; reward models and async functions are left as they are."""
    import torch.nn as nn
    from trl.trainer.utils import is_async_callable

    step = trainer.state.global_step + 1
    original = trainer.reward_funcs

    def checked(func, name):
        @functools.wraps(func)
        def call(*args, **kwargs):
            try:
                output = func(*args, **kwargs)
            except RewardFunctionError:
                raise
            except Exception as exc:
                raise RewardFunctionError(
                    f"reward function {name} at step {step} raised {type(exc).__name__}: {exc}"
                ) from exc
            problem = reward_output_problem(output, expected)
            if problem:
                raise RewardFunctionError(
                    f"reward function {name} at step {step} returned {problem}; it must return one finite number "
                    f"(or None) per completion, {expected} here"
                )
            return output

        return call

    trainer.reward_funcs = [
        func
        if isinstance(func, nn.Module) or is_async_callable(func) or not callable(func)
        else checked(func, name)
        for func, name in zip(original, trainer.reward_func_names)
    ]
    try:
        yield
    finally:
        trainer.reward_funcs = original


__all__ = ["check_trainer_arguments", "check_weighted_rewards", "checked_reward_funcs", "reward_output_problem"]
