"""`minimind-trl grpo`: MiniMind GRPO from a recipe YAML, the way TRL's scripts run.

    minimind-trl grpo --config recipes/minimind2/grpo/reasoning.yaml --model_name_or_path out/reason_512.pth ...
    accelerate launch --config_file recipes/accelerate/zero2.yaml -m minimind_trl.grpo --config RECIPE.yaml

One way through, one module a stage: recipe (`recipe.parse_args`) -> run plan, every check before any model
loads (`run_plan.check_run`) -> built parts and the trainer (`build.build_from_plan`) -> training and the final
save (`run` below) -> hand-off (native `.pth`, `hub` push checks). Programs (the demo) take the same path:
`parse_recipe`, `build_trainer`, `run`.
"""

import errno
import logging
import os
import sys

from ..trainer.outputs.checkpointing import write_native_weights
from ..errors import PUSH_FAILED_EXIT_CODE, OutputDirError
from ..hub_uploads import HUB_FAILURES, hub_endpoint, upload_output_folder
from ..loading_utils import os_error_line
from ..trainer.outputs.output_dir import FinalOutputs
from ..trainer.outputs.run_lock import output_dir_lock
from .build import build_from_plan, build_trainer
from .hub import PushCheckError, check_push_folder
from .recipe import Recipe, parse_args, parse_recipe
from .run_plan import check_run

logger = logging.getLogger(__name__)
DISK_ERRORS = (errno.ENOSPC, errno.EROFS, errno.EACCES, errno.EDQUOT)  # the location, not the program, is at fault


def run(trainer, script_args):
    """Train (resuming if asked), save the final model, optionally write the native `.pth` and push to the Hub.

    A resume of a run that had already finished trains nothing and writes only the final outputs the output folder
    lacks (a run killed after its last checkpoint, while handing off), else nothing. A failed push is recorded in
    `trainer.hub_pushes` (reported once each) after every local output is written, never raised."""
    args = trainer.args
    with output_dir_lock(args.output_dir, enabled=args.should_save):  # held from training to the last file written
        return _train_and_save(trainer, script_args)


def _train_and_save(trainer, script_args):
    args = trainer.args
    trainer.train(resume_from_checkpoint=args.resume_from_checkpoint)
    present = _outputs_already_there(trainer)
    missing = present.missing(args.save_native_pth)
    if trainer.finished_checkpoint is not None and trainer.is_world_process_zero():
        if not missing:
            push = f"; to push it: minimind-trl push {args.output_dir} --hub_model_id {args.hub_model_id}"
            logger.warning("%s holds the finished run's outputs, left as they are%s", args.output_dir,
                           push if args.push_to_hub else "")  # fmt: skip
        else:
            logger.warning("%s lacks the finished run's %s: written from %s", args.output_dir, " and ".join(missing),
                           trainer.finished_checkpoint)  # fmt: skip
    if trainer.finished_checkpoint is not None and not missing:
        return trainer
    if not present.model:  # pushed below, once every local output is written
        trainer.save_model(args.output_dir, _internal_call=True)  # staged, then published file by file
    model_name = (args.hub_model_id or os.path.basename(os.path.abspath(args.output_dir))).split("/")[-1]
    # TRL's card links `dataset_name` on the Hub: only name Hub datasets there (local data is in the run section).
    hub_dataset = None if os.path.exists(script_args.dataset_name or "") else script_args.dataset_name
    if not present.card:
        trainer.create_model_card(model_name=model_name, dataset_name=hub_dataset)  # main process only
    trainer.accelerator.wait_for_everyone()
    if args.save_native_pth and not present.native and trainer.is_world_process_zero():
        native = write_native_weights(args.output_dir, trainer.lora_base_model())
        logger.info("native MiniMind weights written to %s", native)
    if args.push_to_hub:
        push_final(trainer)
    trainer.accelerator.wait_for_everyone()
    return trainer


def _outputs_already_there(trainer) -> FinalOutputs:
    """After a resume of a finished run: the final outputs its folder already holds, as the main process sees them
    (every rank then skips the same saves); otherwise none."""
    if trainer.finished_checkpoint is None:
        return FinalOutputs()
    present = [FinalOutputs.found_in(trainer.args.output_dir) if trainer.is_world_process_zero() else None]
    if trainer.accelerator.num_processes > 1:
        from accelerate.utils import broadcast_object_list

        broadcast_object_list(present)
    return present[0]


def push_final(trainer) -> None:
    """The final push of the output folder (main process), as the Trainer's own (`hub_uploads.upload_output_folder`),
    after the checkpoints' background uploads and once the folder loads without this package (`check_push_folder`);
    each failure, theirs or its own, is recorded in `trainer.hub_pushes`."""
    if not trainer.is_world_process_zero():
        return
    args, pushes = trainer.args, trainer.hub_pushes
    pushes.settle()
    try:
        check_push_folder(args.output_dir)
        upload_output_folder(args.output_dir, trainer.hub_model_id, token=args.hub_token, revision=args.hub_revision)
    except (PushCheckError, *HUB_FAILURES) as exc:
        pushes.failed(f"the final model in {args.output_dir}", exc, then="its files stay there")


def push_summary(trainer) -> str | None:
    """The end of a run whose pushes failed: what is where and the command that pushes it later; None if none did."""
    failures = trainer.hub_pushes.failures if trainer.args.push_to_hub else []
    if not failures:
        return None
    out, repo = trainer.args.output_dir, trainer.hub_pushes.repo_id
    return (
        f"training finished and its outputs are complete in {out}, but {len(failures)} push(es) to {repo} on the "
        f"Hub ({hub_endpoint()}) failed (each one is reported above). Push the folder once the Hub is reachable: "
        f"minimind-trl push {out} --hub_model_id {repo}"
    )


def train(script_args, training_args, model_args, callbacks=None, recipe: Recipe | None = None):
    """`build_trainer` + `run`: the whole of `minimind-trl grpo` after parsing. Returns the trainer."""
    trainer = build_trainer(script_args, training_args, model_args, callbacks=callbacks, recipe=recipe)
    return run(trainer, script_args)


def show_package_notes() -> None:
    """The package's INFO lines (the precision chosen for this CPU, where the native weights went) on stderr,
    unless the program has configured logging itself."""
    package = logging.getLogger("minimind_trl")
    if package.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("minimind-trl: %(message)s"))
    package.addHandler(handler)
    package.setLevel(logging.INFO)


def main(argv: list[str] | None = None) -> int:
    """`minimind-trl grpo`; user errors raise `MiniMindTRLError` before any model loads (the command reports them).
    Returns 0, or `PUSH_FAILED_EXIT_CODE` when training and its local outputs are complete but a push failed."""
    show_package_notes()
    script_args, training_args, model_args, recipe = parse_args(argv)
    plan = check_run(script_args, training_args, model_args, recipe=recipe)
    trainer = build_from_plan(plan, script_args, training_args, model_args)
    try:
        run(trainer, script_args)
    except OSError as exc:
        if exc.errno not in DISK_ERRORS:
            raise
        raise OutputDirError(f"cannot write the run's output: {os_error_line(exc)}") from exc
    trainer.end()  # the trackers, the process group and a colocated vLLM engine
    summary = push_summary(trainer)
    if summary is None:
        return 0
    print(f"minimind-trl grpo: {summary}", file=sys.stderr)
    return PUSH_FAILED_EXIT_CODE


__all__ = ["build_trainer", "main", "parse_args", "parse_recipe", "run", "train"]
