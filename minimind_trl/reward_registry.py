"""Reward functions by name, as recipes list them (`reward_funcs: [format, tag_count, reward_model]`).

Names resolve to TRL reward callables: `format` and `tag_count` (MiniMind's rule rewards), `reward_model` (the
seed's reward-model term around the model at `reward_model_name_or_path`) or any importable
`package.module:function` (also `package.module.function`; the working directory is importable, as in TRL's
scripts). Every name, import and the reward model's `config.json` are checked by `check_reward_specs` before
any model is loaded, so a typo fails in a second, not after the policy has been built.
"""

import difflib
import importlib
import json
import os
import sys
from collections.abc import Callable
from contextlib import contextmanager

from .script_args import BUILTIN_REWARDS

INTERNLM2_ARCHITECTURES = ("InternLM2ForRewardModel",)


class RewardSpecError(ValueError):
    """A reward name, weight or reward model that cannot be used; the message names it."""


def _builtin_rule_rewards() -> dict[str, Callable]:
    from .rewards import format_reward, tag_count_reward

    return {"format": format_reward, "tag_count": tag_count_reward}


def import_reward_function(spec: str) -> Callable:
    """`package.module:function` or `package.module.function` -> the callable."""
    module_name, sep, attr = spec.partition(":")
    if not sep:
        module_name, _, attr = spec.rpartition(".")
    if not module_name or not attr:
        raise RewardSpecError(f"reward function {spec!r}: expected 'package.module:function'")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise RewardSpecError(f"reward function {spec!r}: cannot import module {module_name!r}: {exc}") from exc
    func = getattr(module, attr, None)
    if func is None:
        raise RewardSpecError(f"reward function {spec!r}: module {module_name!r} has no attribute {attr!r}")
    if not callable(func):
        raise RewardSpecError(f"reward function {spec!r} is not callable")
    return func


def _is_import_spec(name: str) -> bool:
    return ":" in name or "." in name


def read_reward_model_config(name_or_path: str, revision: str = "main") -> dict:
    """The reward model's `config.json` (a local folder, or fetched alone from the Hub)."""
    if os.path.isdir(name_or_path):
        path = os.path.join(name_or_path, "config.json")
        if not os.path.isfile(path):
            raise RewardSpecError(f"reward_model_name_or_path: {name_or_path} has no config.json (not a model folder)")
    elif os.path.exists(name_or_path) or name_or_path.startswith((".", "/", "~")):
        raise RewardSpecError(f"reward_model_name_or_path: {name_or_path} is not a model folder")
    else:
        from huggingface_hub import hf_hub_download

        try:
            path = hf_hub_download(name_or_path, "config.json", revision=revision)
        except Exception as exc:  # offline, missing repo, gated: all end here with the reason
            raise RewardSpecError(
                f"reward_model_name_or_path: cannot read config.json of {name_or_path}: {exc}"
            ) from exc
    with open(path) as f:
        return json.load(f)


def reward_model_kind(config: dict, name_or_path: str, requested: str = "auto") -> str:
    """`internlm2` or `sequence_classification`, from what `config.json` declares; anything else is an error."""
    architectures = list(config.get("architectures") or [])
    if any(arch in INTERNLM2_ARCHITECTURES for arch in architectures):
        kind = "internlm2"
    elif any(arch.endswith("ForSequenceClassification") for arch in architectures):
        kind = "sequence_classification"
        num_labels = len(config.get("id2label") or {}) or config.get("num_labels", 1)
        if num_labels != 1:
            raise RewardSpecError(
                f"reward_model_name_or_path: {name_or_path} is a classifier with {num_labels} labels; a reward model "
                "has a single scalar output (num_labels=1)"
            )
    else:
        raise RewardSpecError(
            f"reward_model_name_or_path: {name_or_path} is not a reward model: its config.json declares "
            f"architectures {architectures or 'none'} (model_type {config.get('model_type')!r}); expected "
            f"{INTERNLM2_ARCHITECTURES[0]} or a *ForSequenceClassification model with one label"
        )
    if requested not in ("auto", kind):
        raise RewardSpecError(
            f"reward_model_type={requested!r} but {name_or_path} is a {kind.replace('_', ' ')} model ({architectures})"
        )
    return kind


