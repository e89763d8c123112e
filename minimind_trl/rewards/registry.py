"""Reward functions by name: the one table recipes pick from (`reward_funcs: [format, tag_count, reward_model]`).

Two upstream generations are here: MiniMind2's (the seed, fea69cf) `format`, `tag_count`, `reward_model` and
MiniMind-3's (d65ef2c) `length`, `thinking_length`, `think_close_count`, `repetition_penalty`,
`answer_reward_model`. The reward-model terms (`reward_model_rewards()`) score with the model at
`reward_model_name_or_path`; a run lists at most one of them.

MiniMind-3's agent stage (d65ef2c `train_agent.py`) adds `agent_reward` and `agent_rule_reward` (the same without
the reward model). They live in `minimind_trl.agent`, which uses this module, and enter the table through
`register_reward` when it is imported (`minimind-trl` imports it), so nothing here imports the agent.

`REWARDS` maps each built-in name to a `RewardEntry`: how to check it before any model is loaded and how to
build its TRL reward callable. Any other name must be an importable `package.module:function` (also
`package.module.function`; the working directory is importable, as in TRL's scripts). `check_reward_specs`
runs every check (names, imports, weights, the reward model's `config.json`), so a typo fails in a second,
not after the policy has been built; `build_reward_funcs` then builds the callables in `reward_funcs` order.
"""

import difflib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import RewardSpecError
from ..loading_utils import import_function, is_import_spec, looks_local, whole_model_loading
from .minimind3_rewards import AnswerRewardModelReward, length, repetition_penalty, think_close_count, thinking_length
from .reward_model import RewardModelReward
from .rule_rewards import format_reward, tag_count_reward
from .scorers import InternLM2Scorer, SequenceClassifierScorer

INTERNLM2_ARCHITECTURES = ("InternLM2ForRewardModel",)
REWARD_MODEL_TYPES = ("auto", "internlm2", "sequence_classification")


@dataclass(frozen=True)
class RewardEntry:
    """A built-in reward: `build(script_args, context, tokenizer)` returns its TRL reward callable (`context`: the
    `RewardContext` of the run, or its `GRPOConfig`, which has the same attributes);
    `check(script_args, training_args)`, when given, validates its options before anything is loaded; `python`
    names what Python users import instead, from `module`."""

    help: str
    build: Callable
    check: Callable | None = None
    python: str = ""  # its public name in `module` (what Python users pass the trainer)
    module: str = "minimind_trl.rewards"
    scores_with_reward_model: bool = False  # it loads the model at reward_model_name_or_path (a run lists one)
    rule_only: str | None = None  # a reward-model reward's form without the model (None: none, it is dropped)
    generation: str | None = None  # the upstream generation (`generations.GENERATIONS`) whose models' output it scores


@dataclass(frozen=True)
class RewardContext:
    """What a reward's builder reads of the run's settings: where its reward model runs and how prompts are
    rendered for it. The run plan derives it once; a `GRPOConfig` has the same attributes and works as well."""

    device: object = "cpu"
    chat_template_kwargs: dict | None = None


# --------------------------------------------------------------------------- the reward model


def read_reward_model_config(
    name_or_path: str, revision: str = "main", what: str = "reward_model_name_or_path"
) -> dict:
    """The reward model's `config.json` (a local folder, or fetched alone from the Hub); errors start with `what`."""
    if os.path.isdir(name_or_path):
        path = os.path.join(name_or_path, "config.json")
        if not os.path.isfile(path):
            raise RewardSpecError(f"{what}: {name_or_path} has no config.json (not a model folder)")
    elif os.path.exists(name_or_path):
        raise RewardSpecError(f"{what}: {name_or_path} is not a model folder")
    elif looks_local(name_or_path):
        raise RewardSpecError(f"{what}: {name_or_path} does not exist (a local path; Hub ids look like 'owner/name')")
    else:
        from huggingface_hub import constants, hf_hub_download
        from huggingface_hub.errors import LocalEntryNotFoundError

        try:
            path = hf_hub_download(name_or_path, "config.json", revision=revision)
        except LocalEntryNotFoundError as exc:  # offline or no network, and not in the cache
            raise RewardSpecError(_unreachable_message(name_or_path, exc, constants.is_offline_mode(), what)) from exc
        except Exception as exc:  # missing repo, gated, no config.json: all end here with the reason
            raise RewardSpecError(f"{what}: cannot read config.json of {name_or_path}: {exc}") from exc
    with open(path) as f:
        return json.load(f)


