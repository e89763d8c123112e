"""The valid range of every numeric setting of a run, declared once.

`RANGES` covers every `int`/`float` field of `MiniMindGRPOConfig` (ours, TRL's `GRPOConfig` and transformers'
`TrainingArguments`), of the CLI's `GRPOScriptArguments` and of TRL's `ModelConfig` (`tests/trainer/
test_config_ranges.py` fails when a new numeric field has no entry). A value outside its range is refused with one
line naming the key: NaN, an infinity, a negative weight or a zero count would otherwise train against the
rewards, end in NaN weights with exit 0, or die in a library several steps later. Values outside the range that
have a documented meaning (`max_steps: -1`, `top_k: -1`, `local_rank: -1`) are listed as `special`. An integer
beyond 64 bits (`max_steps: 10**400`) is refused too (`number_problem`): no tensor, clock or float holds it.

Applied by `MiniMindGRPOConfig.__post_init__` (every path: CLI, recipes, Python), `GRPOScriptArguments.__post_init__`,
the recipe parser (YAML values with file and line, command-line overrides by the flag as typed) and
`check_model_config` for `ModelConfig`. `loss_option_warnings` says what a legal but doubtful combination does.
"""

import functools
import json
import logging
import math
import types
import typing
from dataclasses import dataclass, fields

from ...errors import RecipeError

logger = logging.getLogger(__name__)

INF = math.inf
INT64_MAX = 2**63 - 1  # the largest integer a torch or numpy integer, or a C clock, holds


def number_problem(value) -> str | None:
    """`must be ..., got ...` for a number no setting can take: NaN, an infinity, an integer beyond 64 bits (which
    no float or tensor holds: `float(10**400)` raises `OverflowError`). None for any other value, numbers or not."""
    if isinstance(value, float) and not math.isfinite(value):
        return f"must be finite, got {value!r}"
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > INT64_MAX:
        return f"must fit in 64 bits (at most 2**63 - 1 in size), got {shown_number(value)}"
    return None


