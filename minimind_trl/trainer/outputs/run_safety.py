"""What keeps one run from spoiling another's output folder, and a resume from being silently inexact.

* `run_lock.output_dir_lock` (its own module): one run per output folder, by a lock file held for the run.
* `output_dir.check_output_dir` (its own module): what the run writes into its folder must not overwrite an input
  or another run's work; `overwrite_output_dir` has `clear_old_checkpoints` remove old checkpoints at the start.
* `check_resume_checkpoint`: the checkpoint must hold what an exact resume reads (weights, optimizer, scheduler,
  the RNG state of every process, DeepSpeed's state) in readable form, and must have been written with this
  run's settings (`recipe_settings`, recorded in `minimind_run.json`; a loss's keyword arguments as in effect);
  `accept_inexact_resume` lets a checkpoint without optimizer/scheduler/RNG state resume anyway, with a warning.
"""

import json
import logging
import os
import re
import struct
import zipfile
from contextlib import contextmanager
from dataclasses import dataclass

from ...errors import MiniMindTRLError, ResumeError
from ..algorithm.policy_losses import check_loss_kwargs
from .checkpointing import RUN_INFO_NAME, checkpoint_step, resolve_resume_checkpoint, resume_state_files
from .output_dir import (  # the output folder's rules, re-exported for older imports
    WEIGHT_FILES,
    check_inputs_apart,
    check_output_dir,
    clear_old_checkpoints,
    run_inputs,
)
from .run_identity import changed_keys
from .run_lock import output_dir_lock

logger = logging.getLogger(__name__)

# Settings a resume may change: where things go and how they are reported, how long to train, the batch geometry
# (checked on its own, with its own message, by `check_resume_geometry`), `share_prompts` (the same arithmetic up
# to summation order) and `compile_generation` (the same sampling, through compiled kernels).
RESUMABLE_SETTINGS = re.compile(
    r"^(output_dir|logging_.*|log_.*|save_.*|hub_.*|push_to_hub.*|report_to|run_name|project|trackio_.*|wandb_.*|"
    r"resume_from_checkpoint|overwrite_output_dir|accept_inexact_resume|max_steps|num_train_epochs|dataloader_.*|"
    r"eval_.*|per_device_eval_batch_size|do_eval|do_predict|ddp_.*|fsdp.*|deepspeed|accelerator_config|"
    r"per_device_train_batch_size|gradient_accumulation_steps|steps_per_generation|generation_batch_size|"
    r"gradient_checkpointing.*|activation_checkpointing.*|disable_tqdm|num_completions_to_print|local_rank|"
    r"use_cpu|torch_empty_cache_steps|include_.*|skip_memory_metrics|ignore_data_skip|model_init_kwargs|upstream|"
    r"share_prompts|compile_generation)$"
)

UNSAFE = "unsafe: "  # how `_unreadable` marks a file a safe load refuses (a pickle that would run code)


# --------------------------------------------------------------------------- the output folder


# --------------------------------------------------------------------------- the data


def check_enough_prompts(dataset, training_args, source: str | None = None, error=MiniMindTRLError) -> None:
    """A step draws `generation_batch_size / num_generations` distinct prompts; with fewer, TRL's sampler yields
    no batch at all and the run would save the untouched policy as its result."""
    needed = training_args.generation_batch_size // training_args.num_generations
    if len(dataset) < needed:
        where = f" in {source}" if source else ""
        raise error(
            f"{len(dataset)} prompt(s){where}, but one step needs {needed} (generation_batch_size "
            f"{training_args.generation_batch_size} / num_generations {training_args.num_generations}); add prompts "
            "or lower per_device_train_batch_size / steps_per_generation (check dataset_max_samples too)"
        )


# --------------------------------------------------------------------------- the resume checkpoint


