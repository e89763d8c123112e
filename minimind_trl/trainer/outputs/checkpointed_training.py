"""What a MiniMind GRPO run needs to be trusted across interruptions, as hooks on TRL's `GRPOTrainer`.

The prompt order of every epoch drawn from `seed + epoch` (a resumed run sees the uninterrupted run's order), the
output folder held for the run and every resume checked against it (`run_safety.guarded_run`), the final save and
every checkpoint written into `_staging/` and published only when complete (`checkpointing.publish_folder`), the run
record beside each checkpoint and, with `save_native_pth`, upstream's native `.pth`; a resume from a checkpoint at the
run's last step trains nothing (the Trainer alone trains one step past it when that step is inside an epoch); the Hub
repository made or refused in one line and every background upload watched (`hub_uploads`). `MiniMindGRPOTrainer`
mixes it in before `GRPOTrainer`; it reads the trainer's `run_identity` and `_run_inputs`.
"""

import json
import logging
import os
import shutil
from dataclasses import asdict

from accelerate.utils import is_peft_model
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, rotate_checkpoints
from trl.trainer.utils import RepeatSampler

from ...prompt_rendering import prompt_renderer
from .checkpointing import (
    RUN_INFO_NAME,
    STAGING_DIR,
    BatchGeometry,
    EpochSeededRepeatSampler,
    publish_files,
    publish_folder,
    without_tied_keys,
    write_native_weights,
)
from ...adapter_base import record_portable_base
from ...hub_uploads import HUB_FAILURES, HubPushes, repo_error
from ..fsdp_launch import tied_weights_once, whole_model_saving
from .output_dir import run_length
from .run_lock import output_dir_lock
from .run_safety import guarded_run, recipe_settings

logger = logging.getLogger(__name__)


