"""Crash-safe checkpoints and honest resumes: the pieces `MiniMindGRPOTrainer` saves and resumes with.

transformers' `Trainer._save_checkpoint` writes straight into `<output_dir>/checkpoint-N`, file after file, so
a run killed while saving leaves a half-written `checkpoint-N` that `resume_from_checkpoint` (and
`get_last_checkpoint`) would pick as the newest one. `MiniMindGRPOTrainer` lets the Trainer write the whole
checkpoint into `<output_dir>/_staging/checkpoint-N` (every rank, DeepSpeed shards included), waits for all
ranks, then publishes it with `publish_folder`: a `checkpoint-N` folder exists only once it is complete.
(`_staging` starts with `_`, which the Trainer's Hub uploads ignore.)

TRL shuffles the prompts of every epoch with one generator seeded at the start, whose state no checkpoint
holds; `EpochSeededRepeatSampler` draws epoch `e`'s order from `seed + e`, so a run resumed in a later epoch
sees the same prompts as the uninterrupted one.

Each checkpoint also records the batch geometry of the run (`minimind_run.json`), so a resume on a different
number of processes can be checked: it continues exactly where the data left off only if the global
generation batch is unchanged (TRL's sampler draws the prompt order for the global batch).
"""

import json
import logging
import os
import shutil
from dataclasses import dataclass

from transformers.trainer_utils import get_last_checkpoint
from trl.trainer.utils import RepeatSampler

from ...errors import ResumeError
from ...loading_utils import whole_model_loading
from ..fsdp_launch import fsdp_requested

logger = logging.getLogger(__name__)

STAGING_DIR = "_staging"
RUN_INFO_NAME = "minimind_run.json"
LAST_CHECKPOINT_ALIASES = ("last", "latest", "true")
COMPLETION_MARKERS = ("config.json", "adapter_config.json")  # moved into place last by `publish_files`


@dataclass(frozen=True)
class BatchGeometry:
    """How a run splits its batches over processes (what a resume must agree with)."""

    world_size: int
    per_device_train_batch_size: int
    gradient_accumulation_steps: int
    steps_per_generation: int
    generation_batch_size: int
    num_generations: int
    num_iterations: int
    distributed_type: str

    @classmethod
    def from_args(cls, args) -> "BatchGeometry":
        return cls(
            world_size=args.world_size,
            per_device_train_batch_size=args.per_device_train_batch_size,
            gradient_accumulation_steps=args.gradient_accumulation_steps,
            steps_per_generation=args.steps_per_generation,
            generation_batch_size=args.generation_batch_size,
            num_generations=args.num_generations,
            num_iterations=args.num_iterations,
            distributed_type=launch_distributed_type(args),
        )

    @property
    def global_batch_size(self) -> int:
        """Completions per optimizer step over all processes."""
        return self.per_device_train_batch_size * self.world_size * self.gradient_accumulation_steps


def launch_distributed_type(args) -> str:
    """How the run's processes hold the model, as accelerate names it. DeepSpeed and FSDP launches are known from
    the launch before the accelerator exists (a CPU process group says MULTI_CPU until then)."""
    if getattr(args, "deepspeed_plugin", None) is not None:
        return "DistributedType.DEEPSPEED"
    if fsdp_requested():
        return "DistributedType.FSDP"
    return str(args.distributed_state.distributed_type)


# What a checkpoint holds to resume exactly besides its weights and RNG states, by how its run held the model: the
# Trainer's own files; DeepSpeed's `global_stepN/` folder (named by `latest`); FSDP's optimizer state. An FSDP resume
# loads the weights themselves from FSDP's own file (`FSDP_WEIGHTS`), not from model.safetensors.
RESUME_STATE_FILES = {
    "DeepSpeed": ("latest",),
    "FSDP": ("optimizer.bin", "scheduler.pt"),
    "DDP": ("optimizer.pt", "scheduler.pt"),
}
FSDP_WEIGHTS = "pytorch_model_fsdp.bin"