def recipe_settings(args) -> dict:
    """The settings that define what a run trains (JSON values), for the check that a resume continues it.
    `loss_kwargs` as in effect (the loss's declared defaults with the recipe's values over them), not as written:
    a default the loss's module changed between a run and its resume is a change, `{}` for `null` is none."""
    values = args.to_dict()
    values["loss_kwargs"] = check_loss_kwargs(args)
    values = json.loads(json.dumps(values, default=str))
    return {key: value for key, value in values.items() if not RESUMABLE_SETTINGS.match(key)}


def _unreadable(path: str) -> str | None:
    """Why a checkpoint file cannot be read (truncated or not the format its name says), or None."""
    try:
        if path.endswith(".safetensors"):
            with open(path, "rb") as f:
                (header_size,) = struct.unpack("<Q", f.read(8))
                header = json.loads(f.read(header_size))
            end = max((entry["data_offsets"][1] for key, entry in header.items() if key != "__metadata__"), default=0)
            if os.path.getsize(path) < 8 + header_size + end:
                return f"truncated ({os.path.getsize(path)} bytes, the header describes {8 + header_size + end})"
        elif path.endswith((".pt", ".pth", ".bin")):
            zipfile.ZipFile(path).close()
            return _unsafe_to_load(path)
        elif path.endswith(".json"):
            with open(path, encoding="utf-8") as f:
                json.load(f)
    except (OSError, ValueError, KeyError, TypeError, struct.error, zipfile.BadZipFile) as exc:
        return f"unreadable ({type(exc).__name__}: {exc})"
    return None


def _unsafe_to_load(path: str) -> str | None:
    """Why `torch.load(weights_only=True)` (the Trainer's load, numpy allowed as transformers allows it) refuses
    the file, or None. The data is memory-mapped, not read; a pickle that would run code is named as unsafe."""
    import pickle

    import torch
    from transformers.trainer_pt_utils import safe_globals

    try:
        with safe_globals():
            torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except pickle.UnpicklingError as exc:
        found = re.search(r"GLOBAL (\S+)", str(exc))
        detail = f", it calls {found.group(1)}" if found else ""
        return f"{UNSAFE}a pickle that would run code when loaded{detail}; refused, never loaded"
    except Exception as exc:  # truncated records, not a torch file: the name and the reason, not a traceback
        return f"unreadable ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
    return None


def _not_a_run_record(info) -> str | None:
    """Why a parsed `minimind_run.json` is not one this package writes (a foreign or hand-edited file), or None."""
    if not isinstance(info, dict):
        return f"a JSON {type(info).__name__}, not an object"
    for key in ("recipe", "run"):
        if key in info and not isinstance(info[key], dict):
            return f"its {key!r} is not an object but {json.dumps(info[key])[:40]}"
    for key in ("world_size", "per_device_train_batch_size", "generation_batch_size"):
        if not isinstance(info.get(key), int) or isinstance(info.get(key), bool):
            return f"no integer {key!r}"
    return None


def read_run_info(checkpoint: str, accept_unchecked: bool) -> dict | None:
    """The checkpoint's run record, or None when there is none (stock TRL) or it is foreign and
    `accept_unchecked` (accept_inexact_resume) says to resume anyway, with a warning that nothing was checked."""
    path = os.path.join(checkpoint, RUN_INFO_NAME)
    if os.path.isfile(path) and (problem := _unreadable(path)):
        raise ResumeError(f"{path} is {problem}; resume from an earlier checkpoint")
    problem = None
    if not os.path.isfile(path):
        problem = f"has no {RUN_INFO_NAME} (not written by minimind-trl, e.g. by stock TRL)"
    else:
        with open(path, encoding="utf-8") as f:
            info = json.load(f)
        if (why := _not_a_run_record(info)) is None:
            return info
        problem = f"has a {RUN_INFO_NAME} that is not minimind-trl's run record ({why})"
    if not accept_unchecked:
        raise ResumeError(
            f"{checkpoint} {problem}, so nothing checks that this resume continues the same run (settings, data, "
            "rewards, model, batch split). Resume a checkpoint of this run, or pass --accept_inexact_resume true to "
            "continue unchecked."
        )
    logger.warning(
        "accept_inexact_resume: %s %s; NOTHING was checked (settings, data, rewards, model, batch split): the run "
        "continues whatever this command says, which may not be the run that wrote the checkpoint",
        checkpoint,
        problem,
    )
    return None


