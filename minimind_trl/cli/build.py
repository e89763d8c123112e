"""Stage 3 of `minimind-trl grpo`: the built parts. Data, policy source, tokenizer and rewards, then the trainer.

Runs after the run plan (`run_plan.check_run`), so everything here may load: nothing is checked again, and what
the plan derived (where the policy loads from, the prompt rendering, the policy's `from_pretrained` arguments,
the adapter, the run identity and the model card) is read from it.
"""

from contextlib import nullcontext

from ..agent.data import load_agent_dataset
from ..agent.recipe import build_agent_rollout, check_agent_tokenizer, check_offered_tools
from ..agent.tools import recipe_toolbox
from ..data import load_rlaif_dataset
from ..prompt_rendering import PromptRendering, with_rendered_prompts
from ..rewards.registry import build_reward_funcs
from ..trainer.grpo_trainer import MiniMindGRPOTrainer
from .model_generation import warn_on_generation_mismatch
from .policy import load_tokenizer, prepare_policy
from .recipe import Recipe
from .run_plan import RunPlan, check_enough_prompts, check_run


def load_train_dataset(script_args, training_args):
    """The prompts of `dataset_name`: RLAIF rows, or agent RL rows with `rollout: agent` (the main process reads
    first, the others hit the cache)."""
    with training_args.main_process_first(desc="loading the training data"):
        if script_args.rollout == "agent":
            dataset = load_agent_dataset(
                script_args.dataset_name, split=script_args.dataset_train_split,
                data_files=script_args.dataset_data_files,
            )
        else:
            dataset = load_rlaif_dataset(
                script_args.dataset_name,
                split=script_args.dataset_train_split,
                data_files=script_args.dataset_data_files,
                roles=script_args.dataset_roles,
            )
    if script_args.dataset_max_samples is not None:
        dataset = dataset.select(range(min(script_args.dataset_max_samples, len(dataset))))
    return dataset


def render_per_prompt(dataset, tokenizer, rendering: PromptRendering, chat_template_kwargs=None):
    """`dataset` with each prompt rendered per row (MiniMind-3's `thinking_ratio`/system prompts), or unchanged."""
    if not rendering.per_prompt:
        return dataset
    return with_rendered_prompts(dataset, tokenizer, rendering, chat_template_kwargs)


def build_from_plan(
    plan: RunPlan, script_args, training_args, model_args, callbacks=None, train_dataset=None
) -> MiniMindGRPOTrainer:
    """Load the parts a checked plan names and construct the trainer (not yet trained)."""
    training_args.resume_from_checkpoint = plan.resume_from_checkpoint
    training_args.model_init_kwargs = plan.model_init_kwargs
    dataset = train_dataset if train_dataset is not None else load_train_dataset(script_args, training_args)
    check_enough_prompts(dataset, training_args, script_args.dataset_name if train_dataset is None else None)
    if script_args.rollout == "agent":  # before the policy loads: the data is read now
        check_offered_tools(dataset, recipe_toolbox(script_args), script_args.dataset_name)
    policy = plan.policy  # a native .pth: the main process converts it, the others then read its folder
    converting = (
        training_args.main_process_first(local=training_args.save_on_each_node, desc="converting the native policy")
        if policy.native_checkpoint is not None
        else nullcontext()
    )
    with converting:
        prepare_policy(policy, model_args, script_args)
    warn_on_generation_mismatch(script_args, training_args, policy.path, policy.base_model, model_args.model_revision)
    tokenizer = load_tokenizer(policy.tokenizer_path, revision=model_args.model_revision)
    dataset = render_per_prompt(dataset, tokenizer, plan.rendering, plan.chat_template_kwargs)
    rollout_func = None
    if script_args.rollout == "agent":
        check_agent_tokenizer(tokenizer, script_args.thinking_ratio, plan.chat_template_kwargs)
        rollout_func = build_agent_rollout(script_args)
    reward_funcs = build_reward_funcs(script_args, plan.reward_context, tokenizer)
    return MiniMindGRPOTrainer(
        model=policy.path,
        reward_funcs=reward_funcs,
        args=training_args,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=plan.callbacks + list(callbacks or []),
        peft_config=plan.peft_config,
        quantization_config=plan.quantization_config,
        rollout_func=rollout_func,
        run_identity=plan.run_identity,
        run_card=plan.run_card,
    )


def build_trainer(
    script_args, training_args, model_args, callbacks=None, recipe: Recipe | None = None, train_dataset=None
) -> MiniMindGRPOTrainer:
    """Check (the run plan), then load and build: parsed arguments -> a `MiniMindGRPOTrainer` ready to train.

    `callbacks` are added to those of `script_args.callbacks`; `train_dataset` replaces `dataset_name`'s data.
    """
    plan = check_run(script_args, training_args, model_args, check_data=train_dataset is None, recipe=recipe)
    return build_from_plan(plan, script_args, training_args, model_args, callbacks, train_dataset)


__all__ = ["build_from_plan", "build_trainer", "load_train_dataset", "render_per_prompt"]