def shown_number(value) -> str:
    """A value for a message: its `repr`, cut to 100 characters, and an integer beyond 64 bits by its size (Python
    refuses to print one of more than 4300 digits, and a 400-digit line says less than its length)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > INT64_MAX:
        return f"an integer of about {int(value.bit_length() * math.log10(2)) + 1} digits"
    try:
        text = repr(value)
    except ValueError:  # a list or dict holding such an integer
        return "(one holding an integer too long to print)"
    return text if len(text) <= 100 else f"{text[:80]}... ({len(text)} characters)"


@dataclass(frozen=True)
class Range:
    """`low`..`high` (open where `*_open`), `None` allowed when `none`, `special` values with a documented meaning;
    `note` says what the values mean or why the bounds are there."""

    low: float = -INF
    high: float = INF
    low_open: bool = False
    high_open: bool = False
    none: bool = False
    special: tuple = ()
    note: str = ""

    def contains(self, value) -> bool:
        if value is None:
            return self.none
        if value in self.special:
            return True
        if not isinstance(value, (int, float)) or isinstance(value, bool) or number_problem(value) is not None:
            return False
        above = value > self.low if self.low_open else value >= self.low
        below = value < self.high if self.high_open else value <= self.high
        return above and below

    def describe(self) -> str:
        """`a positive number`, `at least 1`, `between 0 and 1`, ... (+ the special values)."""
        low, high = _number(self.low), _number(self.high)
        if self.low == 0 and self.low_open and self.high == INF:
            text = "a positive number"
        elif self.high == INF:
            text = f"above {low}" if self.low_open else f"at least {low}"
        elif self.low == -INF:
            text = f"below {high}" if self.high_open else f"at most {high}"
        else:
            closed = not self.low_open and not self.high_open
            brackets = ("(" if self.low_open else "[") + f"{low}, {high}" + (")" if self.high_open else "]")
            text = f"between {low} and {high}" if closed else f"in {brackets}"
        extras = [_number(value) for value in self.special] + (["unset"] if self.none else [])
        return text + (f" or {' or '.join(map(str, extras))}" if extras else "")


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(value)


POSITIVE = Range(0, low_open=True)
NON_NEGATIVE = Range(0)
COUNT = Range(1)
PROBABILITY = Range(0, 1)
PORT = Range(1, 65535)
SEED = Range(0, 2**32 - 1, note="numpy's seed range")
TIMEOUT = Range(0, 7 * 86400, low_open=True, note="seconds, at most a week (larger values overflow the clocks' limits)")


def _unset(rng: Range, note: str = "") -> Range:
    return Range(rng.low, rng.high, rng.low_open, rng.high_open, True, rng.special, note or rng.note)


RANGES: dict[str, Range] = {
    # --- batch geometry and length of the run
    "per_device_train_batch_size": COUNT,
    "per_device_eval_batch_size": COUNT,
    "gradient_accumulation_steps": COUNT,
    "generation_batch_size": _unset(COUNT, "unset: per_device_train_batch_size x processes x steps_per_generation"),
    "steps_per_generation": _unset(COUNT, "unset: 1 (upstream generates for every micro-batch)"),
    "num_generations": Range(2, note="GRPO needs at least 2 completions per prompt for a group's spread"),
    "num_generations_eval": _unset(COUNT, "unset: num_generations"),
    "num_iterations": COUNT,
    "num_train_epochs": Range(0, low_open=True, note="0 epochs train nothing"),
    "max_steps": Range(1, special=(-1,), note="-1: train num_train_epochs"),
    "max_completion_length": _unset(COUNT),
    "max_prompt_length": _unset(COUNT, "unset: whole prompts"),
    "max_resample_rounds": Range(0, note="0: dynamic_sampling never generates again"),
    "max_tool_calling_iterations": _unset(COUNT, "unset: no limit"),
    "pad_to_multiple_of": _unset(COUNT, "unset: no padding"),
    "dataset_max_samples": _unset(COUNT, "unset: every row"),
    "test_split_size": _unset(POSITIVE, "a share (below 1) or a count of the mixture's rows; unset: none held out"),
    # --- optimisation
    "learning_rate": Range(0, low_open=True, note="0 would train nothing"),
    "warmup_steps": Range(0, note="below 1: a share of the run's steps"),
    "weight_decay": NON_NEGATIVE,
    "adam_beta1": Range(0, 1, high_open=True),
    "adam_beta2": Range(0, 1, high_open=True),
    "adam_epsilon": POSITIVE,
    "max_grad_norm": Range(0, note="0: no gradient clipping"),
    "label_smoothing_factor": Range(0, 1, high_open=True),
    "neftune_noise_alpha": _unset(POSITIVE, "unset: no NEFTune noise"),
    # --- GRPO loss
    "beta": Range(0, note="0: no KL term and no reference model"),
    "epsilon": POSITIVE,
    "epsilon_high": _unset(POSITIVE, "unset: epsilon; with CISPO the cap on the ratio"),
    "delta": _unset(POSITIVE, "unset: no two-sided clipping"),
    "moe_aux_loss_weight": Range(0, note="0: the MoE load-balancing loss is left out"),
    "router_aux_loss_coef": _unset(NON_NEGATIVE, "unset: the model config's"),
    "sapo_temperature_neg": POSITIVE,
    "sapo_temperature_pos": POSITIVE,
    "vespo_k_pos": NON_NEGATIVE,
    "vespo_lambda_pos": NON_NEGATIVE,
    "vespo_k_neg": NON_NEGATIVE,
    "vespo_lambda_neg": NON_NEGATIVE,
    "top_entropy_quantile": Range(0, 1, note="1 keeps every token; 0 only the highest-entropy one"),
    "entropy_coef": Range(0, note="0: no entropy bonus"),
    "entropy_coef_min": NON_NEGATIVE,
    "entropy_coef_max": NON_NEGATIVE,
    "entropy_coef_delta": NON_NEGATIVE,
    "entropy_target": NON_NEGATIVE,
    "off_policy_mask_threshold": _unset(POSITIVE, "unset: no off-policy masking"),
    "ref_model_mixup_alpha": PROBABILITY,
    "ref_model_sync_steps": COUNT,
    # --- sampling
    "temperature": Range(0, low_open=True, note="0 or below would sample the least likely tokens or be taken as 1; "
                         "for near-greedy sampling use a small value such as 0.01, or top_k: 1"),
    "top_p": Range(0, 1, low_open=True),
    "top_k": Range(0, special=(-1,), note="0 (or -1, vLLM's spelling): the whole vocabulary"),
    "min_p": _unset(PROBABILITY),
    "repetition_penalty": Range(0, low_open=True, note="1: none"),
    # --- rewards and prompts
    "reward_model_clip": POSITIVE,
    "thinking_ratio": _unset(PROBABILITY, "unset: TRL renders the messages"),
    "system_prompt_ratio": PROBABILITY,
    # --- agent rollouts (rollout: agent)
    "agent_tool_timeout": Range(0, 3600, low_open=True, note="seconds a tool call may take; a longer one would "
                                "stall every rollout of the step"),
    "agent_max_turns": Range(1, 64, note="generations per rollout (upstream 3); each turn regrows the context"),
    "agent_max_total_length": _unset(Range(2), "unset: no cut"),
    "agent_max_tool_output": _unset(COUNT, "characters of one turn's tool messages; unset: no cap"),
    # --- vLLM
    "vllm_server_port": PORT,
    "vllm_group_port": PORT,
    "vllm_server_timeout": TIMEOUT,
    "vllm_gpu_memory_utilization": Range(0, 1, low_open=True),
    "vllm_max_model_length": _unset(COUNT, "unset: from the model config"),
    "vllm_tensor_parallel_size": COUNT,
    "vllm_importance_sampling_clip_max": _unset(POSITIVE, "unset: no upper bound"),
    "vllm_importance_sampling_clip_min": _unset(NON_NEGATIVE, "unset: no lower bound"),
    "vllm_importance_sampling_cap": _unset(POSITIVE, "deprecated alias of vllm_importance_sampling_clip_max"),
    # --- logging, saving, evaluation
    "logging_steps": Range(0, low_open=True, note="below 1: a share of the run's steps"),
    "save_steps": Range(0, low_open=True, note="below 1: a share of the run's steps"),
    "save_total_limit": _unset(COUNT, "unset: keep every checkpoint"),
    "eval_steps": _unset(Range(0, low_open=True), "unset: logging_steps"),
    "eval_delay": NON_NEGATIVE,
    "eval_accumulation_steps": _unset(COUNT),
    "num_completions_to_print": _unset(NON_NEGATIVE, "unset: all"),
    "torch_empty_cache_steps": _unset(COUNT, "unset: never"),
    # --- processes and data loading
    "seed": SEED,
    "data_seed": _unset(SEED, "unset: seed"),
    "dataloader_num_workers": Range(0, note="0: load in the main process"),
    "dataloader_prefetch_factor": _unset(COUNT),
    "ddp_bucket_cap_mb": _unset(COUNT),
    "ddp_timeout": Range(1, 7 * 86400, note="seconds, at most a week (larger values overflow the clocks' limits)"),
    "local_rank": Range(0, special=(-1,), note="-1: not launched distributed (set by the launcher)"),
    # --- the policy
    "native_num_attention_heads": _unset(COUNT, "unset: MiniMind's 8"),
    "lora_r": COUNT,
    "lora_alpha": COUNT,
    "lora_dropout": Range(0, 1, high_open=True),
}

# Fields typed `int | str` whose string values are names, not numbers (TRL's `pad_to_multiple_of: auto`).
NAMED_VALUES = {"pad_to_multiple_of": ("auto", "none", "null")}


def as_number(key: str, value):
    """A command-line or YAML string as the number it spells (`"nan"`, `"1e-3"`, `"10"` as an int, so a 400-digit
    one stays exact), the value itself otherwise."""
    if isinstance(value, str) and value.strip().lower() not in NAMED_VALUES.get(key, ()):
        for kind in (int, float):
            try:
                return kind(value)
            except ValueError:  # also an integer of more digits than Python converts: then as a float (inf)
                continue
    return value


def range_problem(key: str, value) -> str | None:
    """`must be ..., got ...` when `value` is outside `key`'s range; None when it is inside or `key` has none."""
    rng = RANGES.get(key)
    value = as_number(key, value)
    if rng is None or isinstance(value, str) or rng.contains(value):
        return None
    note = f" ({rng.note})" if rng.note else ""
    infinite = isinstance(value, float) and not math.isfinite(value)
    huge = number_problem(value) is not None and not infinite
    return f"must be {rng.describe()}{note}, got {shown_number(value)}" + (
        ", which is not a finite number" if infinite else ", beyond 64 bits" if huge else ""
    )


