"""What keeps one run from spoiling another's output folder, and a resume from being silently inexact.

* `output_dir_lock`: an exclusive `flock` on `<output_dir>/_minimind_run.lock` for the whole run, taken by the
  process that saves (the others share its folder). The OS drops it when the process dies, so a crashed run never
  blocks the next one; the file records pid, host and start time for the message a second run gets.
* `check_output_dir`: a new run refuses a folder that holds another run's `checkpoint-N` folders unless it
  resumes or was told `overwrite_output_dir` (then `clear_old_checkpoints` removes them when the run starts).
* `check_resume_checkpoint`: the checkpoint must hold what an exact resume reads (weights, optimizer, scheduler,
  the RNG state of every process, DeepSpeed's state) in readable form, and must have been written with this
  run's settings (`recipe_settings`, recorded in `minimind_run.json`); `accept_inexact_resume` lets a
  checkpoint without optimizer/scheduler/RNG state resume anyway, with a warning.
"""

import json
import logging
import os
import re
import shutil
import socket
import struct
import tempfile
import time
import zipfile
from contextlib import contextmanager

from ..errors import MiniMindTRLError, OutputDirError, ResumeError
from .checkpointing import RUN_INFO_NAME, STAGING_DIR, publish_files, resolve_resume_checkpoint

try:
    import fcntl
except ImportError:  # Windows: no advisory locks; runs are not protected from each other there
    fcntl = None

logger = logging.getLogger(__name__)

LOCK_NAME = "_minimind_run.lock"  # `_` prefix: left out of the Trainer's Hub uploads, like `_staging`
CHECKPOINT_DIR = re.compile(r"^checkpoint-\d+$")
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "adapter_model.safetensors",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
    "adapter_model.bin",
)
# Settings a resume may change: where things go and how they are reported, how long to train, and the batch
# geometry (checked on its own, with its own message, by `check_resume_geometry`).
RESUMABLE_SETTINGS = re.compile(
    r"^(output_dir|logging_.*|log_.*|save_.*|hub_.*|push_to_hub.*|report_to|run_name|project|trackio_.*|wandb_.*|"
    r"resume_from_checkpoint|overwrite_output_dir|accept_inexact_resume|max_steps|num_train_epochs|dataloader_.*|"
    r"eval_.*|per_device_eval_batch_size|do_eval|do_predict|ddp_.*|fsdp.*|deepspeed|accelerator_config|"
    r"per_device_train_batch_size|gradient_accumulation_steps|steps_per_generation|generation_batch_size|"
    r"gradient_checkpointing.*|activation_checkpointing.*|disable_tqdm|num_completions_to_print|local_rank|"
    r"use_cpu|torch_empty_cache_steps|include_.*|skip_memory_metrics|ignore_data_skip|model_init_kwargs|upstream)$"
)

_held: dict[str, list] = {}  # realpath -> [open lock file, depth]: the lock is re-entrant within a process


# --------------------------------------------------------------------------- the output folder's lock


def _lock_holder(handle) -> str:
    handle.seek(0)
    try:
        info = json.loads(handle.read() or "{}")
    except ValueError:
        info = {}
    if not info:
        return "another run"
    return f"the run of pid {info.get('pid')} on {info.get('host')}, started {info.get('started')}"


@contextmanager
def output_dir_lock(output_dir: str, enabled: bool = True):
    """Hold `output_dir` for this run; raise `OutputDirError` if another live run holds it."""
    if not enabled or fcntl is None:
        yield
        return
    key = os.path.realpath(output_dir)
    if key in _held:
        _held[key][1] += 1
        try:
            yield
        finally:
            _held[key][1] -= 1
        return
    path = os.path.join(output_dir, LOCK_NAME)
    try:
        os.makedirs(output_dir, exist_ok=True)
        handle = open(path, "a+")
    except OSError as exc:
        raise OutputDirError(f"output_dir {output_dir}: cannot write there ({exc.strerror})") from exc
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _lock_holder(handle)
        handle.close()
        raise OutputDirError(
            f"output_dir {output_dir} is in use by {holder} ({path}); two runs in one folder overwrite each other's "
            "checkpoints. Wait for it to finish or pick another output_dir."
        ) from None
    handle.seek(0)
    handle.truncate()
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    handle.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started": started}))
    handle.flush()
    _held[key] = [handle, 1]
    try:
        yield
    finally:
        del _held[key]
        handle.seek(0)
        handle.truncate()
        fcntl.flock(handle, fcntl.LOCK_UN)
        handle.close()


