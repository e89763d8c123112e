"""`minimind-trl grpo`: MiniMind GRPO from a recipe YAML, the way TRL's scripts run.

    minimind-trl grpo --config recipes/minimind2/grpo/reasoning.yaml --model_name_or_path out/reason_512.pth ...
    accelerate launch --config_file recipes/accelerate/zero2.yaml -m minimind_trl.grpo --config RECIPE.yaml

Arguments are TRL's `TrlParser` over three dataclasses: `GRPOScriptArguments` (data, rewards, hand-off),
`MiniMindGRPOConfig` (training, with the seed's defaults) and TRL's `ModelConfig` (policy, LoRA). The YAML
gives defaults, the command line overrides them, and an unknown key in either is an error.

Everything that can be checked without loading a model (recipe keys, data and model paths, reward names and
imports, the reward model's config, batch divisibility over the processes, resume geometry, logging
integrations) is checked first. Programs (the demo) use the same path: `parse_recipe`, `build_trainer`,
`train`.
"""

import difflib
import functools
import importlib
import logging
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from .checkpointing import (
    AtomicCheckpointMixin,
    ResumeError,
    check_generation_alignment,
    check_resume_geometry,
    resolve_resume_checkpoint,
)
from .hub import PushCheckError, RunCard, check_push_folder, extend_model_card, render_run_section, seed_settings
from .model_loading import ModelSourceError, check_model_source, load_tokenizer, lora_config, model_init_kwargs
from .reward_registry import RewardSpecError, build_reward_funcs, check_reward_specs
from .script_args import GRPOScriptArguments

logger = logging.getLogger(__name__)

REPO_RECIPES = Path(__file__).resolve().parent.parent / "recipes"
DATA_FILE_SUFFIX = re.compile(r"\.(jsonl|json|parquet|csv|tsv|txt|arrow)(\.(gz|bz2|xz|zst))?$", re.IGNORECASE)
REPORTING_EXTRAS = {"tensorboard": "tensorboard", "wandb": "wandb", "swanlab": "swanlab", "trackio": "trackio"}


class RecipeError(ValueError):
    """A recipe or command line that cannot be parsed; the message names the file, line or key."""


def _setup_errors() -> tuple:
    from .convert import ConversionError
    from .data import RLAIFDataError

    return (
        RecipeError,
        ModelSourceError,
        RewardSpecError,
        ResumeError,
        PushCheckError,
        RLAIFDataError,
        ConversionError,
    )


@dataclass
class Recipe:
    """The recipe a run was parsed from (for the model card)."""

    path: str | None = None
    text: str | None = None
    overrides: list[str] = field(default_factory=list)


# --------------------------------------------------------------------------- parsing


def make_parser():
    from trl import ModelConfig, TrlParser

    from .trainer import MiniMindGRPOConfig

    return TrlParser((GRPOScriptArguments, MiniMindGRPOConfig, ModelConfig), prog="minimind-trl grpo")


def packaged_recipes_dir() -> Path:
    """Recipes shipped in the wheel (`minimind_trl/recipes`), or the checkout's `recipes/`."""
    packaged = Path(__file__).resolve().parent / "recipes"
    return packaged if packaged.is_dir() else REPO_RECIPES


def resolve_recipe(path: str) -> str:
    """A recipe path as given, or relative to the packaged recipes (`minimind2/grpo/reasoning.yaml`)."""
    if os.path.isfile(path):
        return path
    relative = path.removeprefix("recipes/")
    candidates = [relative, relative + ".yaml"] if not relative.endswith(".yaml") else [relative]
    for candidate in candidates:
        packaged = packaged_recipes_dir() / candidate
        if packaged.is_file():
            return str(packaged)
    raise RecipeError(f"recipe not found: {path} (nor under {packaged_recipes_dir()})")