@functools.cache
def _flag_fields(cls: type) -> dict[str, bool]:
    """{name: None allowed} of the fields of dataclass `cls` typed `bool` or `bool | None`."""
    hints = typing.get_type_hints(cls)
    flags = {}
    for item in fields(cls):
        hint = hints.get(item.name)
        if hint is bool:
            flags[item.name] = False
        elif typing.get_origin(hint) in (typing.Union, types.UnionType) and set(typing.get_args(hint)) == {bool,
                                                                                                          type(None)}:
            flags[item.name] = True
    return flags


@functools.cache
def _number_fields(cls: type) -> dict[str, tuple[type, bool]]:
    """{name: (int or float, whether a list of them)} of the fields of dataclass `cls` typed `int`, `float`,
    `list[int]`, `list[float]`, or any of these `| None`."""
    hints = typing.get_type_hints(cls)
    numbers = {}
    for item in fields(cls):
        hint = hints.get(item.name)
        union = typing.get_origin(hint) in (typing.Union, types.UnionType)
        kinds = set(typing.get_args(hint)) - {type(None)} if union else {hint}
        if len(kinds) != 1:
            continue
        (kind,) = kinds
        listed = typing.get_origin(kind) is list and len(typing.get_args(kind)) == 1
        kind = typing.get_args(kind)[0] if listed else kind
        if kind in (int, float):
            numbers[item.name] = (kind, listed)
    return numbers


