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

from ..trainer.outputs.checkpointing import write_native_weights
from ..errors import OutputDirError
from ..loading_utils import os_error_line
from ..trainer.outputs.run_safety import output_dir_lock
from .build import build_from_plan, build_trainer
from .hub import check_push_on_all_ranks
from .recipe import Recipe, parse_args, parse_recipe
from .run_plan import check_run

logger = logging.getLogger(__name__)
DISK_ERRORS = (errno.ENOSPC, errno.EROFS, errno.EACCES, errno.EDQUOT)  # the location, not the program, is at fault


def run(trainer, script_args):
    """Train (resuming if asked), save the final model, optionally write the native `.pth` and push to the Hub."""
    args = trainer.args
    with output_dir_lock(args.output_dir, enabled=args.should_save):  # held from training to the last file written
        return _train_and_save(trainer, script_args)


def _train_and_save(trainer, script_args):
    args = trainer.args
    trainer.train(resume_from_checkpoint=args.resume_from_checkpoint)
    trainer.save_model(args.output_dir)  # staged, then published file by file (`MiniMindGRPOTrainer.save_model`)
    model_name = (args.hub_model_id or os.path.basename(os.path.abspath(args.output_dir))).split("/")[-1]
    # TRL's card links `dataset_name` on the Hub: only name Hub datasets there (local data is in the run section).
    hub_dataset = None if os.path.exists(script_args.dataset_name or "") else script_args.dataset_name
    trainer.create_model_card(model_name=model_name, dataset_name=hub_dataset)  # main process only
    trainer.accelerator.wait_for_everyone()
    if args.save_native_pth and trainer.is_world_process_zero():
        logger.info("native MiniMind weights written to %s", write_native_weights(args.output_dir))
    if args.push_to_hub:
        check_push_on_all_ranks(trainer)
        trainer.push_to_hub(model_name=model_name, dataset_name=hub_dataset)
    trainer.accelerator.wait_for_everyone()
    return trainer


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
    """`minimind-trl grpo`; user errors raise `MiniMindTRLError` before any model loads (the command reports them)."""
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
    return 0


__all__ = ["build_trainer", "main", "parse_args", "parse_recipe", "run", "train"]