def _unreachable_message(
    name_or_path: str, exc: Exception, offline: bool, what: str = "reward_model_name_or_path"
) -> str:
    """A path that is neither a local folder nor reachable on the Hub: `models/rm` looks like a Hub id
    `owner/name`, so huggingface_hub's "check your connection" would hide the likelier mistyped local path."""
    why = "offline mode, HF_HUB_OFFLINE=1" if offline else f"the Hub cannot be reached: {exc.__cause__ or exc}"
    return (
        f"{what}: {name_or_path} is not a local folder (nothing at "
        f"{os.path.abspath(os.path.expanduser(name_or_path))}) and is not reachable as a Hub id either ({why}, and "
        "it is not in the local Hub cache); check the path (relative paths start at the working directory)"
    )


def reward_model_kind(config: dict, name_or_path: str, requested: str = "auto") -> str:
    """`internlm2` or `sequence_classification`, from what `config.json` declares; anything else is an error."""
    architectures = list(config.get("architectures") or [])
    if any(arch in INTERNLM2_ARCHITECTURES for arch in architectures):
        kind = "internlm2"
    elif any(arch.endswith("ForSequenceClassification") for arch in architectures):
        kind = "sequence_classification"
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
    # transformers builds 2 labels when config.json sets neither (e.g. a policy folder relabelled as a classifier)
    num_labels = len(config.get("id2label") or {}) or config.get("num_labels", 2)
    if kind == "sequence_classification" and num_labels != 1:
        unset = "" if config.get("id2label") or "num_labels" in config else " (transformers' default: no labels set)"
        raise RewardSpecError(
            f"reward_model_name_or_path: {name_or_path} is a classifier with {num_labels} labels{unset}; a reward "
            "model has a single scalar output (num_labels=1)"
        )
    return kind


def check_reward_model(script_args, training_args) -> str:
    """The reward model's path and `config.json`; returns its kind."""
    path = script_args.reward_model_name_or_path
    if not path:
        model_rewards = reward_model_rewards()
        listed = [name for name in script_args.reward_funcs or [] if name in model_rewards]
        raise RewardSpecError(
            f"reward_funcs includes {listed[0] if listed else 'a reward-model reward'!r} but reward_model_name_or_path "
            "is not set (the reward model it scores with)"
        )
    return reward_model_kind(read_reward_model_config(path), path, script_args.reward_model_type)


def load_scorer(name_or_path: str, kind: str, device):
    """A scorer holding the whole reward model on this process's device (also under ZeRO-3, as upstream did)."""
    scorer_class = InternLM2Scorer if kind == "internlm2" else SequenceClassifierScorer
    with whole_model_loading():
        return scorer_class.from_pretrained(name_or_path, device=device)


def build_reward_model_reward(script_args, context, tokenizer) -> RewardModelReward:
    """Upstream's reward-model term: turns of the rendered prompt + completion, clipped, answer-blended."""
    kind = check_reward_model(script_args, context)
    return RewardModelReward(
        load_scorer(script_args.reward_model_name_or_path, kind, context.device),
        tokenizer=tokenizer,
        reasoning=script_args.reasoning,
        clip=script_args.reward_model_clip,
        chat_template_kwargs=context.chat_template_kwargs,
    )


