"""Stage 2 of `minimind-trl grpo`: the run plan. Every check that needs no model, before any model is loaded.

Recipe keys were checked when parsing; here the policy and data locations, reward names, imports and the reward
model's `config.json`, logging integrations, option combinations, the resume checkpoint and its batch geometry
and the callbacks, and where a recipe that declares `upstream: <generation>` departs from that generation. The
same pass derives, once, what the later stages read: where the policy loads from, the prompt rendering, the
policy's `from_pretrained` arguments, the adapter, the run identity and the model card. The result, `RunPlan`,
is what the building stage and the trainer read; nothing after it checks or derives these again.
"""

import dataclasses
import logging
import os
import re
from dataclasses import dataclass, field

from ..agent.recipe import check_agent_recipe
from ..errors import RecipeError
from ..generations import deviations, format_value, get_generation
from ..loading_utils import import_object
from ..prompt_rendering import PromptRendering
from ..rewards.registry import RewardContext, check_reward_specs
from ..trainer.outputs.checkpointing import check_generation_alignment, check_resume_geometry, resolve_resume_checkpoint
from ..trainer.outputs.run_identity import normal_path, path_fingerprint
from ..trainer.checks.extras import check_extras
from ..trainer.checks.trainer_settings import check_rendering_settings
from ..trainer.outputs.output_dir import check_output_dir, run_inputs
from ..trainer.outputs.run_safety import check_enough_prompts, check_output_dir_free, check_resume_checkpoint, check_writable
from ..trainer.algorithm.seam_choice import seam_run_identity
from ..trainer.outputs.model_card import RunCard, describe_run
from .policy import (
    PolicySource,
    check_model_source,
    is_native_checkpoint,
    lora_config,
    model_init_kwargs,
    policy_source,
    quantization_config,
)
from .recipe import Recipe

logger = logging.getLogger(__name__)

DATA_FILE_SUFFIX = re.compile(r"\.(jsonl|json|parquet|csv|tsv|txt|arrow)(\.(gz|bz2|xz|zst))?$", re.IGNORECASE)
REPORTING_EXTRAS = {"tensorboard": "tensorboard", "wandb": "wandb", "swanlab": "swanlab", "trackio": "trackio"}


def looks_like_hub_dataset(name: str) -> bool:
    """`owner/name` (one slash, no data-file extension, not a path form): what a Hub dataset id looks like."""
    owner, slash, repo = name.partition("/")
    return (
        bool(slash and owner and repo)
        and "/" not in repo
        and not name.startswith((".", "~"))
        and not DATA_FILE_SUFFIX.search(name)
    )


def check_dataset_source(dataset_name: str | None, dataset_config: str | None = None) -> None:
    """A local file or folder must exist; anything that is not a Hub id (`owner/name`) is taken as local,
    so a mistyped path fails here instead of as a `datasets` download error."""
    if not dataset_name:
        raise RecipeError("dataset_name is required (an RLAIF .jsonl file, a folder of them, or a Hub dataset)")
    if not os.path.exists(os.path.expanduser(dataset_name)) and not looks_like_hub_dataset(dataset_name):
        kind = "data file" if DATA_FILE_SUFFIX.search(dataset_name) else "local path"
        raise RecipeError(
            f"dataset_name: {kind} {dataset_name} does not exist (and is not a Hub dataset id 'owner/name')"
        )
    if dataset_config:
        raise RecipeError(
            f"dataset_config={dataset_config!r}: RLAIF data has no configurations; pick files with dataset_data_files"
        )


def check_reporting(report_to: list[str]) -> None:
    from transformers.integrations import integration_utils

    for name in report_to or []:
        available = getattr(integration_utils, f"is_{name}_available", None)
        if name in REPORTING_EXTRAS and available is not None and not available():
            raise RecipeError(
                f"report_to={name} but {name} is not installed: pip install 'minimind-trl[{REPORTING_EXTRAS[name]}]'"
            )


