"""Stage 2 of `minimind-trl grpo`: the run plan. Every check that needs no model, before any model is loaded.

Recipe keys were checked when parsing; here the policy and data locations, reward names, imports and the reward
model's `config.json`, logging integrations, option combinations, the resume checkpoint and its batch geometry
and the callbacks, and where a recipe that declares `upstream: <generation>` departs from that generation. The
same pass derives, once, what the later stages read: where the prompts are read from, where the policy loads from
(and how a native `.pth` converts), the prompt rendering, the agent's rollout and tools, the reward spec, the
policy's `from_pretrained` arguments, the adapter, the run identity and the model card. The result, `RunPlan`,
is what the building stage and the trainer read; nothing after it reads the script arguments, or checks or derives
these again.
"""

import dataclasses
import logging
import os
from dataclasses import dataclass, field

from ..agent.recipe import AgentSettings, agent_settings, check_agent_recipe
from ..agent.tools import toolbox_settings
from ..errors import RecipeError
from ..generations import deviations, format_value, get_generation
from ..loading_utils import check_writable, import_object
from ..prompt_rendering import PromptRendering
from ..rewards.registry import RewardSpec, check_reward_specs, reward_spec
from ..trainer.outputs.checkpointing import check_generation_alignment, check_resume_geometry, resolve_resume_checkpoint
from ..trainer.outputs.run_identity import normal_path, path_fingerprint
from ..trainer.checks.extras import check_extras
from ..trainer.checks.trainer_settings import check_rendering_settings
from ..trainer.outputs.output_dir import check_output_dir, run_inputs
from ..trainer.outputs.run_lock import check_output_dir_free
from ..trainer.outputs.run_safety import check_enough_prompts, check_resume_checkpoint
from ..trainer.algorithm.seam_choice import seam_run_identity
from ..trainer.outputs.model_card import RunCard, describe_run
from .hub import check_hub_repo
from .policy import (
    PolicySource,
    is_native_checkpoint,
    lora_config,
    model_init_kwargs,
    policy_source,
    quantization_config,
)
from .recipe import Recipe
from .run_data import (
    PromptSources, check_data_sources, held_out_source, mixture_identity, prompt_sources, training_source
)

logger = logging.getLogger(__name__)

REPORTING_EXTRAS = {"tensorboard": "tensorboard", "wandb": "wandb", "swanlab": "swanlab", "trackio": "trackio"}


def check_reporting(report_to: list[str]) -> None:
    """Each `report_to` name is an integration transformers knows, with its package installed; `none` and `all` stand
    alone (transformers' `TrainingArguments` turned them into a list already). Otherwise transformers raises a bare
    `ValueError` when the trainer is built."""
    from transformers.integrations import integration_utils

    known = integration_utils.INTEGRATION_TO_CALLBACK
    for name in report_to or []:
        if name not in known:
            alone = " stands alone" if name in ("none", "all") else " is not a logging integration"
            raise RecipeError(
                f"report_to {name!r}{alone}: report_to takes none, all, or one or more of {', '.join(known)} "
                "(on the command line --report_to tensorboard wandb, tensorboard,wandb or '[tensorboard, wandb]'; "
                "in a recipe report_to: [tensorboard, wandb])"
            )
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
        script_args.eval_dataset_name,
        script_args.reward_model_name_or_path,
        *(entry.path for entry in script_args.datasets or []),
    )
    return all(source is None or os.path.exists(os.path.expanduser(source)) for source in sources)


def load_callbacks(specs: list[str] | None) -> list:
    """The recipe's `package.module:ClassName` callbacks: transformers `TrainerCallback` classes, each built without
    arguments (or instances of one). Anything else would fail at the run's first event, with a raw traceback."""
    from transformers import TrainerCallback

    callbacks = []
    for spec in specs or []:
        found = import_object(spec, "callbacks", RecipeError, form="package.module:ClassName")
        if isinstance(found, TrainerCallback):
            callbacks.append(found)
            continue
        if not (isinstance(found, type) and issubclass(found, TrainerCallback)):
            raise RecipeError(f"callbacks {spec!r}: a {type(found).__name__}, not a transformers TrainerCallback class")
        try:
            callbacks.append(found())
        except Exception as exc:
            message = " ".join(str(exc).split())
            raise RecipeError(f"callbacks {spec!r}: {found.__name__}() raised {type(exc).__name__}: {message}") from exc
    return callbacks


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