def check_recipe_keys(parser, path: str) -> str:
    """Reject keys no dataclass knows, naming the file, line and the closest valid key; returns the text."""
    import yaml

    text = Path(path).read_text(encoding="utf-8")
    try:
        node = yaml.compose(text)
    except yaml.YAMLError as exc:
        raise RecipeError(f"{path}: invalid YAML: {exc}") from exc
    if node is None or not isinstance(node, yaml.MappingNode):
        raise RecipeError(f"{path}: a recipe must be a YAML mapping of argument names to values")
    known = {action.dest for action in parser._actions} | {"env"}
    for key_node, _ in node.value:
        key = key_node.value
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise RecipeError(f"{path}:{key_node.start_mark.line + 1}: unknown key {key!r}{hint}")
    return text


def parse_args(argv: list[str] | None = None):
    """Command line (with `--config RECIPE.yaml`) -> (script_args, training_args, model_args, recipe)."""
    argv = _split_config_flag(list(sys.argv[1:] if argv is None else argv))
    parser = make_parser()
    recipe = Recipe()
    if "--config" in argv:
        index = argv.index("--config")
        if index + 1 >= len(argv):
            raise RecipeError("--config needs a recipe path")
        argv[index + 1] = resolve_recipe(argv[index + 1])
        recipe.path = argv[index + 1]
        recipe.text = check_recipe_keys(parser, recipe.path)
        recipe.overrides = argv[:index] + argv[index + 2 :]
    else:
        recipe.overrides = list(argv)
    try:
        script_args, training_args, model_args = parser.parse_args_and_config(argv)
    except ValueError as exc:  # unknown command-line arguments, dataclass validation (e.g. batch divisibility)
        where = f" ({recipe.path})" if recipe.path else ""
        raise RecipeError(f"invalid arguments{where}: {exc}{_process_hint(exc)}{_cpu_hint(exc)}") from exc
    return script_args, training_args, model_args, recipe


def _split_config_flag(argv: list[str]) -> list[str]:
    """`--config=PATH` as `--config PATH`: TRL's parser only looks for the separate form."""
    return [part for arg in argv for part in (arg.split("=", 1) if arg.startswith("--config=") else [arg])]


def _cpu_hint(exc: Exception) -> str:
    if "doesn't support bf16" not in str(exc):
        return ""
    return (
        " [no GPU here: the seed recipes train in bf16; on CPU pass --use_cpu true, and --bf16 false for the "
        "seed's own CPU numerics (its bf16 autocast does nothing on CPU)]"
    )


def _process_hint(exc: Exception) -> str:
    if "divisible" not in str(exc):
        return ""
    world_size = os.environ.get("WORLD_SIZE", "1")
    return (
        f" [{world_size} process(es): the generation batch is per_device_train_batch_size x processes x "
        "steps_per_generation completions and must hold whole groups of num_generations]"
    )


def parse_recipe(recipe_path: str, overrides: dict | list[str] | None = None):
    """Programmatic `--config recipe_path` + overrides (`{"max_steps": 10}` or `["--max_steps", "10"]`)."""
    argv = ["--config", str(recipe_path)]
    if isinstance(overrides, dict):
        for key, value in overrides.items():
            argv.append(f"--{key}")
            argv += [str(item) for item in value] if isinstance(value, (list, tuple)) else [str(value)]
    elif overrides:
        argv += list(overrides)
    return parse_args(argv)


# --------------------------------------------------------------------------- checks before loading


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


def load_callbacks(specs: list[str] | None) -> list:
    callbacks = []
    for spec in specs or []:
        module_name, sep, attr = spec.partition(":")
        if not sep:
            module_name, _, attr = spec.rpartition(".")
        try:
            callback_class = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError, ValueError) as exc:
            raise RecipeError(f"callbacks: cannot import {spec!r}: {exc}") from exc
        callbacks.append(callback_class())
    return callbacks


@dataclass
class RunPlan:
    """What the checks established, for the loading steps that follow."""

    reward_model_kind: str | None
    resume_from_checkpoint: str | None
    callbacks: list


