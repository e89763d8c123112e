"""What a GRPO run writes into its `output_dir`, and what it must leave alone there.

A run fills `output_dir`: the final model, tokenizer and `training_args.bin` (moved in file by file), the model card
`README.md`, `checkpoint-N` folders (rotated, or deleted by `overwrite_output_dir`), `_staging`, the lock, with
`save_native_pth` upstream's `grpo_<hidden>[_moe].pth` and its `.config.json`, and for a native `.pth` policy the
converted `_base_model`. `check_output_dir` runs before any model loads (`run_plan`) and again when training starts
(`run_safety.guarded_run`, also for Python users). It refuses:

* an `output_dir` that would overwrite or delete an input of the run (the policy, which is also the KL reference,
  the tokenizer, the reward model, the data), by file identity (`path_identity.check_output_apart`), even with
  `overwrite_output_dir`: the output is an input, holds one where the run writes, or lies inside one;
* entries the run would replace that no minimind-trl run wrote (the user's `README.md`, an upstream `.pth`), even
  with `overwrite_output_dir`;
* a new run over another run's checkpoints or finished model, unless `overwrite_output_dir` (or resuming).
"""

import logging
import os
import re
import shutil
from dataclasses import dataclass

from ...errors import OutputDirError
from ...path_identity import MODEL_INPUT_FILES, Input, check_output_apart
from .checkpointing import STAGING_DIR
from .model_card import CARD_SECTION_TITLE

logger = logging.getLogger(__name__)

LOCK_NAME = "_minimind_run.lock"  # `_` prefix: left out of the Trainer's Hub uploads, like `_staging`
CONVERTED_DIR = "_base_model"  # where a native `.pth` policy is converted (`cli.policy`)
CHECKPOINT_DIR = re.compile(r"^checkpoint-\d+$")
NATIVE_OUTPUT = re.compile(r"^grpo_\d+(_moe)?\.(pth|config\.json)$")  # `save_native_pth`'s file and its sidecar
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "adapter_model.safetensors",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
    "adapter_model.bin",
)
# The model a run saves at the top of output_dir (the Trainer's save, moved into place file by file) and its card.
SAVED_FILES = re.compile(rf"{MODEL_INPUT_FILES.pattern}|^(README\.md|training_args\.bin)$")


def run_writes(save_native_pth: bool, converts_native: bool = False) -> re.Pattern:
    """The entries at the top of `output_dir` a run writes, replaces or deletes."""
    names = [SAVED_FILES.pattern, CHECKPOINT_DIR.pattern, rf"^({STAGING_DIR}|{LOCK_NAME})$"]
    names += [NATIVE_OUTPUT.pattern] if save_native_pth else []
    names += [rf"^{CONVERTED_DIR}$"] if converts_native else []
    return re.compile("|".join(f"(?:{name})" for name in names))


def run_inputs(identity: dict, tokenizer: str | None = None, reward_models=()) -> list[Input]:
    """Every local input of a run, from its run identity (`run_identity`, the CLI's recipe keys included): the policy
    (also the KL reference), the tokenizer, the reward model(s) and the data (read whole: `dataset_name` or each
    file of a `datasets:` mixture, and the held-out prompts)."""
    inputs = [
        Input("model_name_or_path", identity.get("model_name_or_path")),
        Input("tokenizer_name_or_path", identity.get("tokenizer_name_or_path") or tokenizer),
        Input("reward_model_name_or_path", identity.get("reward_model_name_or_path")),
        Input("dataset_name", identity.get("dataset_name"), reads=None),
        Input("eval_dataset_name", identity.get("eval_dataset_name"), reads=None),
    ]
    mixture = identity.get("datasets") or []
    inputs += [Input(f"datasets[{index}].path", entry.get("path"), reads=None) for index, entry in enumerate(mixture)
               if isinstance(entry, dict)]
    recorded = identity.get("reward_models") or {}
    paths = [entry.get("name_or_path") for entry in recorded.values() if isinstance(entry, dict)]
    inputs += [Input("reward model", path) for path in [*paths, *reward_models] if isinstance(path, str)]
    return [item for item in inputs if isinstance(item.path, str) and item.path]