def build_answer_reward_model_reward(script_args, context, tokenizer) -> AnswerRewardModelReward:
    """MiniMind-3's reward-model term: the answer after the folded conversation, clipped, no blend."""
    kind = check_reward_model(script_args, context)
    return AnswerRewardModelReward(
        load_scorer(script_args.reward_model_name_or_path, kind, context.device),
        tokenizer=tokenizer,
        clip=script_args.reward_model_clip,
        chat_template_kwargs=context.chat_template_kwargs,
    )


def _function(func: Callable) -> Callable:
    """A builder returning `func` itself (rule rewards need no options)."""
    return lambda *_: func


# --------------------------------------------------------------------------- the table

REWARDS: dict[str, RewardEntry] = {
    # MiniMind2 (fea69cf, the seed)
    "format": RewardEntry(
        "+0.5 for upstream's <think>...</think><answer>...</answer> layout",
        build=_function(format_reward),
        python="format_reward",
        generation="minimind2",
    ),
    "tag_count": RewardEntry(
        "+0.25 per reasoning tag that occurs exactly once", build=_function(tag_count_reward), python="tag_count_reward",
        generation="minimind2",
    ),
    "reward_model": RewardEntry(
        "the reward model at reward_model_name_or_path, clipped and (reasoning) answer-blended",
        build=build_reward_model_reward,
        check=check_reward_model,
        python="RewardModelReward",
        generation="minimind2",
        scores_with_reward_model=True,
    ),
    # MiniMind-3 (d65ef2c)
    "length": RewardEntry(
        "+0.5 if the stripped completion has 20..800 characters, else -0.5",
        build=_function(length),
        python="length",
        generation="minimind3",
    ),
    "thinking_length": RewardEntry(
        "with </think>: +1.0 if the thought before it has 20..300 characters, else -0.5; 0 without",
        build=_function(thinking_length),
        python="thinking_length",
        generation="minimind3",
    ),
    "think_close_count": RewardEntry(
        "with </think>: +0.25 if it occurs once, else -0.25; 0 without",
        build=_function(think_close_count),
        python="think_close_count",
        generation="minimind3",
    ),
    "repetition_penalty": RewardEntry(
        "minus the answer's trigram repetition penalty (at most 0.5)",
        build=_function(repetition_penalty),
        python="repetition_penalty",
        generation="minimind3",
    ),
    "answer_reward_model": RewardEntry(
        "the reward model at reward_model_name_or_path on the answer after the folded conversation, clipped",
        build=build_answer_reward_model_reward,
        check=check_reward_model,
        python="AnswerRewardModelReward",
        generation="minimind3",
        scores_with_reward_model=True,
    ),
}


def reward_model_rewards() -> tuple[str, ...]:
    """The registered rewards that score with the reward model, in the table's order (`agent_reward` among them once
    `minimind_trl.agent` has registered it)."""
    return tuple(name for name, entry in REWARDS.items() if entry.scores_with_reward_model)


def without_reward_model(names: list[str], weights: list[float] | None):
    """A recipe's rewards for a run without its reward model: each reward that scores with it replaced by its
    rule-only form (`RewardEntry.rule_only`: `agent_reward` -> `agent_rule_reward`) or dropped with its weight.
    Returns the names, the weights (None if none were given) and one `old -> new` (or `old dropped`) line per
    change."""
    kept_names, kept_weights, changes = [], [], []
    for index, name in enumerate(names):
        entry = REWARDS.get(name)
        weight = None if weights is None else weights[index]
        if entry is None or not entry.scores_with_reward_model:
            kept_names.append(name)
            kept_weights.append(weight)
        elif entry.rule_only is not None:
            kept_names.append(entry.rule_only)
            kept_weights.append(weight)
            changes.append(f"{name} -> {entry.rule_only}")
        else:
            changes.append(f"{name} dropped" + ("" if weight is None else f" (weight {weight:g})"))
    return kept_names, None if weights is None else kept_weights, changes


