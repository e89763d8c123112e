"""What every demo run does around GRPO, written once for the default demo and `--agent`: the start (output folder,
offline, threads, quiet libraries, seed), the SFT warm start's settings and run, the warm-started policy saved and
read back, GRPO built with the demo's progress and run with Ctrl-C saving the policy, the curve and the saved model
read back, the outputs the closing summary lists, and the verdict that ends the run.
"""

import os
import time
from pathlib import Path


def quiet_libraries() -> None:
    """The demo prints its own progress; keep the libraries' progress bars and notices out of it."""
    import datasets
    import transformers

    os.environ.setdefault("DS_ACCELERATOR", "cpu")  # the demo runs on CPU; spares DeepSpeed's "no GPU found" notice
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    datasets.utils.logging.disable_progress_bar()
    datasets.utils.logging.set_verbosity_error()


def start_run(args) -> Path:
    """A demo run's start: `args.output_dir` prepared (an earlier demo run's outputs replaced, nothing else deleted),
    no usage ping from TRL's trainers (the demo is offline), `args.threads` threads, quiet libraries, `args.seed`
    set. Returns the output folder, absolute."""
    import torch
    from transformers import set_seed

    from ..cli.run_plan import disable_hub_telemetry
    from .output_dir import prepare_output_dir

    output_dir = Path(args.output_dir).absolute()
    prepare_output_dir(output_dir)
    disable_hub_telemetry()
    torch.set_num_threads(args.threads)
    quiet_libraries()
    set_seed(args.seed)
    return output_dir


def warm_start_settings(recipe: str, stop_arguments, scratch_dir: str, seed: int, steps: int | None,
                        target_flag: str):
    """A warm start's `(SFTConfig, stop_arguments)` from its demo recipe: run until the recipe's `target_flag`
    share is reached, or (`steps` given) exactly `steps` steps with the target switched off."""
    from trl import SFTConfig, TrlParser

    from ..cli.recipe import resolve_recipe

    argv = ["--config", resolve_recipe(recipe), "--output_dir", scratch_dir, "--seed", str(seed)]
    if steps is not None:
        argv += ["--max_steps", str(steps), f"--{target_flag}", "0"]
    return TrlParser((SFTConfig, stop_arguments)).parse_args_and_config(argv)


def run_sft(model, tokenizer, sft_args, rows: list[dict], stop_callback):
    """TRL's `SFTTrainer` on `rows`, in place on `model`, quiet, with `stop_callback` deciding when it stops;
    returns the trainer (its `state.global_step` is the steps it ran)."""
    from datasets import Dataset
    from trl import SFTTrainer

    from .progress import StageProgress, quieted

    trainer = SFTTrainer(model=model, args=sft_args, train_dataset=Dataset.from_list(rows), processing_class=tokenizer,
                         callbacks=[stop_callback, StageProgress("Warm start (SFT)")])  # fmt: skip
    quieted(trainer)
    trainer.train()
    return trainer


def saved_and_read_back(model, tokenizer, folder: Path):
    """The warm-started `model` saved with its tokenizer as the GRPO policy's folder, and read back from there (the
    model the trainer will load)."""
    from ..models.minimind import MiniMindForCausalLM
    from .model import save_folder

    return MiniMindForCausalLM.from_pretrained(save_folder(model, tokenizer, folder))


def build_grpo(script_args, training_args, model_args, recipe, output_dir: Path):
    """`minimind-trl grpo`'s trainer for the parsed recipe, reporting through the demo's progress (one line per step,
    `metrics.jsonl`) instead of the Trainer's own printing, and stopped when its groups start without spread
    (`verdict.GroupSpreadWatch`): `(trainer, progress, spread)`."""
    from ..cli.build import build_trainer
    from .progress import DemoProgress, quieted
    from .verdict import GroupSpreadWatch

    progress, spread = DemoProgress(output_dir / "metrics.jsonl"), GroupSpreadWatch()
    trainer = build_trainer(script_args, training_args, model_args, callbacks=[progress, spread], recipe=recipe)
    quieted(trainer)
    return trainer, progress, spread


def save_interrupted(trainer, output_dir: Path) -> Path:
    """The policy as it is now, as a `save_pretrained` folder with its native `.pth`, in `interrupted-step-N`."""
    from ..trainer.outputs.checkpointing import write_native_weights
    from .model import save_folder

    step = trainer.state.global_step
    model = trainer.accelerator.unwrap_model(trainer.model)
    folder = save_folder(model, trainer.processing_class, output_dir / f"interrupted-step-{step}")
    write_native_weights(str(folder))
    return folder


def train_grpo(trainer, progress, script_args, output_dir: Path) -> tuple[Path | None, float]:
    """GRPO through `minimind-trl grpo`'s `run`; Ctrl-C saves the policy into `interrupted-step-N`. Returns that
    folder (None when the run finished) and the seconds GRPO took."""
    from ..cli.grpo import run

    started = time.time()
    interrupted = None
    try:
        run(trainer, script_args)
    except KeyboardInterrupt:
        progress.close()
        interrupted = save_interrupted(trainer, output_dir)
    return interrupted, time.time() - started


def curve_and_saved_model(progress, output_dir: Path, final_dir: Path, title: str):
    """`reward_curve.png` (None when nothing was logged or matplotlib is missing) and the saved model, read back
    from `final_dir` as a user would load it: `(plot, model)`."""
    from ..models.minimind import MiniMindForCausalLM
    from .progress import plot_reward_curve

    plot = plot_reward_curve(progress.records, output_dir / "reward_curve.png", title) if progress.records else None
    return plot, MiniMindForCausalLM.from_pretrained(final_dir)


def output_list(trainer, progress, output_dir: Path, final_dir: Path, interrupted: Path | None, plot: Path | None,
                summary_file: str, extra: tuple[tuple[str, str], ...] = ()) -> list[tuple[str, str]]:
    """What the run wrote, as (label, where) for the closing summary: the model folder and its native weights, the
    per-step metrics, `extra` (after the metrics), the reward curve (or why it was skipped) and the summary."""
    outputs = []
    if interrupted:
        outputs.append((f"interrupted at step {trainer.state.global_step}, model saved to", str(interrupted)))
    outputs.append(("model (save_pretrained folder)", str(final_dir)))
    outputs += [("native MiniMind weights", str(path)) for path in sorted(final_dir.glob("grpo_*.pth"))]
    outputs.append(("per-step metrics", str(output_dir / "metrics.jsonl")))
    outputs += list(extra)
    if plot is not None:
        outputs.append(("reward curve", str(plot)))
    elif progress.records:
        outputs.append(("reward curve", "skipped (matplotlib missing: pip install 'minimind-trl[plot]')"))
    outputs.append(("summary", str(output_dir / summary_file)))
    return outputs


def finish(lines: list[str], verdict, interrupted: Path | None) -> int:
    """Print the closing summary and the verdict (what fell short and what to try on stderr, when the run did not
    learn); the demo's exit code: 130 when interrupted, `DID_NOT_LEARN_EXIT_CODE` when it did not learn, else 0."""
    import sys

    from .verdict import DID_NOT_LEARN_EXIT_CODE

    if interrupted:
        print("\n".join(lines))
        return 130
    if verdict.learned:
        print("\n".join(lines + verdict.lines()))
        return 0
    print("\n".join(lines))
    print("\n".join(f"minimind-trl demo: {line}" if n == 0 else line for n, line in enumerate(verdict.lines())),
          file=sys.stderr)
    return DID_NOT_LEARN_EXIT_CODE