def reward_model_sources(reward_funcs) -> list[str]:
    """Where the reward models behind `reward_funcs` were loaded from (a model's `_name_or_path`, also the model of a
    scorer-based reward term), for `run_inputs`."""
    sources = []
    for func in reward_funcs if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]:
        model = getattr(getattr(func, "scorer", None), "model", func)
        path = getattr(getattr(model, "config", None), "_name_or_path", None)
        if isinstance(path, str) and path:
            sources.append(path)
    return sources


def old_checkpoints(output_dir: str) -> list[str]:
    if not os.path.isdir(output_dir):
        return []
    names = [name for name in os.listdir(output_dir) if CHECKPOINT_DIR.match(name)]
    return sorted(names, key=lambda name: int(name.split("-")[1]))


def finished_model(output_dir: str) -> list[str]:
    """The files of a saved model at the top of `output_dir` (`config.json` and weights), or []."""
    if not os.path.isfile(os.path.join(output_dir, "config.json")):
        return []
    weights = [name for name in WEIGHT_FILES if os.path.isfile(os.path.join(output_dir, name))]
    return ["config.json", *weights] if weights else []


def saved_model(output_dir: str) -> list[str]:
    """The files of the final save at the top of `output_dir`: a model (`config.json` and weights) or a LoRA adapter
    (`adapter_config.json` and its weights), or []."""
    model = finished_model(output_dir)
    if model or not os.path.isfile(os.path.join(output_dir, "adapter_config.json")):
        return model
    weights = [name for name in WEIGHT_FILES if name.startswith("adapter_") and os.path.isfile(os.path.join(output_dir, name))]
    return ["adapter_config.json", *weights] if weights else []


@dataclass(frozen=True)
class FinalOutputs:
    """Which of a run's final outputs `output_dir` holds: the saved model (or adapter), the model card with the run's
    section, upstream's native `.pth` with its sidecar. A resume of a finished run writes only what is missing."""

    model: bool = False
    card: bool = False
    native: bool = False

    @classmethod
    def found_in(cls, output_dir: str) -> "FinalOutputs":
        names = os.listdir(output_dir) if os.path.isdir(output_dir) else []
        native = [name for name in names if NATIVE_OUTPUT.match(name) and name.endswith(".pth")]
        return cls(
            model=bool(saved_model(output_dir)),
            card="README.md" in names and _written_by_a_run(output_dir, "README.md"),
            native=any(_written_by_a_run(output_dir, name) for name in native),
        )

    def missing(self, save_native_pth: bool) -> list[str]:
        """What a finished run's folder lacks, in words: `model`, `model card`, `native .pth`."""
        wanted = [(self.model, "model"), (self.card, "model card"), (self.native or not save_native_pth, "native .pth")]
        return [name for present, name in wanted if not present]


def run_length(args) -> str:
    """What sets the run's length, for messages: `max_steps N` or `num_train_epochs E`."""
    return f"max_steps {args.max_steps}" if args.max_steps > 0 else f"num_train_epochs {args.num_train_epochs:g}"


def _written_by_a_run(folder: str, name: str) -> bool:
    """Whether `folder/name`, an entry a run replaces, looks like a minimind-trl run's (a card with the run's
    section; a native `.pth` with the sidecar `export_native` writes beside it)."""
    path = os.path.join(folder, name)
    if name == "README.md":
        try:
            with open(path, encoding="utf-8") as f:
                return CARD_SECTION_TITLE in f.read()
        except (OSError, UnicodeDecodeError):
            return False
    if name.endswith(".pth"):
        return os.path.isfile(path[: -len(".pth")] + ".config.json")
    return True