def check_output_dir_free(output_dir: str) -> None:
    """Fail now (before models load) if another run holds `output_dir`; the run takes the lock itself later."""
    if os.path.isfile(os.path.join(output_dir, LOCK_NAME)):
        with output_dir_lock(output_dir):
            pass


def check_writable(path: str, error: type[Exception] = OutputDirError, flag: str = "output_dir") -> None:
    """Fail now, before models load, when `path` (a folder to create or fill) cannot be written: a read-only or
    missing location, a file in the way. Probes by creating a file in the nearest existing folder."""
    probe = os.path.abspath(path)
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        raise error(f"{flag} {path}: cannot write there ({probe} is a file, not a folder)")
    try:
        handle, name = tempfile.mkstemp(prefix=".minimind-write-check-", dir=probe)
        os.close(handle)
        os.remove(name)
    except OSError as exc:
        raise error(f"{flag} {path}: cannot write there ({exc.strerror}: {probe})") from None


def os_error_line(exc: OSError) -> str:
    """An OS error as one line naming the path (`No space left on device: out/model.safetensors`)."""
    where = f": {exc.filename}" if exc.filename else ""
    return f"{exc.strerror or exc}{where}"


# --------------------------------------------------------------------------- another run's checkpoints


def old_checkpoints(output_dir: str) -> list[str]:
    if not os.path.isdir(output_dir):
        return []
    names = [name for name in os.listdir(output_dir) if CHECKPOINT_DIR.match(name)]
    return sorted(names, key=lambda name: int(name.split("-")[1]))


def check_output_dir(output_dir: str, resuming: bool, overwrite: bool) -> None:
    """A new run must not mix its checkpoints with another run's (a later `resume last` would continue that one)."""
    found = old_checkpoints(output_dir)
    if found and not resuming and not overwrite:
        raise OutputDirError(
            f"output_dir {output_dir} holds another run's checkpoints ({', '.join(found)}); a new run would replace "
            "some of them and keep the others. Continue that run with --resume_from_checkpoint last, start over "
            "with --overwrite_output_dir true (deletes them), or pick another output_dir."
        )


def clear_old_checkpoints(output_dir: str) -> None:
    """`overwrite_output_dir`: remove the earlier run's checkpoints (and any staging it left) before this one."""
    for name in old_checkpoints(output_dir) + [STAGING_DIR]:
        path = os.path.join(output_dir, name)
        if os.path.isdir(path):
            logger.warning("overwrite_output_dir: removing %s", path)
            shutil.rmtree(path)


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
    """The settings that define what a run trains (JSON values), for the check that a resume continues it."""
    values = json.loads(json.dumps(args.to_dict(), default=str))
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
        elif path.endswith(".json"):
            with open(path, encoding="utf-8") as f:
                json.load(f)
    except (OSError, ValueError, KeyError, TypeError, struct.error, zipfile.BadZipFile) as exc:
        return f"unreadable ({type(exc).__name__}: {exc})"
    return None


