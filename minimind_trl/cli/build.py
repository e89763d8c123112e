"""Stage 3 of `minimind-trl grpo`: the built parts. Data, policy source, tokenizer and rewards, then the trainer.

Runs after the run plan (`run_plan.check_run`), so everything here may load: nothing is checked again, and what
the plan derived (where the prompts are read from, where the policy loads from and how a native `.pth` converts,
the prompt rendering, the agent's rollout and tools, the reward spec, the policy's `from_pretrained` arguments, the
adapter, the run identity and the model card) is read from it; the script arguments are not.
"""

import re
import warnings
from contextlib import nullcontext

from ..agent.recipe import build_agent_rollout, check_agent_tokenizer, check_offered_tools
from ..prompt_rendering import render_per_prompt
from ..rewards.registry import build_reward_funcs
from ..trainer.grpo_trainer import MiniMindGRPOTrainer
from .model_generation import warn_on_generation_mismatch
from .policy import load_tokenizer, prepare_policy
from .recipe import Recipe
from .run_data import RunData, load_run_data
from .run_plan import RunPlan, check_enough_prompts, check_run


# TRL warns that `rollout_func` is experimental whenever a trainer is built with one. `rollout: agent` uses it on
# purpose (docs/agent.md#the-rollout): that notice, raised from this trainer's constructor, is not shown.
TRL_ROLLOUT_FUNC_NOTICE = "You are using 'rollout_func', which is an experimental feature."


def hide_rollout_func_notice() -> None:
    warnings.filterwarnings(
        "ignore", message=re.escape(TRL_ROLLOUT_FUNC_NOTICE), category=UserWarning,
        module=re.escape(MiniMindGRPOTrainer.__module__),
    )  # fmt: skip


def build_from_plan(
    plan: RunPlan, training_args, model_args, callbacks=None, train_dataset=None, eval_dataset=None
) -> MiniMindGRPOTrainer:
    """Load the parts a checked plan names and construct the trainer (not yet trained)."""
    training_args.resume_from_checkpoint = plan.resume_from_checkpoint
    training_args.model_init_kwargs = plan.model_init_kwargs
    if train_dataset is not None:
        data = RunData(train_dataset, eval_dataset)
    else:
        with training_args.main_process_first(desc="loading the data"):  # the others then hit the cache
            data = load_run_data(plan.prompts)
    source = plan.run_card.dataset if train_dataset is None else None
    check_enough_prompts(data.train, training_args, source)
    if plan.agent is not None:  # before the policy loads: the data is read now
        toolbox = plan.agent.toolbox.load()
        for prompts, where in ((data.train, source), (data.eval, plan.run_card.eval_dataset)):
            if prompts is not None:
                check_offered_tools(prompts, toolbox, where)
    policy = plan.policy  # a native .pth: the main process converts it, the others then read its folder
    converting = (
        training_args.main_process_first(local=training_args.save_on_each_node, desc="converting the native policy")
        if policy.native is not None
        else nullcontext()
    )
    with converting:
        prepare_policy(policy, model_args.model_revision)
    warn_on_generation_mismatch(
        plan.rewards.reward_funcs, training_args, policy.path, policy.base_model, model_args.model_revision
    )
    tokenizer = load_tokenizer(policy.tokenizer_path, revision=model_args.model_revision)
    train = render_per_prompt(data.train, tokenizer, plan.rendering, plan.chat_template_kwargs)
    held_out = render_per_prompt(data.eval, tokenizer, plan.rendering, plan.chat_template_kwargs)
    rollout_func = None
    if plan.agent is not None:
        check_agent_tokenizer(tokenizer, plan.agent.thinking_ratio, plan.chat_template_kwargs)
        rollout_func = build_agent_rollout(plan.agent)
        hide_rollout_func_notice()
    reward_funcs = build_reward_funcs(plan.rewards, tokenizer)
    return MiniMindGRPOTrainer(
        model=policy.path,
        reward_funcs=reward_funcs,
        args=training_args,
        train_dataset=train,
        eval_dataset=held_out,
        processing_class=tokenizer,
        callbacks=plan.callbacks + list(callbacks or []),
        peft_config=plan.peft_config,
        quantization_config=plan.quantization_config,
        rollout_func=rollout_func,
        run_identity=plan.run_identity,
        run_card=plan.run_card,
    )


def build_trainer(
    script_args, training_args, model_args, callbacks=None, recipe: Recipe | None = None, train_dataset=None,
    eval_dataset=None,
) -> MiniMindGRPOTrainer:
    """Check (the run plan), then load and build: parsed arguments -> a `MiniMindGRPOTrainer` ready to train.

    `callbacks` are added to those of `script_args.callbacks`; `train_dataset` (and `eval_dataset`, the held-out
    prompts when the run evaluates) replace the data the recipe names.
    """
    plan = check_run(script_args, training_args, model_args, check_data=train_dataset is None, recipe=recipe)
    return build_from_plan(plan, training_args, model_args, callbacks, train_dataset, eval_dataset)


__all__ = ["build_from_plan", "build_trainer"]