def disable_hub_telemetry() -> None:
    """Keep TRL's usage ping (`send_telemetry`) from reaching the Hub, unless the user set the variable.
    huggingface_hub reads the setting at import, so the module's constant is set as well."""
    from huggingface_hub import constants

    if "HF_HUB_DISABLE_TELEMETRY" not in os.environ:
        os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
        constants.HF_HUB_DISABLE_TELEMETRY = True


def local_sources_only(script_args, model_args) -> bool:
    """Whether the policy, tokenizer, data and reward model are all local paths (an offline run)."""
    sources = (
        model_args.model_name_or_path,
        script_args.tokenizer_name_or_path,
        script_args.dataset_name,
        script_args.reward_model_name_or_path,
    )
    return all(source is None or os.path.exists(os.path.expanduser(source)) for source in sources)


def load_callbacks(specs: list[str] | None) -> list:
    """The `package.module:ClassName` callbacks of the recipe, built without arguments."""
    return [import_object(spec, "callback", RecipeError, form="package.module:ClassName")() for spec in specs or []]


def prompt_rendering(script_args, training_args) -> PromptRendering:
    """MiniMind-3's per-prompt choices of the recipe (`thinking_ratio`, `system_prompt_ratio`), keyed on `seed`.
    No per-prompt choice with `rollout: agent`, which draws `thinking_ratio` per rollout itself."""
    if script_args.rollout == "agent":
        return PromptRendering(seed=training_args.seed)
    return PromptRendering(
        thinking_ratio=script_args.thinking_ratio,
        system_prompt_ratio=script_args.system_prompt_ratio,
        seed=training_args.seed,
    )


def upstream_departures(script_args, training_args) -> list[str]:
    """Where a run that declares `upstream: <generation>` departs from that generation's record, one line per
    setting (empty when it declares none: the defaults' generation is then only the model card's reference)."""
    if training_args.upstream is None:
        return []
    generation = get_generation(training_args.upstream)
    return [
        f"{row.name}: {format_value(row.run_value)} (upstream {format_value(row.upstream_value)}, {row.flag})"
        for row in deviations(generation, training_args, script_args)
    ]


# Recipe options that do not change what a run trains (a resume may change them): evaluation, how the policy's
# attention is computed, DDP's buffer handling and extra callbacks.
RESUMABLE_OPTIONS = {"dataset_test_split", "attn_implementation", "ignore_bias_buffers", "callbacks"}
LOCAL_SOURCES = ("model_name_or_path", "dataset_name", "tokenizer_name_or_path", "reward_model_name_or_path")


def recipe_run_identity(script_args, model_args) -> dict:
    """What the recipe says defines the run besides the training settings: data, rewards, reward model, policy and
    tokenizer options (local paths resolved, the policy and reward model fingerprinted), for `minimind_run.json`."""
    values = {}
    for args in (script_args, model_args):
        for item in dataclasses.fields(args):
            if item.name not in RESUMABLE_OPTIONS:
                values[item.name] = getattr(args, item.name)
    for key in LOCAL_SOURCES:
        values[key] = normal_path(values.get(key))
    values["model_fingerprint"] = path_fingerprint(model_args.model_name_or_path)
    values["reward_model_fingerprint"] = path_fingerprint(script_args.reward_model_name_or_path)
    return values


def run_card(script_args, training_args, base_model: str, recipe: Recipe, peft_config) -> RunCard:
    """The model card's description of a CLI run: the recipe and its overrides, rewards, data and settings."""
    return describe_run(
        base_model,
        training_args,
        script_args,
        peft_config,
        recipe=recipe.path,
        recipe_text=recipe.text,
        overrides=recipe.overrides,
        reward_funcs=list(script_args.reward_funcs),
        reward_weights=list(training_args.reward_weights or [1.0] * len(script_args.reward_funcs)),
        reward_model=script_args.reward_model_name_or_path,
        dataset=script_args.dataset_name,
    )