def check_resume_checkpoint(checkpoint: str, args, run_identity: dict | None = None) -> list[str]:
    """Refuse a checkpoint that is damaged, incomplete for an exact resume, or written by a different run: other
    training settings (`recipe_settings`) or another policy, tokenizer, rewards or data (`run_identity`, see
    `run_identity.py`). Returns the state files an accepted inexact resume must not load (damaged or unsafe)."""
    accept = getattr(args, "accept_inexact_resume", False)
    path = os.path.join(checkpoint, "trainer_state.json")
    if os.path.isfile(path) and (problem := _unreadable(path)):
        raise ResumeError(f"{path} is {problem}; resume from an earlier checkpoint")
    record = read_run_info(checkpoint, accept)
    info = record or {}

    launch_weights, needed = resume_state_files(checkpoint, info, args)
    for name in launch_weights:  # what this launch loads the weights from: missing or damaged, nothing resumes
        if not os.path.isfile(os.path.join(checkpoint, name)):
            raise ResumeError(f"{checkpoint} holds no {name}, which an FSDP resume loads the weights from")
    weights = [name for name in (*WEIGHT_FILES, *launch_weights) if os.path.isfile(os.path.join(checkpoint, name))]
    deepspeed = "DEEPSPEED" in str(info.get("distributed_type", "")) or os.path.isfile(
        os.path.join(checkpoint, "latest")
    )
    if not weights and not deepspeed:
        raise ResumeError(f"{checkpoint} holds no model weights ({' / '.join(WEIGHT_FILES[:3])}); resume from another")
    for name in weights:
        path = os.path.join(checkpoint, name)
        if problem := _unreadable(path):
            raise ResumeError(f"{path} is {problem}; resume from an earlier checkpoint")

    world_size = int(info.get("world_size", 1))
    needed += ["rng_state.pth"] if world_size <= 1 else [f"rng_state_{rank}.pth" for rank in range(world_size)]
    missing = [name for name in needed if not os.path.isfile(os.path.join(checkpoint, name))]
    problems = {
        name: problem
        for name in needed
        if name not in missing and name != "latest" and (problem := _unreadable(os.path.join(checkpoint, name)))
    }
    unsafe = [f"{name} ({why.removeprefix(UNSAFE)})" for name, why in problems.items() if why.startswith(UNSAFE)]
    damaged = [f"{name} ({why})" for name, why in problems.items() if not why.startswith(UNSAFE)]
    if missing or damaged or unsafe:
        parts = [f"missing {', '.join(missing)}"] if missing else []
        parts += [f"damaged {', '.join(damaged)}"] if damaged else []
        parts += [f"unsafe {', '.join(unsafe)}"] if unsafe else []
        what = "; ".join(parts)
        if not accept:
            kind = "incomplete for an exact resume" if missing or damaged else "unsafe to resume"
            raise ResumeError(
                f"{checkpoint} is {kind}: {what}. Resume from another checkpoint, or pass "
                "--accept_inexact_resume true to continue without that state, never loading it (fresh optimizer/"
                "scheduler/RNG state: the result will differ from an uninterrupted run)."
            )
        logger.warning(
            "accept_inexact_resume: resuming %s although %s; that state is not loaded (fresh instead) and the run is "
            "not an exact continuation",
            checkpoint,
            what,
        )
    if record is not None:
        check_same_run(checkpoint, record, args, run_identity)
    return sorted(problems)