def register_reward(name: str, entry: RewardEntry) -> None:
    """Add a built-in reward that recipes name as `name`. A package's own rewards register where they live, when it
    is imported (`minimind_trl.agent.reward` registers the agent's), as a user's `package.module:function` needs no
    entry at all."""
    if name in REWARDS and REWARDS[name] != entry:
        raise RewardSpecError(f"reward {name!r} is registered twice: {REWARDS[name]} and {entry}")
    REWARDS[name] = entry


def import_reward_function(spec: str) -> Callable:
    """`package.module:function` or `package.module.function` -> the callable."""
    return import_function(spec, "reward_funcs", RewardSpecError)


def check_reward_specs(script_args, training_args) -> None:
    """Validate names, imports, weights and every built-in's own options (the reward model's config)."""
    names = list(script_args.reward_funcs or [])
    if not names:
        raise RewardSpecError(f"reward_funcs is empty: list some of {', '.join(REWARDS)} or 'package.module:function'")
    for name in names:
        if name in REWARDS:
            continue
        if is_import_spec(name):
            import_reward_function(name)
            continue
        close = difflib.get_close_matches(name, REWARDS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise RewardSpecError(
            f"unknown reward function {name!r}{hint}: expected one of {', '.join(REWARDS)} or an importable "
            "'package.module:function'"
        )
    if len(set(names)) != len(names):
        raise RewardSpecError(f"reward_funcs lists a reward twice: {names}")
    weights = training_args.reward_weights
    if weights is not None and len(weights) != len(names):
        raise RewardSpecError(f"reward_weights has {len(weights)} values for {len(names)} reward_funcs {names}")
    scoring_with_model = reward_model_rewards()
    model_rewards = [name for name in names if name in scoring_with_model]
    if len(model_rewards) > 1:
        raise RewardSpecError(
            f"reward_funcs lists {' and '.join(model_rewards)}: {'both' if len(model_rewards) == 2 else 'all'} score "
            "with the one reward model (MiniMind2's whole-completion blend, MiniMind-3's answer after the folded "
            "conversation, its agent reward's no-call branch); keep one"
        )
    for name in names:
        if name in REWARDS and REWARDS[name].check is not None:
            REWARDS[name].check(script_args, training_args)
    if getattr(script_args, "reasoning", True) is False and "reward_model" not in names:
        raise RewardSpecError(
            f"reasoning: false has no effect here: it only switches off the answer blend of MiniMind2's "
            f"'reward_model' reward, which reward_funcs {names} does not list (rule rewards are chosen by listing "
            "them; MiniMind-3's answer_reward_model never blends). Remove it"
        )
    path = script_args.reward_model_name_or_path
    if path and not model_rewards:
        raise RewardSpecError(
            f"reward_model_name_or_path={path!r} is set but no reward-model reward ("
            f"{' or '.join(repr(name) for name in scoring_with_model)}) is in reward_funcs {names}; add one "
            "(or drop the path: --reward_model_name_or_path null on the command line, or remove it from the recipe)"
        )


def build_reward_funcs(script_args, context, tokenizer) -> list[Callable]:
    """The TRL reward callables, in `reward_funcs` order (`context`: a `RewardContext` or the run's `GRPOConfig`;
    the weights stay in the config's `reward_weights`)."""
    return [
        REWARDS[name].build(script_args, context, tokenizer) if name in REWARDS else import_reward_function(name)
        for name in script_args.reward_funcs
    ]


__all__ = [
    "REWARDS",
    "REWARD_MODEL_TYPES",
    "RewardContext",
    "RewardEntry",
    "RewardSpecError",
    "build_reward_funcs",
    "check_reward_specs",
    "import_reward_function",
    "read_reward_model_config",
    "register_reward",
    "reward_model_rewards",
    "reward_model_kind",
    "without_reward_model",
]