def check_run(script_args, training_args, model_args, check_data: bool = True) -> RunPlan:
    """All checks that need no model; raises a `ValueError` subclass whose message names the culprit.
    `check_data=False` when the caller brings its own dataset."""
    check_model_source(model_args.model_name_or_path, script_args.tokenizer_name_or_path)
    if check_data:
        check_dataset_source(script_args.dataset_name, script_args.dataset_config)
    kind = check_reward_specs(script_args, training_args)
    check_reporting(training_args.report_to)
    if script_args.save_native_pth and model_args.use_peft:
        raise RecipeError(
            "save_native_pth needs full weights but use_peft trains an adapter: merge it first "
            "(minimind-trl merge-lora ADAPTER_DIR OUT_DIR), then minimind-trl export OUT_DIR --format native"
        )
    plugin = training_args.deepspeed_plugin
    if (
        script_args.save_native_pth
        and plugin is not None
        and plugin.zero_stage == 3
        and not plugin.zero3_save_16bit_model
    ):
        raise RecipeError(
            "save_native_pth under ZeRO-3 needs the whole weights at save time: set zero3_save_16bit_model: true "
            "in the accelerate config (recipes/accelerate/zero3.yaml does)"
        )
    resume = resolve_resume_checkpoint(training_args.resume_from_checkpoint, training_args.output_dir)
    if resume is not None:
        check_resume_geometry(resume, training_args)
    check_generation_alignment(training_args)
    return RunPlan(kind, resume, load_callbacks(script_args.callbacks))


# --------------------------------------------------------------------------- building


@functools.cache
def _trainer_class():
    from .trainer import MiniMindGRPOTrainer

    class MiniMindGRPORunTrainer(AtomicCheckpointMixin, MiniMindGRPOTrainer):
        """`MiniMindGRPOTrainer` with crash-safe checkpoints and a model card describing the run."""

        run_card: RunCard | None = None
        save_native_pth = False

        def _complete_staged_checkpoint(self, folder):
            if self.save_native_pth:  # the seed wrote its .pth at every save
                export_native_weights(folder)

        def create_model_card(self, model_name=None, dataset_name=None, tags=None):
            super().create_model_card(model_name=model_name, dataset_name=dataset_name, tags=tags)
            if self.run_card is None or not self.is_world_process_zero():
                return
            section = render_run_section(self.run_card, self.state.log_history, self.hub_model_id)
            extend_model_card(os.path.join(self.args.output_dir, "README.md"), section, self.run_card.base_model)

    return MiniMindGRPORunTrainer


def load_train_dataset(script_args, training_args):
    from .data import load_rlaif_dataset

    with training_args.main_process_first(desc="loading the RLAIF data"):
        dataset = load_rlaif_dataset(
            script_args.dataset_name, split=script_args.dataset_train_split, data_files=script_args.dataset_data_files
        )
    if script_args.dataset_max_samples is not None:
        dataset = dataset.select(range(min(script_args.dataset_max_samples, len(dataset))))
    return dataset


def build_trainer(
    script_args, training_args, model_args, callbacks=None, recipe: Recipe | None = None, train_dataset=None
):
    """Check, then load data, policy source, tokenizer and rewards, and build the trainer (not yet trained).

    `callbacks` are added to those of `script_args.callbacks`; `train_dataset` replaces `dataset_name`'s data.
    """
    from .model_loading import resolve_policy

    plan = check_run(script_args, training_args, model_args, check_data=train_dataset is None)
    training_args.resume_from_checkpoint = plan.resume_from_checkpoint
    dataset = train_dataset if train_dataset is not None else load_train_dataset(script_args, training_args)
    policy = resolve_policy(model_args, script_args, training_args)
    tokenizer = load_tokenizer(policy.tokenizer_path, revision=model_args.model_revision)
    reward_funcs = build_reward_funcs(script_args, training_args, tokenizer, plan.reward_model_kind)
    training_args.model_init_kwargs = model_init_kwargs(model_args, training_args)
    peft_config = lora_config(model_args)

    trainer = _trainer_class()(
        model=policy.path,
        reward_funcs=reward_funcs,
        args=training_args,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=plan.callbacks + list(callbacks or []),
        peft_config=peft_config,
    )
    trainer.save_native_pth = script_args.save_native_pth
    recipe = recipe or Recipe()
    trainer.run_card = RunCard(
        base_model=policy.base_model,
        recipe=recipe.path,
        recipe_text=recipe.text,
        overrides=recipe.overrides,
        reward_funcs=list(script_args.reward_funcs),
        reward_weights=list(training_args.reward_weights or [1.0] * len(reward_funcs)),
        reward_model=script_args.reward_model_name_or_path,
        dataset=script_args.dataset_name,
        lora=(
            {"r": model_args.lora_r, "alpha": model_args.lora_alpha, "targets": model_args.lora_target_modules}
            if peft_config is not None
            else None
        ),
        settings=seed_settings(training_args, script_args),
    )
    return trainer