def check_resume_checkpoint(checkpoint: str, args) -> None:
    """Refuse a checkpoint that is damaged, incomplete for an exact resume, or written by a different recipe."""
    info_path = os.path.join(checkpoint, RUN_INFO_NAME)
    for name in ("trainer_state.json", RUN_INFO_NAME):
        path = os.path.join(checkpoint, name)
        if os.path.isfile(path) and (problem := _unreadable(path)):
            raise ResumeError(f"{path} is {problem}; resume from an earlier checkpoint")
    info = {}
    if os.path.isfile(info_path):
        with open(info_path, encoding="utf-8") as f:
            info = json.load(f)

    weights = [name for name in WEIGHT_FILES if os.path.isfile(os.path.join(checkpoint, name))]
    deepspeed = "DEEPSPEED" in str(info.get("distributed_type", "")) or os.path.isfile(
        os.path.join(checkpoint, "latest")
    )
    if not weights and not deepspeed:
        raise ResumeError(f"{checkpoint} holds no model weights ({' / '.join(WEIGHT_FILES[:3])}); resume from another")
    for name in weights:
        path = os.path.join(checkpoint, name)
        if problem := _unreadable(path):
            raise ResumeError(f"{path} is {problem}; resume from an earlier checkpoint")

    needed = []
    if not getattr(args, "save_only_model", False):
        needed += ["latest"] if deepspeed else ["optimizer.pt", "scheduler.pt"]
    world_size = int(info.get("world_size", 1))
    needed += ["rng_state.pth"] if world_size <= 1 else [f"rng_state_{rank}.pth" for rank in range(world_size)]
    missing = [name for name in needed if not os.path.isfile(os.path.join(checkpoint, name))]
    damaged = [
        f"{name} ({problem})"
        for name in needed
        if name not in missing and name != "latest" and (problem := _unreadable(os.path.join(checkpoint, name)))
    ]
    if missing or damaged:
        parts = [f"missing {', '.join(missing)}"] if missing else []
        parts += [f"damaged {', '.join(damaged)}"] if damaged else []
        what = "; ".join(parts)
        if not getattr(args, "accept_inexact_resume", False):
            raise ResumeError(
                f"{checkpoint} is incomplete for an exact resume: {what}. Resume from another checkpoint, or pass "
                "--accept_inexact_resume true to continue with fresh optimizer/scheduler/RNG state (the result will "
                "differ from an uninterrupted run)."
            )
        logger.warning(
            "accept_inexact_resume: resuming %s although %s; the run is not an exact continuation", checkpoint, what
        )

    saved = info.get("recipe")
    if saved is not None:
        now = recipe_settings(args)
        changed = sorted(key for key in saved.keys() & now.keys() if saved[key] != now[key])
        if changed:
            details = ", ".join(f"{key}: {saved[key]!r} -> {now[key]!r}" for key in changed[:6])
            raise ResumeError(
                f"{checkpoint} was written by a run with other settings ({details}); a resume continues the same "
                "recipe. Restore them, or start a new run in another output_dir (initialised from the checkpoint's "
                "weights if you want them)."
            )


def save_staged(trainer, final: str, save) -> None:
    """`save(folder)` (every process, as the Trainer's `save_model` needs) into `<final>/_staging/final`, then
    moved into `final` file by file, `config.json` last (`publish_files`), under the output folder's lock."""
    staged = os.path.join(final, STAGING_DIR, "final")
    should_save = trainer.args.should_save
    with output_dir_lock(final, enabled=should_save):
        if should_save and os.path.exists(staged):
            shutil.rmtree(staged)  # left over by a run killed while saving
        trainer.accelerator.wait_for_everyone()
        save(staged)
        trainer.accelerator.wait_for_everyone()
        if should_save:
            publish_files(staged, final)
        trainer.accelerator.wait_for_everyone()


@contextmanager
def guarded_run(args, resume_from_checkpoint, train_dataset=None):
    """Around `Trainer.train`: refuse a dataset too small for one step, hold the output folder (saving process),
    refuse what would mix or inexactly continue runs, and clear the old checkpoints `overwrite_output_dir` asked
    to replace."""
    if train_dataset is not None and hasattr(train_dataset, "__len__"):
        check_enough_prompts(train_dataset, args)
    resume = None
    if resume_from_checkpoint not in (None, False):
        resume = resolve_resume_checkpoint(str(resume_from_checkpoint), args.output_dir)
    with output_dir_lock(args.output_dir, enabled=args.should_save):
        check_output_dir(args.output_dir, resume is not None, getattr(args, "overwrite_output_dir", False))
        if resume is not None:
            check_resume_checkpoint(resume, args)
        elif args.should_save and getattr(args, "overwrite_output_dir", False):
            clear_old_checkpoints(args.output_dir)
        yield


__all__ = [
    "LOCK_NAME",
    "check_enough_prompts",
    "check_output_dir",
    "check_output_dir_free",
    "check_resume_checkpoint",
    "check_writable",
    "clear_old_checkpoints",
    "guarded_run",
    "old_checkpoints",
    "os_error_line",
    "output_dir_lock",
    "recipe_settings",
    "save_staged",
]
