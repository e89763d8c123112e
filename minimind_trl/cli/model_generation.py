"""Whether a recipe was written for the policy's MiniMind generation, said before training.

MiniMind2 and MiniMind-3 models write differently (`Generation.writes`), and each generation's rewards score what
its own models write: MiniMind2's `format` and `tag_count` look for an `<answer>` block that a MiniMind-3 model never
writes, so they score 0 on all of it. A MiniMind-3 checkpoint whose head count matches converts and trains under a
MiniMind2 recipe without an error, so `recipe_generation_warning` says so, naming both generations and the setting to
change. A recipe's generation is that of its built-in rewards (`RewardEntry.generation`); with none of them (only
functions of your own), that of its `upstream:` record.
"""

import logging

from ..generations import ARCHITECTURE_GENERATIONS, GENERATIONS, format_value
from ..models.minimind.configuration_minimind import MINIMIND2
from ..rewards.registry import REWARDS

logger = logging.getLogger(__name__)
LABELS = {name: generation.label for name, generation in ARCHITECTURE_GENERATIONS.items()}


def policy_architecture(name_or_path: str, revision: str = "main") -> str | None:
    """The MiniMind architecture (`minimind_generation`) in the policy's `config.json`; None when it is not a
    MiniMind or its config cannot be read here (TRL's loading then reports why)."""
    from transformers import PretrainedConfig

    try:
        config, _ = PretrainedConfig.get_config_dict(name_or_path, revision=revision)
    except (OSError, ValueError):
        return None
    if config.get("model_type") != "minimind":
        return None
    return config.get("minimind_generation", MINIMIND2)


def recipe_generation_warning(script_args, training_args, policy_name: str, architecture: str | None) -> str | None:
    """The warning for a recipe of the other generation than the policy's `architecture` (None: they agree, or
    either is unknown)."""
    if architecture not in LABELS:
        return None
    rewards = [name for name in script_args.reward_funcs or [] if REWARDS.get(name) and REWARDS[name].generation]
    foreign = [name for name in rewards if GENERATIONS[REWARDS[name].generation].architecture != architecture]
    upstream = GENERATIONS.get(getattr(training_args, "upstream", None) or "")
    if foreign:
        recipe = GENERATIONS[REWARDS[foreign[0]].generation]
        what, setting = f"reward_funcs lists {recipe.label}'s {', '.join(foreign)}", "reward_funcs"
    elif not rewards and upstream is not None and upstream.architecture not in (None, architecture):
        recipe = upstream
        what, setting = f"the recipe declares upstream: {upstream.name}", "upstream"
    else:
        return None
    own = ARCHITECTURE_GENERATIONS[architecture]
    return (
        f"the policy {policy_name} is a {own.label} model, but {what}, written for {recipe.label} models, which write "
        f"{recipe.writes}; a {own.label} model writes {own.writes}. For a {own.label} policy use {own.recipe} "
        f"(reward_funcs: {format_value(own.reward_funcs.value)}) or change {setting}; on purpose, ignore this warning"
    )


def warn_on_generation_mismatch(script_args, training_args, policy_path: str, policy_name: str, revision: str) -> None:
    """Log `recipe_generation_warning` for the policy at `policy_path` (its loadable folder or Hub id), once."""
    architecture = policy_architecture(policy_path, revision)
    warning = recipe_generation_warning(script_args, training_args, policy_name, architecture)
    if warning is not None and training_args.process_index == 0:
        logger.warning(warning)


__all__ = ["policy_architecture", "recipe_generation_warning", "warn_on_generation_mismatch"]