def _read_number(name: str, kind: type, value):
    if not isinstance(value, str):
        return value
    try:
        return kind(value)
    except ValueError:
        what = "an integer" if kind is int else "a number"
        raise RecipeError(f"{name} must be {what}, got {value!r}") from None


def _read_numbers(obj) -> None:
    """A numeric field given as text (`beta="1e-3"` from Python; `reward_weights: [1e-3, 1]` in a recipe, a list the
    parser passes on as YAML read it) becomes the number it spells, as the parser makes a recipe's `beta: 1e-3` (YAML
    reads it as a string) or a command line's; text that spells none is refused naming the field. Left as text, it
    failed with a raw `TypeError` at the first step (a list: with a message about finite numbers)."""
    for name, (kind, listed) in _number_fields(type(obj)).items():
        value = getattr(obj, name)
        if listed and isinstance(value, (list, tuple)):
            items = [_read_number(f"{name}[{index}]", kind, item) for index, item in enumerate(value)]
            if any(new is not old for new, old in zip(items, value)):
                setattr(obj, name, type(value)(items))
        elif not listed:
            setattr(obj, name, _read_number(name, kind, value))


def _check_json_fields(obj) -> None:
    """A dict setting given as text (`loss_kwargs`, `lr_scheduler_kwargs`: transformers' `_VALID_DICT_FIELDS`, which
    it reads with `json.loads` when the text starts with `{`) must be JSON: YAML's `{coef: 0.1}` was a raw
    `JSONDecodeError`."""
    for name in getattr(obj, "_VALID_DICT_FIELDS", ()):
        value = getattr(obj, name, None)
        if isinstance(value, str) and value.startswith("{"):
            try:
                json.loads(value)
            except ValueError as exc:
                raise RecipeError(f"{name} is not JSON ({exc}): {value!r}; give a dict, or JSON text such as "
                                  "'{\"key\": 0.5}' (keys and strings in double quotes)") from None


def check_ranges(obj) -> None:
    """Refuse the first numeric field of dataclass `obj` outside its range, and the first field typed `bool` that
    holds something else (`share_prompts="yes"` from Python: a string is truthy, so "no" would switch it on),
    naming it (`RecipeError`). A number given as text is read first (`_read_numbers`), and a dict given as text must
    be JSON (`_check_json_fields`)."""
    _read_numbers(obj)
    _check_json_fields(obj)
    for item in fields(obj):
        problem = range_problem(item.name, getattr(obj, item.name))
        if problem is not None:
            raise RecipeError(f"{item.name} {problem}")
    for name, none_allowed in _flag_fields(type(obj)).items():
        value = getattr(obj, name)
        if not isinstance(value, bool) and not (none_allowed and value is None):
            raise RecipeError(f"{name} must be true or false{' (or unset)' if none_allowed else ''}, got {value!r}")


CISPO_LOSSES = ("cispo", "minimind3_cispo")


def loss_option_warnings(args) -> list[str]:
    """Legal settings that do something the user may not expect, for a warning (not a refusal)."""
    warnings = []
    if args.loss_type in CISPO_LOSSES:
        cap = args.epsilon_high if args.epsilon_high is not None else args.epsilon
        if cap < 1:
            source = "epsilon_high" if args.epsilon_high is not None else "epsilon (epsilon_high is unset)"
            warnings.append(
                f"loss_type {args.loss_type} caps every importance weight at {source} = {cap}, below 1: even an "
                "on-policy token (ratio 1) is weighted by less than 1, so every update is scaled down and tokens "
                "the policy made likelier are held back (MiniMind-3 and ScaleRL use 5.0)"
            )
    return warnings


def warn_loss_options(args) -> None:
    for message in loss_option_warnings(args):
        logger.warning(message)


__all__ = [
    "RANGES",
    "Range",
    "check_ranges",
    "loss_option_warnings",
    "number_problem",
    "range_problem",
    "shown_number",
    "warn_loss_options",
]