def check_same_run(checkpoint: str, record: dict, args, run_identity: dict | None) -> None:
    """Refuse a resume whose training settings or run identity (policy, tokenizer, rewards, data) differ from the
    checkpoint's record, listing every changed key."""
    saved_settings, now_settings = record.get("recipe"), recipe_settings(args)
    changed = [] if saved_settings is None else changed_keys(saved_settings, now_settings)
    details = [f"{key}: {saved_settings[key]!r} -> {now_settings[key]!r}" for key in changed]
    saved_run = record.get("run")
    if run_identity is not None and saved_run is not None:
        now_run = json.loads(json.dumps(run_identity, default=str))
        changed_run = changed_keys(saved_run, now_run)
        details += [f"{key}: {_short(saved_run[key])} -> {_short(now_run[key])}" for key in changed_run]
        changed += changed_run
    elif run_identity is not None:
        logger.warning(
            "%s was written by an older minimind-trl that did not record the run's policy, tokenizer, rewards and "
            "data: only the training settings were checked; make sure those are the ones it was trained with",
            checkpoint,
        )
    if "loss_kwargs" in changed:
        details[changed.index("loss_kwargs")] += " (in effect: the loss's declared defaults with the recipe's over them)"
    if changed:
        shown = ", ".join(details[:8]) + (f", ... ({len(details) - 8} more)" if len(details) > 8 else "")
        raise ResumeError(
            f"{checkpoint} was written by a run with other settings ({shown}); changed: {', '.join(changed)}. A resume "
            "continues the same run (only logging, where files go, max_steps and the batch split may change). "
            "Restore them, or start a new run in another output_dir (initialised from the checkpoint's weights if "
            "you want them)."
        )


def _short(value, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass(frozen=True)
class GuardedResume:
    """What `guarded_run` established about a resume: the checkpoint (None: a fresh run), its optimizer step, and the
    state files an accepted inexact resume must not load (damaged or unsafe)."""

    checkpoint: str | None = None
    step: int | None = None
    skipped: tuple[str, ...] = ()


@contextmanager
def guarded_run(args, resume_from_checkpoint, train_dataset=None, inputs=(), run_identity=None):
    """Around `Trainer.train`: refuse a dataset too small for one step, hold the output folder (saving process),
    refuse what would mix or inexactly continue runs or write over an input (`inputs`: `path_identity.Input`s, the
    policy, tokenizer, reward models and data), and clear the old checkpoints `overwrite_output_dir` asked to
    replace. Yields a `GuardedResume`."""
    if train_dataset is not None and hasattr(train_dataset, "__len__"):
        check_enough_prompts(train_dataset, args)
    resume = None
    if resume_from_checkpoint not in (None, False):
        resume = resolve_resume_checkpoint(str(resume_from_checkpoint), args.output_dir)
    native = getattr(args, "save_native_pth", False)
    check_inputs_apart(args.output_dir, inputs, native)  # before the lock file is created there
    with output_dir_lock(args.output_dir, enabled=args.should_save):
        overwrite = getattr(args, "overwrite_output_dir", False)
        check_output_dir(args.output_dir, resume is not None, overwrite, inputs, save_native_pth=native)
        if resume is None:
            if args.should_save and overwrite:
                clear_old_checkpoints(args.output_dir)
            yield GuardedResume()
            return
        skipped = check_resume_checkpoint(resume, args, run_identity)
        step = checkpoint_step(resume)
        if args.should_log:
            logger.warning("resuming from %s (optimizer step %s)", resume, "?" if step is None else step)
        yield GuardedResume(resume, step, tuple(skipped))


__all__ = [
    "GuardedResume",
    "check_enough_prompts",
    "check_output_dir",
    "check_resume_checkpoint",
    "check_same_run",
    "clear_old_checkpoints",
    "guarded_run",
    "read_run_info",
    "recipe_settings",
    "run_inputs",
]