def check_reward_specs(script_args, training_args) -> str | None:
    """Validate names, imports, weights and the reward model; returns the reward model kind (or None)."""
    names = list(script_args.reward_funcs or [])
    if not names:
        raise RewardSpecError(
            f"reward_funcs is empty: list some of {', '.join(BUILTIN_REWARDS)} or 'package.module:function'"
        )
    for name in names:
        if name in BUILTIN_REWARDS:
            continue
        if _is_import_spec(name):
            import_reward_function(name)
            continue
        close = difflib.get_close_matches(name, BUILTIN_REWARDS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise RewardSpecError(
            f"unknown reward function {name!r}{hint}: expected one of {', '.join(BUILTIN_REWARDS)} or an importable "
            "'package.module:function'"
        )
    if len(set(names)) != len(names):
        raise RewardSpecError(f"reward_funcs lists a reward twice: {names}")
    weights = training_args.reward_weights
    if weights is not None and len(weights) != len(names):
        raise RewardSpecError(f"reward_weights has {len(weights)} values for {len(names)} reward_funcs {names}")

    path = script_args.reward_model_name_or_path
    if "reward_model" in names:
        if not path:
            raise RewardSpecError("reward_funcs includes 'reward_model' but reward_model_name_or_path is not set")
        return reward_model_kind(read_reward_model_config(path), path, script_args.reward_model_type)
    if path:
        raise RewardSpecError(
            f"reward_model_name_or_path={path!r} is set but 'reward_model' is not in reward_funcs {names}; add it "
            "(or drop the path)"
        )
    return None


def build_reward_funcs(script_args, training_args, tokenizer, kind: str | None) -> list[Callable]:
    """The TRL reward callables, in `reward_funcs` order (weights stay in `training_args.reward_weights`)."""
    rules = _builtin_rule_rewards()
    funcs = []
    for name in script_args.reward_funcs:
        if name in rules:
            funcs.append(rules[name])
        elif name == "reward_model":
            funcs.append(build_reward_model_reward(script_args, training_args, tokenizer, kind))
        else:
            funcs.append(import_reward_function(name))
    return funcs


def build_reward_model_reward(script_args, training_args, tokenizer, kind: str) -> Callable:
    """The seed's reward-model term: turns of the rendered prompt + completion, clipped, answer-blended."""
    from .rewards import RewardModelReward

    scorer = load_scorer(script_args.reward_model_name_or_path, kind, training_args)
    return RewardModelReward(
        scorer,
        tokenizer=tokenizer,
        reasoning=script_args.reasoning,
        clip=script_args.reward_model_clip,
        chat_template_kwargs=training_args.chat_template_kwargs,
    )


@contextmanager
def whole_model_loading():
    """Load models whole even under DeepSpeed ZeRO-3.

    With ZeRO-3, transformers' `from_pretrained` partitions every model it loads across the processes
    (`deepspeed.zero.Init`), which only works for models DeepSpeed then drives. The reward model is frozen and
    called directly by the scorer, so each process keeps a whole copy instead (as the seed did). accelerate's
    `zero3_init_context_manager` does not switch this off for transformers (it re-registers the same stage-3
    config), so the registration is lifted here and restored afterwards.
    """
    from transformers.integrations import deepspeed as hf_deepspeed

    reference = hf_deepspeed._hf_deepspeed_config_weak_ref
    config = reference() if reference is not None else None
    if config is None:
        yield
        return
    hf_deepspeed.unset_hf_deepspeed_config()
    try:
        yield
    finally:
        hf_deepspeed.set_hf_deepspeed_config(config)


def load_scorer(name_or_path: str, kind: str, training_args):
    """A scorer holding the whole reward model on this process's device (see `whole_model_loading`)."""
    from . import scorers

    with whole_model_loading():
        if kind == "internlm2":
            return scorers.InternLM2Scorer.from_pretrained(name_or_path, device=training_args.device)
        return scorers.SequenceClassifierScorer.from_pretrained(name_or_path, device=training_args.device)


__all__ = [
    "RewardSpecError",
    "build_reward_funcs",
    "check_reward_specs",
    "import_reward_function",
    "read_reward_model_config",
    "reward_model_kind",
]