# --------------------------------------------------------------------------- running


def export_native_weights(folder: str) -> str:
    """The weights saved in `folder` as upstream MiniMind's `grpo_<hidden>[_moe].pth` (fp16), in that folder.

    Read back from the saved safetensors, so it works whatever held the weights in training (DDP, ZeRO-3).
    Called on one process only, so the folder is loaded whole: under ZeRO-3 a plain `from_pretrained` would
    partition it (`zero.Init`), giving empty tensors on one process and waiting forever for the others."""
    import torch

    from .export import export_native
    from .modeling_minimind import MiniMindForCausalLM
    from .reward_registry import whole_model_loading

    with whole_model_loading():
        model = MiniMindForCausalLM.from_pretrained(folder, dtype=torch.float32)
    suffix = "_moe" if model.config.use_moe else ""
    path = os.path.join(folder, f"grpo_{model.config.hidden_size}{suffix}.pth")
    export_native(model, path, dtype=torch.float16, force=True)
    return path


def _check_push_on_all_ranks(trainer) -> None:
    """`check_push_folder` on the main process; every rank raises its verdict (pushing saves collectively)."""
    from accelerate.utils import broadcast_object_list

    verdict = [None]
    if trainer.is_world_process_zero():
        try:
            check_push_folder(trainer.args.output_dir)
        except PushCheckError as exc:
            verdict = [str(exc)]
    if trainer.accelerator.num_processes > 1:
        broadcast_object_list(verdict)
    if verdict[0] is not None:
        raise PushCheckError(verdict[0])


def run(trainer, script_args):
    """Train (resuming if asked), save the final model, optionally export `.pth` and push to the Hub."""
    args = trainer.args
    trainer.train(resume_from_checkpoint=args.resume_from_checkpoint)
    trainer.save_model(args.output_dir)
    model_name = (args.hub_model_id or os.path.basename(os.path.abspath(args.output_dir))).split("/")[-1]
    # TRL's card links `dataset_name` on the Hub: only name Hub datasets there (local data is in the run section).
    hub_dataset = None if os.path.exists(script_args.dataset_name or "") else script_args.dataset_name
    trainer.create_model_card(model_name=model_name, dataset_name=hub_dataset)  # main process only
    trainer.accelerator.wait_for_everyone()
    if script_args.save_native_pth and trainer.is_world_process_zero():
        logger.info("native MiniMind weights written to %s", export_native_weights(args.output_dir))
    if args.push_to_hub:
        _check_push_on_all_ranks(trainer)
        trainer.push_to_hub(model_name=model_name, dataset_name=hub_dataset)
    trainer.accelerator.wait_for_everyone()
    return trainer


def train(script_args, training_args, model_args, callbacks=None, recipe: Recipe | None = None):
    """`build_trainer` + `run`: the whole of `minimind-trl grpo` after parsing. Returns the trainer."""
    trainer = build_trainer(script_args, training_args, model_args, callbacks=callbacks, recipe=recipe)
    return run(trainer, script_args)


def main(argv: list[str] | None = None) -> int:
    try:
        script_args, training_args, model_args, recipe = parse_args(argv)
        trainer = build_trainer(script_args, training_args, model_args, recipe=recipe)
    except _setup_errors() as exc:
        print(f"minimind-trl grpo: error: {exc}", file=sys.stderr)
        return 2
    run(trainer, script_args)
    if hasattr(trainer, "end"):  # transformers >= 5.18: close the trackers and the process group
        trainer.end()
    return 0


__all__ = [
    "Recipe",
    "RecipeError",
    "build_trainer",
    "check_run",
    "main",
    "make_parser",
    "parse_args",
    "parse_recipe",
    "run",
    "train",
]

if __name__ == "__main__":
    sys.exit(main())