# Recipe options that do not change what a run trains (a resume may change them): where the held-out prompts are read
# (the trainer records those prompts themselves, so a resume that evaluates on other ones is refused;
# `eval_dataset_name` is recorded when set), how the policy's attention is computed, DDP's buffer handling and extra
# callbacks.
RESUMABLE_OPTIONS = {
    "dataset_test_split", "eval_dataset_name", "attn_implementation", "ignore_bias_buffers", "callbacks"
}  # fmt: skip
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
    values["datasets"] = mixture_identity(script_args)
    if script_args.eval_dataset_name is not None:  # recorded only by a run that evaluates: one may start or stop it
        values["eval_dataset_name"] = normal_path(script_args.eval_dataset_name)
    values["model_fingerprint"] = path_fingerprint(model_args.model_name_or_path)
    values["reward_model_fingerprint"] = path_fingerprint(script_args.reward_model_name_or_path)
    return values


def run_card(
    script_args, training_args, base_model: str, recipe: Recipe, peft_config, prompts: PromptSources, own_data=False
) -> RunCard:
    """The model card's description of a CLI run: the recipe and its overrides, rewards, data (where `prompts` reads
    them) and settings (`own_data`: the caller brings the prompts, so the recipe's held-out source is not theirs)."""
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
        dataset=training_source(prompts),
        eval_dataset=None if own_data else held_out_source(prompts),
    )


@dataclass
class RunPlan:
    """What the checks established and derived, for the building stage and the trainer that follow."""

    resume_from_checkpoint: str | None
    callbacks: list
    upstream_departures: list[str] = field(default_factory=list)
    run_identity: dict = field(default_factory=dict)
    prompts: PromptSources = field(default_factory=PromptSources)  # where the prompts are read from
    policy: PolicySource | None = None  # where the policy loads from (a native .pth: its conversion's folder)
    rendering: PromptRendering = field(default_factory=PromptRendering)  # per-prompt choices, or none
    agent: AgentSettings | None = None  # the rollout and tools of `rollout: agent` (None: single-turn)
    chat_template_kwargs: dict = field(default_factory=dict)  # what every chat template renders with
    model_init_kwargs: dict = field(default_factory=dict)  # `from_pretrained`'s, for the policy and the reference
    peft_config: object = None  # the adapter TRL wraps the policy in (`lora_config`), or None
    quantization_config: object = None  # the policy's bitsandbytes weights under that adapter (QLoRA), or None
    run_card: RunCard | None = None  # the model card's description of the run
    rewards: RewardSpec = field(default_factory=RewardSpec)  # what the reward builders read


def check_run(
    script_args, training_args, model_args, check_data: bool = True, recipe: Recipe | None = None
) -> RunPlan:
    """All checks that need no model, then what the later stages read; raises a `ValueError` subclass whose
    message names the culprit. `check_data=False` when the caller brings its own dataset; `recipe` is what the
    model card shows of the recipe."""
    policy = policy_source(model_args, script_args, training_args.output_dir)
    quantization = quantization_config(model_args, training_args)
    prompts = prompt_sources(script_args, training_args)
    if check_data:
        check_data_sources(script_args, training_args)
    check_reward_specs(script_args, training_args)
    toolbox = toolbox_settings(script_args)
    rewards = reward_spec(script_args, training_args, toolbox)
    rendering = prompt_rendering(script_args, training_args)
    check_rendering_settings(rendering, training_args)
    agent = None
    if script_args.rollout == "agent":
        check_agent_recipe(script_args, training_args)
        agent = agent_settings(script_args, toolbox)
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
    if training_args.push_to_hub:  # last: a run refused for a local reason creates no repository
        check_hub_repo(training_args)
    return RunPlan(
        resume,
        load_callbacks(script_args.callbacks),
        departures,
        identity,
        prompts=prompts,
        policy=policy,
        rendering=rendering,
        agent=agent,
        chat_template_kwargs=dict(training_args.chat_template_kwargs or {}),
        model_init_kwargs=model_init_kwargs(model_args, training_args),
        peft_config=peft_config,
        quantization_config=quantization,
        run_card=run_card(
            script_args, training_args, policy.base_model, recipe or Recipe(), peft_config, prompts,
            own_data=not check_data,
        ),
        rewards=rewards,
    )


__all__ = [
    "RunPlan",
    "check_enough_prompts",
    "check_run",
    "disable_hub_telemetry",
    "local_sources_only",
    "prompt_rendering",
    "upstream_departures",
    "recipe_run_identity",
    "run_card",
]