def checkpoint_layout(distributed_type: str) -> str:
    """The `RESUME_STATE_FILES` key of a run's distributed type: DDP stands for one process or several."""
    return "DeepSpeed" if "DEEPSPEED" in distributed_type else "FSDP" if "FSDP" in distributed_type else "DDP"


def check_same_layout(checkpoint: str, info: dict, layout: str) -> None:
    """Refuse a checkpoint written under another way of holding the model (DDP or one process, DeepSpeed, FSDP): its
    weights and optimizer state are in files this launch does not read (`RESUME_STATE_FILES`)."""
    if "distributed_type" not in info:
        return
    saved = checkpoint_layout(str(info["distributed_type"]))
    if saved != layout:
        files = ", ".join(RESUME_STATE_FILES[saved])
        raise ResumeError(
            f"{checkpoint} was written under {saved} ({files}) and this run is launched with {layout}, which reads "
            f"{', '.join(RESUME_STATE_FILES[layout])}; resume it with the accelerate config that wrote it, or start a "
            "new run from its model.safetensors"
        )


def resume_state_files(checkpoint: str, info: dict, args) -> tuple[list[str], list[str]]:
    """The weight files an exact resume of `checkpoint` (its run record `info`) loads under this launch, beyond the
    model.safetensors every checkpoint holds (FSDP's own, even with save_only_model), and the optimizer state files;
    a checkpoint of another layout is refused (`check_same_layout`)."""
    layout = checkpoint_layout(launch_distributed_type(args))
    check_same_layout(checkpoint, info, layout)
    state = [] if getattr(args, "save_only_model", False) else list(RESUME_STATE_FILES[layout])
    return ([FSDP_WEIGHTS] if layout == "FSDP" else []), state


class EpochSeededRepeatSampler(RepeatSampler):
    """TRL's `RepeatSampler` whose shuffle of epoch `e` is drawn from `seed + e`.

    TRL's sampler draws every epoch's permutation from one generator seeded once, and that generator's state is
    not checkpointed: a run resumed in its second epoch would replay the first epoch's order. Seeding per epoch
    makes the order a function of (seed, epoch) only. Epoch 0 is TRL's order unchanged.
    """

    epoch = 0

    def __iter__(self):
        if self.shuffle and self.seed is not None:
            self.generator.manual_seed(self.seed + self.epoch)
        return super().__iter__()


def publish_folder(staged: str, final: str) -> None:
    """Rename a complete folder into place, replacing an older `final` only once the new one is there."""
    if os.path.exists(final):
        retired = f"{final}.replaced"
        shutil.rmtree(retired, ignore_errors=True)
        os.replace(final, retired)
        os.replace(staged, final)
        shutil.rmtree(retired)
    else:
        os.replace(staged, final)


def publish_files(staged: str, final: str) -> None:
    """Move a complete save from `staged` into the folder `final`, which also holds other things (checkpoints).

    Each file is renamed into place (never half-written), `config.json` (an adapter's `adapter_config.json`) last: a
    folder whose config is there holds the whole model. An older config goes first, so a save interrupted midway
    never looks done.
    """
    os.makedirs(final, exist_ok=True)
    names = sorted(os.listdir(staged), key=lambda name: name in COMPLETION_MARKERS)
    for marker in COMPLETION_MARKERS:
        if marker in names and os.path.isfile(os.path.join(final, marker)):
            os.remove(os.path.join(final, marker))
    for name in names:
        target = os.path.join(final, name)
        if os.path.isdir(target) and not os.path.islink(target):
            shutil.rmtree(target)
        os.replace(os.path.join(staged, name), target)
    os.rmdir(staged)
    staging_root = os.path.dirname(staged)
    if os.path.basename(staging_root) == STAGING_DIR and not os.listdir(staging_root):
        os.rmdir(staging_root)