@dataclass
class RunPlan:
    """What the checks established and derived, for the building stage and the trainer that follow."""

    resume_from_checkpoint: str | None
    callbacks: list
    upstream_departures: list[str] = field(default_factory=list)
    run_identity: dict = field(default_factory=dict)
    policy: PolicySource | None = None  # where the policy loads from (a native .pth: its conversion's folder)
    rendering: PromptRendering = field(default_factory=PromptRendering)  # per-prompt choices, or none
    chat_template_kwargs: dict = field(default_factory=dict)  # what every chat template renders with
    model_init_kwargs: dict = field(default_factory=dict)  # `from_pretrained`'s, for the policy and the reference
    peft_config: object = None  # the adapter TRL wraps the policy in (`lora_config`), or None
    quantization_config: object = None  # the policy's bitsandbytes weights under that adapter (QLoRA), or None
    run_card: RunCard | None = None  # the model card's description of the run
    reward_context: RewardContext = field(default_factory=RewardContext)  # what the reward builders read


def check_run(
    script_args, training_args, model_args, check_data: bool = True, recipe: Recipe | None = None
) -> RunPlan:
    """All checks that need no model, then what the later stages read; raises a `ValueError` subclass whose
    message names the culprit. `check_data=False` when the caller brings its own dataset; `recipe` is what the
    model card shows of the recipe."""
    check_model_source(model_args.model_name_or_path, script_args.tokenizer_name_or_path)
    policy = policy_source(model_args, script_args, training_args.output_dir)
    quantization = quantization_config(model_args, training_args)
    if check_data:
        check_dataset_source(script_args.dataset_name, script_args.dataset_config)
    check_reward_specs(script_args, training_args)
    rendering = prompt_rendering(script_args, training_args)
    check_rendering_settings(rendering, training_args)
    if script_args.rollout == "agent":
        check_agent_recipe(script_args, training_args)
    check_reporting(training_args.report_to)
    check_extras(training_args)
    plugin = training_args.deepspeed_plugin
    if (
        training_args.save_native_pth
        and plugin is not None
        and plugin.zero_stage == 3
        and not plugin.zero3_save_16bit_model
    ):
        raise RecipeError(
            "save_native_pth under ZeRO-3 needs the whole weights at save time: set zero3_save_16bit_model: true "
            "in the accelerate config (recipes/accelerate/zero3.yaml does)"
        )
    resume = resolve_resume_checkpoint(training_args.resume_from_checkpoint, training_args.output_dir)
    if training_args.should_save:
        check_writable(training_args.output_dir)
        check_output_dir_free(training_args.output_dir)
    identity = recipe_run_identity(script_args, model_args) | seam_run_identity(training_args)
    check_output_dir(
        training_args.output_dir,
        resume is not None,
        training_args.overwrite_output_dir,
        run_inputs(identity),
        save_native_pth=training_args.save_native_pth,
        converts_native=is_native_checkpoint(model_args.model_name_or_path),
    )
    if resume is not None:
        check_resume_checkpoint(resume, training_args, identity)  # first: names a damaged minimind_run.json
        check_resume_geometry(resume, training_args)
    check_generation_alignment(training_args)
    if local_sources_only(script_args, model_args):  # nothing here needs the Hub: no usage ping either
        disable_hub_telemetry()
    departures = upstream_departures(script_args, training_args)
    if departures:
        title = get_generation(training_args.upstream).title
        logger.warning(
            "this run follows %s except in %d setting(s):\n  %s", title, len(departures), "\n  ".join(departures)
        )
    peft_config = lora_config(model_args)  # after the run identity, which records the recipe's own targets
    return RunPlan(
        resume,
        load_callbacks(script_args.callbacks),
        departures,
        identity,
        policy=policy,
        rendering=rendering,
        chat_template_kwargs=dict(training_args.chat_template_kwargs or {}),
        model_init_kwargs=model_init_kwargs(model_args, training_args),
        peft_config=peft_config,
        quantization_config=quantization,
        run_card=run_card(script_args, training_args, policy.base_model, recipe or Recipe(), peft_config),
        reward_context=RewardContext(training_args.device, dict(training_args.chat_template_kwargs or {})),
    )


__all__ = [
    "RunPlan",
    "check_dataset_source",
    "check_enough_prompts",
    "check_run",
    "disable_hub_telemetry",
    "local_sources_only",
    "looks_like_hub_dataset",
    "prompt_rendering",
    "upstream_departures",
    "recipe_run_identity",
    "run_card",
]