class CheckpointedTraining:
    """Trainer hooks for exact resumes and complete-only saves (a mixin placed before `GRPOTrainer`)."""

    _staging_checkpoint = False  # True while the Trainer writes a checkpoint into `_staging/`
    _staged_push = None
    _epoch_sampler = None
    _skipped_resume_state = frozenset()  # accept_inexact_resume: damaged or unsafe state files left unloaded
    _hub_pushes = None
    finished_checkpoint = None  # set by `train`: the checkpoint a resume found at the run's last step, or None

    def _get_train_sampler(self, dataset=None):
        """TRL's sampler, reshuffled per epoch from `seed + epoch` (see `EpochSeededRepeatSampler`)."""
        sampler = super()._get_train_sampler(dataset)
        if type(sampler) is RepeatSampler:
            sampler = EpochSeededRepeatSampler(
                sampler.data_source,
                mini_repeat_count=sampler.mini_repeat_count,
                batch_size=sampler.batch_size,
                repeat_count=sampler.repeat_count,
                shuffle=sampler.shuffle,
                seed=sampler.seed,
            )
            self._epoch_sampler = sampler
        return sampler

    def _run_epoch(self, *args, epoch, **kwargs):
        if self.state.global_step >= self.state.max_steps:
            # Only a resume enters an epoch at the run's last step (training stops there otherwise); the Trainer
            # would train one more step before its end check. Nothing past max_steps / num_train_epochs is trained.
            self.control.should_training_stop = True
            return
        if self._epoch_sampler is not None:
            self._epoch_sampler.epoch = epoch
        renderer = prompt_renderer(self.train_dataset)  # MiniMind-3's per-prompt choices are keyed on the epoch
        if renderer is not None:
            renderer.set_epoch(epoch)
        return super()._run_epoch(*args, epoch=epoch, **kwargs)

    def train(self, resume_from_checkpoint=None, *args, **kwargs):
        """TRL's training, holding the output folder; refuses another run's folder, an output over the starting
        policy, or a resume that is inexact or changes the run (see `run_safety.guarded_run`). A resume from a
        checkpoint already at the run's last step trains nothing (`finished_checkpoint` names it)."""
        guard = guarded_run(self.args, resume_from_checkpoint, self.train_dataset, self._run_inputs, self.run_identity)
        self.finished_checkpoint = None
        with guard as resume:
            self._skipped_resume_state = frozenset(resume.skipped)
            try:
                output = super().train(resume_from_checkpoint, *args, **kwargs)
            finally:
                self._skipped_resume_state = frozenset()
        if resume.step is not None and resume.step >= self.state.max_steps:
            self.finished_checkpoint = resume.checkpoint
            if self.state.log_history and "train_runtime" in self.state.log_history[-1]:
                self.state.log_history.pop()  # the summary of a call that trained nothing (0 s, loss 0): not the run's
            if self.args.should_log:
                logger.warning(
                    "%s is at optimizer step %d and this run ends at step %d (%s): the run had already finished, "
                    "nothing was trained",
                    resume.checkpoint, resume.step, self.state.max_steps, run_length(self.args),
                )  # fmt: skip
        return output

    def lora_base_model(self) -> str | None:
        """The folder (or Hub id) a LoRA run's policy was loaded from, which its native `.pth` merges the saved
        adapter into; None when the policy is trained whole."""
        model = self.accelerator.unwrap_model(self.model)
        return model.get_base_model().name_or_path if is_peft_model(model) else None

    def _load_optimizer_and_scheduler(self, checkpoint):
        # accept_inexact_resume with a damaged or unsafe optimizer.pt (FSDP's optimizer.bin) or scheduler.pt: fresh
        # state (warned), as the Trainer itself does when one of the two is missing
        if checkpoint is not None and self._skipped_resume_state & {"optimizer.pt", "optimizer.bin", "scheduler.pt"}:
            return
        super()._load_optimizer_and_scheduler(checkpoint)

    def _load_rng_state(self, checkpoint):
        if checkpoint is not None and any(name.startswith("rng_state") for name in self._skipped_resume_state):
            return  # accept_inexact_resume with a damaged or unsafe RNG state: the seed's RNG (warned)
        super()._load_rng_state(checkpoint)

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """The Trainer's save, written into `<output_dir>/_staging/final` and then moved into place file by file
        (`config.json` last), so a run killed while saving never leaves a complete-looking, truncated model."""
        if self._staging_checkpoint:  # inside `_save_checkpoint`, which stages and publishes the whole folder
            return self._save_weights(output_dir)
        final = output_dir or self.args.output_dir
        staged, should_save = os.path.join(final, STAGING_DIR, "final"), self.args.should_save
        with output_dir_lock(final, enabled=should_save):
            if should_save and os.path.exists(staged):
                shutil.rmtree(staged)  # left over by a run killed while saving
            self.accelerator.wait_for_everyone()
            self._save_weights(staged)
            self.accelerator.wait_for_everyone()
            if should_save:
                record_portable_base(staged, final, self.args.output_dir)  # a LoRA adapter's base, movable
                publish_files(staged, final)
            self.accelerator.wait_for_everyone()
        if self.args.push_to_hub and not _internal_call:
            self.push_to_hub(commit_message="Model save", revision=self.args.hub_revision)

    def _save_weights(self, output_dir: str) -> None:
        """The Trainer's save without its Hub push; under FSDP2 the whole weights gathered from every process and
        saved as the policy's own class, each tied weight once (`fsdp_launch.whole_model_saving`)."""
        if not self.is_fsdp_enabled:
            return super().save_model(output_dir, _internal_call=True)
        state_dict = self.accelerator.get_state_dict(self.model)  # a collective: every process takes part
        with whole_model_saving(self.model):
            self._save(output_dir, state_dict=tied_weights_once(self.model, state_dict))

    def _issue_warnings_after_load(self, load_result) -> None:
        # no "missing keys: lm_head.weight" at every correct resume: it is tied to the embedding, saved once
        super()._issue_warnings_after_load(without_tied_keys(self.model, load_result))

    def _get_output_dir(self, trial) -> str:
        run_dir = super()._get_output_dir(trial)
        return os.path.join(run_dir, STAGING_DIR) if self._staging_checkpoint else run_dir

    @property
    def hub_pushes(self) -> HubPushes:
        """This run's uploads to the Hub and their failures, each reported once (`hub_uploads.HubPushes`)."""
        if self._hub_pushes is None:
            self._hub_pushes = HubPushes(getattr(self, "hub_model_id", None) or self.args.hub_model_id)
        return self._hub_pushes

    def init_hf_repo(self, token: str | None = None, private: bool | None = None) -> None:
        """The Trainer's repository creation; an unreachable or refusing Hub is one `HubError` line."""
        try:
            super().init_hf_repo(token=token, private=private)
        except HUB_FAILURES as exc:
            repo_id = self.args.hub_model_id or os.path.basename(os.path.abspath(self.args.output_dir))
            raise repo_error(repo_id, exc) from exc

    def _push_from_checkpoint(self, checkpoint_folder: str) -> None:
        # Hub pushes of a checkpoint upload its folder in the background: start them from the final folder only.
        if self._staging_checkpoint:
            self._staged_push = checkpoint_folder
            return
        self._watched_push(checkpoint_folder)

    def _watched_push(self, checkpoint_folder: str) -> None:
        """The Trainer's background uploads of a checkpoint, each watched so that its failure is reported once."""
        in_progress = getattr(self, "push_in_progress", None)
        before = {id(job) for job in in_progress.jobs} if in_progress is not None else set()
        super()._push_from_checkpoint(checkpoint_folder)
        in_progress = getattr(self, "push_in_progress", None)
        started = [job for job in (in_progress.jobs if in_progress is not None else []) if id(job) not in before]
        name = os.path.basename(checkpoint_folder)
        # the Trainer's model upload, then (checkpoint hub strategies) the folder's
        labels = (f"the model of {name}", f"{name} itself")
        for index, job in enumerate(started):  # every upload started is watched, even one a later transformers adds
            self.hub_pushes.watch(job, labels[index] if index < len(labels) else f"{name}, upload {index + 1}")

    def _save_checkpoint(self, model, trial) -> None:
        """The Trainer's checkpoint, written into `_staging/checkpoint-N` by every rank, then published whole."""
        run_dir = super()._get_output_dir(trial)
        name = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        staged, final = os.path.join(run_dir, STAGING_DIR, name), os.path.join(run_dir, name)
        if self.args.should_save and os.path.exists(staged):
            shutil.rmtree(staged)  # left over by a run killed while saving
        self.accelerator.wait_for_everyone()

        self._staging_checkpoint, self._staged_push = True, None
        try:
            super()._save_checkpoint(model, trial)
        finally:
            self._staging_checkpoint = False
        if self.args.should_save:
            with open(os.path.join(staged, RUN_INFO_NAME), "w") as f:
                run_info = {
                    **asdict(BatchGeometry.from_args(self.args)),
                    "recipe": recipe_settings(self.args),
                    "run": self.run_identity,
                }
                json.dump(run_info, f, indent=2, default=str)
            if self.args.save_native_pth:  # upstream wrote its .pth at every save
                write_native_weights(staged, self.lora_base_model())
            record_portable_base(staged, final, run_dir)

        self.accelerator.wait_for_everyone()  # every rank has written its part
        if self.args.should_save:
            publish_folder(staged, final)
            staging_root = os.path.dirname(staged)
            if not os.listdir(staging_root):
                os.rmdir(staging_root)
            if self.state.best_model_checkpoint == staged:
                self.state.best_model_checkpoint = final
            rotate_checkpoints(run_dir, self.args.save_total_limit, self.state.best_model_checkpoint)
            if self._staged_push is not None:
                self._watched_push(final)
        self.accelerator.wait_for_everyone()


__all__ = ["CheckpointedTraining"]