def without_tied_keys(model, load_result):
    """`load_result` less the missing keys that are tied to a loaded weight (MiniMind's `lm_head.weight` is the
    embedding, which safetensors stores once): the Trainer would warn about them at every correct resume."""
    tied = getattr(model, "_tied_weights_keys", None)
    if not isinstance(tied, dict) or not load_result.missing_keys:
        return load_result
    params = dict(model.named_parameters(remove_duplicate=False))

    def is_tied(key):
        source = tied.get(key)
        return source in params and key in params and params[key] is params[source]

    missing = [key for key in load_result.missing_keys if not is_tied(key)]
    return type(load_result)(missing, load_result.unexpected_keys)


def write_native_weights(folder: str, base_model: str | None = None) -> str:
    """The weights saved in `folder` as upstream MiniMind's `grpo_<hidden>[_moe].pth` (fp16), in that folder.

    Read back from the saved safetensors, so it works whatever held the weights in training (DDP, ZeRO-3).
    Called on one process only, so the folder is loaded whole: under ZeRO-3 a plain `from_pretrained` would
    partition it (`zero.Init`), giving empty tensors on one process and waiting forever for the others.
    A LoRA run saves only its adapter: the `.pth` is then the merged model (`base_model`, the folder the policy
    was loaded from, with the adapter folded in by PEFT's `merge_and_unload`, as `minimind-trl merge-lora` does)."""
    import torch

    from ...formats.export_native import export_native
    from ...models.minimind.modeling_minimind import MiniMindForCausalLM

    adapter = os.path.isfile(os.path.join(folder, "adapter_config.json"))
    with whole_model_loading():
        model = MiniMindForCausalLM.from_pretrained(base_model if adapter else folder, dtype=torch.float32)
        if adapter:
            from peft import PeftModel

            model = PeftModel.from_pretrained(model, folder).merge_and_unload()
    suffix = "_moe" if model.config.use_moe else ""
    path = os.path.join(folder, f"grpo_{model.config.hidden_size}{suffix}.pth")
    export_native(model, path, dtype=torch.float16, force=True)
    return path


def resolve_resume_checkpoint(resume_from_checkpoint: str | None, output_dir: str) -> str | None:
    """`--resume_from_checkpoint` as a folder: `last`/`latest`/`true` mean the newest complete checkpoint."""
    if resume_from_checkpoint is None or str(resume_from_checkpoint).lower() in ("", "false", "none"):
        return None
    if str(resume_from_checkpoint).lower() in LAST_CHECKPOINT_ALIASES:
        last = get_last_checkpoint(output_dir) if os.path.isdir(output_dir) else None
        if last is None:
            ended = any(os.path.isfile(os.path.join(output_dir, marker)) for marker in COMPLETION_MARKERS)
            raise ResumeError(
                f"resume_from_checkpoint={resume_from_checkpoint}: no checkpoint-N folder in {output_dir}"
                + (" (it holds a finished model: that run ended without checkpoints, there is nothing to resume)"
                   if ended else "")
            )  # fmt: skip
        return last
    if not os.path.isdir(resume_from_checkpoint):
        raise ResumeError(f"resume_from_checkpoint: {resume_from_checkpoint} is not a folder")
    if not os.path.isfile(os.path.join(resume_from_checkpoint, "trainer_state.json")):
        raise ResumeError(
            f"resume_from_checkpoint: {resume_from_checkpoint} has no trainer_state.json (not a checkpoint)"
        )
    return resume_from_checkpoint


