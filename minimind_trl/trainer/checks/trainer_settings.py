"""What `MiniMindGRPOTrainer` checks and derives from its config before TRL builds anything, in one pass.

A Python user constructs the trainer from a plain `MiniMindGRPOConfig`, without the CLI's run plan, so the trainer
checks its own arguments. `trainer_settings` does so once, in this order, and the constructor reads the result:

1. the datasets: held-out prompts when `eval_strategy` evaluates (`check_eval_dataset`; transformers would raise
   its own error), and for one rendered per prompt (`prompt_rendering.with_rendered_prompts`) the trainer settings
   under which its renderer could not see the epoch or its row column (`check_rendering_settings`, also the run
   plan's check);
2. the optional packages the config switches on (`extras`): named now, not in a traceback after the models load;
3. vLLM rollouts (`vllm_rollouts`): a policy vLLM cannot run, a server mode that cannot sync weights here, the
   colocated engine's dtype and log-probs, and the log-probs a server must return;
4. the temperature the loss's log-probs are scored at and the function each seam runs (for the run record).

Two checks need what TRL builds and stay in the constructor: a vLLM server's log-probs mode against the one
derived here (the server must answer first) and the lean sampler's (`_fast_sampler`: whether DeepSpeed or FSDP
partitions the policy).
"""

from dataclasses import dataclass, field
from typing import Any

from ...errors import RecipeError
from ...prompt_rendering import PromptRendering, prompt_renderer
from ..algorithm.policy_losses import TRL_LOSS_TYPES
from ..algorithm.seam_choice import seam_run_identity
from ..rollouts.vllm_rollouts import check_vllm_policy, colocated_engine_kwargs, logprobs_mode
from .extras import EXTRAS, check_extras, missing_extra


@dataclass(frozen=True)
class TrainerSettings:
    """What the trainer's constructor reads, derived once from its config by `trainer_settings`."""

    scoring_temperature: float  # the fused LM head's: 1.0 unless `tempered_logprobs`
    vllm_engine_kwargs: dict = field(default_factory=dict)  # over TRL's, for a colocated `vllm.LLM`
    server_logprobs_mode: str | None = None  # what a vLLM server must return (None: neither loss nor TRL reads it)
    seam_identity: dict = field(default_factory=dict)  # the run record's `<key>_function` entries
    missing_after_trl: str | None = None  # a missing extra named only after TRL's own argument checks


def check_rendering_settings(rendering: PromptRendering, training_args) -> None:
    """Trainer settings under which the renderer could not see the epoch or its row column: a `RecipeError`."""
    if not rendering.per_prompt:
        return
    if training_args.remove_unused_columns:
        raise RecipeError(
            "thinking_ratio/system_prompt_ratio render each prompt from its row, which remove_unused_columns=true "
            "would drop; set remove_unused_columns: false (TRL's GRPO default)"
        )
    if training_args.dataloader_num_workers > 0 and training_args.dataloader_persistent_workers:
        raise RecipeError(
            "thinking_ratio/system_prompt_ratio key each prompt on the epoch, which persistent dataloader workers "
            "never see change; set dataloader_persistent_workers: false (or dataloader_num_workers: 0)"
        )


def check_rendered_dataset(dataset: Any, training_args) -> None:
    """`check_rendering_settings` for a dataset a Python user rendered with `with_rendered_prompts` (the CLI checks
    its recipe before loading anything)."""
    renderer = prompt_renderer(dataset)
    if renderer is not None:
        check_rendering_settings(renderer.rendering, training_args)


def check_eval_dataset(eval_dataset: Any, args) -> None:
    """An `eval_strategy` that evaluates needs held-out prompts: a `RecipeError` saying where they come from."""
    strategy = getattr(args.eval_strategy, "value", args.eval_strategy)
    if strategy != "no" and eval_dataset is None:
        raise RecipeError(
            f"eval_strategy={strategy!r} evaluates on held-out prompts, but there are none: pass eval_dataset= (with "
            "minimind-trl grpo: dataset_test_split, eval_dataset_name or a mixture's test_split_size), or set "
            "eval_strategy: no"
        )


def trainer_settings(model, args, train_dataset, eval_dataset=None) -> TrainerSettings:
    """The checks of the module doc, in its order, and what the constructor reads. With a policy the caller built,
    liger-kernel (imported only when training starts) is named after TRL's own argument checks, which hold with or
    without it (e.g. an adapter on lm_head), so TRL's errors come first as with `GRPOTrainer`."""
    check_eval_dataset(eval_dataset, args)
    for dataset in (train_dataset, *(eval_dataset.values() if isinstance(eval_dataset, dict) else [eval_dataset])):
        check_rendered_dataset(dataset, args)  # its renderer needs its row and epoch
    after_trl = ("use_liger_kernel",) if not isinstance(model, str) else ()
    check_extras(args, [option for option in EXTRAS if option not in after_trl])
    missing_after_trl = missing_extra(args, after_trl)
    check_vllm_policy(model, args)
    engine_kwargs = colocated_engine_kwargs(args)
    uses_vllm_logprobs = args.vllm_importance_sampling_correction or args.loss_type not in TRL_LOSS_TYPES
    server_logprobs_mode = logprobs_mode(args) if uses_vllm_logprobs else None
    return TrainerSettings(
        scoring_temperature=args.temperature if args.tempered_logprobs else 1.0,
        vllm_engine_kwargs=engine_kwargs,
        server_logprobs_mode=server_logprobs_mode,
        seam_identity=seam_run_identity(args),
        missing_after_trl=missing_after_trl,
    )


__all__ = [
    "TrainerSettings", "check_eval_dataset", "check_rendered_dataset", "check_rendering_settings", "trainer_settings"
]  # fmt: skip