def foreign_entries(output_dir: str, save_native_pth: bool) -> list[str]:
    """Entries the run would replace that no run wrote (the user's README.md, upstream's own `grpo_512.pth`)."""
    if not os.path.isdir(output_dir):
        return []
    checked = [name for name in sorted(os.listdir(output_dir)) if name == "README.md" or (
        save_native_pth and NATIVE_OUTPUT.match(name) and name.endswith(".pth"))]  # fmt: skip
    return [name for name in checked if not _written_by_a_run(output_dir, name)]


def replaced_files(output_dir: str, save_native_pth: bool) -> list[str]:
    """The files at the top of `output_dir` a new run's final save (and card) would replace."""
    if not os.path.isdir(output_dir):
        return []
    pattern = re.compile(SAVED_FILES.pattern + (f"|{NATIVE_OUTPUT.pattern}" if save_native_pth else ""))
    return sorted(name for name in os.listdir(output_dir) if pattern.match(name))


def check_inputs_apart(output_dir: str, inputs, save_native_pth: bool = False, converts_native: bool = False) -> None:
    """No input of the run where it writes (`path_identity.check_output_apart` with the run's `run_writes`)."""
    writes = run_writes(save_native_pth, converts_native)
    note = " (overwrite_output_dir does not change that)"
    check_output_apart(output_dir, inputs, OutputDirError, "output_dir", writes=writes, note=note)


def check_output_dir(
    output_dir: str, resuming: bool, overwrite: bool, inputs=(), save_native_pth: bool = False,
    converts_native: bool = False,
) -> None:  # fmt: skip
    """A new run must not overwrite an input, replace what no run wrote, mix its checkpoints with another run's (a
    later `resume last` would continue that one), or replace a finished model without being told to."""
    check_inputs_apart(output_dir, inputs, save_native_pth, converts_native)
    foreign = foreign_entries(output_dir, save_native_pth)
    if foreign:
        raise OutputDirError(
            f"output_dir {output_dir} holds {', '.join(foreign)}, which this run would replace (with its model card / "
            "native weights) and which no minimind-trl run wrote; overwrite_output_dir does not replace them: move "
            "them out or pick another output_dir"
        )
    if resuming or overwrite:
        return
    found = old_checkpoints(output_dir)
    if found:
        raise OutputDirError(
            f"output_dir {output_dir} holds another run's checkpoints ({', '.join(found)}); a new run would replace "
            "some of them and keep the others. Continue that run with --resume_from_checkpoint last, start over "
            "with --overwrite_output_dir true (deletes them), or pick another output_dir."
        )
    model_files = finished_model(output_dir)
    replaced = replaced_files(output_dir, save_native_pth)
    if model_files or replaced:
        listed = ", ".join(model_files or replaced)
        what = f"a finished model ({listed})" if model_files else f"files of a model ({listed})"
        raise OutputDirError(
            f"output_dir {output_dir} holds {what}; a new run would replace it. Start over with "
            "--overwrite_output_dir true (replaces it), or pick another output_dir."
        )


def clear_old_checkpoints(output_dir: str) -> None:
    """`overwrite_output_dir`: remove the earlier run's checkpoints (and any staging it left) before this one."""
    for name in old_checkpoints(output_dir) + [STAGING_DIR]:
        path = os.path.join(output_dir, name)
        if os.path.isdir(path):
            logger.warning("overwrite_output_dir: removing %s", path)
            shutil.rmtree(path)


__all__ = [
    "CHECKPOINT_DIR",
    "FinalOutputs",
    "LOCK_NAME",
    "WEIGHT_FILES",
    "check_inputs_apart",
    "check_output_dir",
    "clear_old_checkpoints",
    "finished_model",
    "foreign_entries",
    "old_checkpoints",
    "reward_model_sources",
    "run_inputs",
    "run_length",
    "run_writes",
    "saved_model",
]