def checkpoint_step(checkpoint: str) -> int | None:
    """The optimizer step a checkpoint was saved at (its `trainer_state.json`), or None when it says none."""
    try:
        with open(os.path.join(checkpoint, "trainer_state.json"), encoding="utf-8") as f:
            step = json.load(f)["global_step"]
    except (OSError, ValueError, KeyError, TypeError):  # checked elsewhere; here for messages and the end check
        return None
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def check_resume_geometry(checkpoint: str, args) -> BatchGeometry | None:
    """Refuse a resume that cannot continue the data where it stopped; say what changes when it can.

    Returns the checkpoint's geometry (None for checkpoints written without it).
    """
    path = os.path.join(checkpoint, RUN_INFO_NAME)
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        info = json.load(f)
    try:
        saved = BatchGeometry(**{key: info[key] for key in BatchGeometry.__dataclass_fields__})
    except (KeyError, TypeError) as exc:
        if getattr(args, "accept_inexact_resume", False):
            return None  # a foreign record, accepted unchecked (`run_safety.read_run_info` warned)
        raise ResumeError(
            f"{path} does not describe a run's batch geometry (missing {exc}); resume from another checkpoint, or "
            "pass --accept_inexact_resume true to continue unchecked"
        ) from None
    now = BatchGeometry.from_args(args)
    if saved.generation_batch_size != now.generation_batch_size or saved.global_batch_size != now.global_batch_size:
        per_device = saved.global_batch_size / (now.world_size * now.gradient_accumulation_steps)
        hint = (
            f"set per_device_train_batch_size={int(per_device)}"
            if per_device.is_integer()
            else "choose per_device_train_batch_size x gradient_accumulation_steps to match"
        )
        raise ResumeError(
            f"{checkpoint} was written by {saved.world_size} process(es) x {saved.per_device_train_batch_size} "
            f"completions x {saved.gradient_accumulation_steps} accumulation steps (global batch "
            f"{saved.global_batch_size}, generation batch {saved.generation_batch_size}); this run has "
            f"{now.world_size} x {now.per_device_train_batch_size} x {now.gradient_accumulation_steps} (global batch "
            f"{now.global_batch_size}, generation batch {now.generation_batch_size}). The step counter and the "
            f"prompt order are per global batch, so keep it: {hint}."
        )
    if saved.world_size != now.world_size:
        if any("DEEPSPEED" in kind for kind in (saved.distributed_type, now.distributed_type)):
            raise ResumeError(
                f"{checkpoint}: DeepSpeed checkpoints are partitioned per process ({saved.world_size} here, "
                f"{now.world_size} now); resume them with the same number of processes, or start a new run from "
                f"the checkpoint's weights (zero_to_fp32.py in the checkpoint folder)."
            )
        logger.warning(
            "Resuming a %d-process checkpoint on %d process(es): weights, optimizer, scheduler and the prompt order "
            "continue exactly (same global batch); the sampling RNG is per process and restarts from the random seed.",
            saved.world_size,
            now.world_size,
        )
    return saved


def check_generation_alignment(args) -> None:
    """Warn when checkpoints can fall inside a generation batch that TRL reuses over several steps.

    TRL regenerates after resuming (its buffer is not saved), so a resume is exact only from a step where the
    uninterrupted run would have generated too.
    """
    generate_every = args.steps_per_generation * args.num_iterations
    save_steps = args.save_steps
    if args.save_strategy != "steps" or generate_every == 1 or save_steps < 1:
        return
    if (int(save_steps) * args.gradient_accumulation_steps) % generate_every:
        logger.warning(
            "save_steps=%s x gradient_accumulation_steps=%d is not a multiple of steps_per_generation x "
            "num_iterations = %d: a run resumed from such a checkpoint regenerates completions the uninterrupted run "
            "would have reused, so it is not an exact continuation.",
            save_steps,
            args.gradient_accumulation_steps,
            generate_every,
        )


__all__ = [
    "BatchGeometry",
    "EpochSeededRepeatSampler",
    "FSDP_WEIGHTS",
    "ResumeError",
    "RUN_INFO_NAME",
    "STAGING_DIR",
    "RESUME_STATE_FILES",
    "check_generation_alignment",
    "check_resume_geometry",
    "check_same_layout",
    "checkpoint_layout",
    "checkpoint_step",
    "launch_distributed_type",
    "publish_files",
    "publish_folder",
    "resolve_resume_checkpoint",
    "resume_state_files",
    "without_tied_keys",
    "write_native_weights",
]
