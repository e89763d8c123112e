"""Every option `minimind-trl grpo --help` lists, and what a run does with it: one table, read by the command (the
options it refuses), by docs/training.md (`python -m minimind_trl.cli.options` renders the table there) and by the
test that walks the parser's options, so a new option of TRL's or transformers' fails it until it is placed here.

An option is either one a run acts on (ours, or TRL's/transformers' as `trl grpo` uses it: where it configures a
feature that is off, such as `lora_r` without `use_peft` or `vllm_*` without `use_vllm`, it waits for that switch,
as in TRL) or it is refused before any model loads, in one line naming it, because here it could not act: the
GRPO trainer never reads it, or minimind-trl replaced what it configures, or it cannot run where the run runs.
"""

import dataclasses
from dataclasses import dataclass

from ..errors import RecipeError

OURS, UPSTREAM, TRL, REFUSED, REFUSED_WHERE, EVALUATION = (
    "ours", "TRL's, upstream's default", "TRL's", "refused", "refused where it cannot act", "evaluation (unchecked)",
)  # fmt: skip


@dataclass(frozen=True)
class OptionGroup:
    """Options that share what a run does with them (`here`) under one `status`."""

    status: str
    names: tuple[str, ...]
    here: str


def group(status: str, names: str, here: str) -> OptionGroup:
    return OptionGroup(status, tuple(names.split()), here)


OPTION_GROUPS = (
    # -- minimind-trl's own --
    group(OURS, "reward_funcs reward_model_name_or_path reward_model_type reasoning reward_model_clip",
          "MiniMind's rewards by name or `module:function`, and the reward model ([Rewards](#rewards))"),
    group(OURS, "dataset_roles thinking_ratio system_prompt_ratio dataset_data_files dataset_max_samples",
          "how MiniMind's data rows become prompts ([Data](#data))"),
    group(OURS, "tokenizer_name_or_path native_num_attention_heads native_config",
          "a native `.pth` policy, converted on the fly ([Converting a checkpoint](#converting-a-checkpoint))"),
    group(OURS, "callbacks", "`TrainerCallback` classes as `module:Class`"),
    group(OURS, "rollout agent_tools agent_tool_timeout agent_max_turns agent_max_total_length agent_max_tool_output",
          "MiniMind-3's agent stage ([agent.md](agent.md))"),
    group(OURS, "advantage_estimator loss_aggregation loss_kwargs upstream tempered_logprobs moe_aux_loss_weight "
          "dynamic_sampling max_resample_rounds max_prompt_length",
          "MiniMind's GRPO ([generations.md](generations.md)); `max_prompt_length` is upstream's left cut"),
    group(OURS, "fast_sampling sampling_weights_dtype share_prompts compile_generation",
          "speed levers with the same results ([cpu.md](cpu.md))"),
    group(OURS, "save_native_pth overwrite_output_dir accept_inexact_resume",
          "upstream's `.pth` at every save; the output folder and resume rules ([Resume](#resume-and-what-is-refused))"),
    # -- TRL's and transformers', with upstream MiniMind's defaults --
    group(UPSTREAM, "learning_rate lr_scheduler_type weight_decay max_grad_norm num_train_epochs "
          "per_device_train_batch_size num_generations max_completion_length temperature top_k beta loss_type "
          "use_bias_correction_kl logging_steps save_steps bf16 gradient_checkpointing",
          "as in TRL, defaulting to upstream's `train_grpo.py` ([generations.md](generations.md)); `loss_type` also "
          "names a registered loss"),
    # -- TRL's and transformers', as `trl grpo` uses them --
    group(TRL, "model_name_or_path model_revision dtype attn_implementation model_init_kwargs trust_remote_code",
          "the policy (and reference) `from_pretrained` arguments; a native `.pth` is converted first"),
    group(TRL, "use_peft lora_r lora_alpha lora_dropout lora_target_modules lora_target_parameters "
          "lora_modules_to_save lora_task_type use_rslora use_dora",
          "TRL's LoRA adapter ([LoRA](#lora)); the `lora_*` options with `use_peft`"),
    group(TRL, "load_in_4bit load_in_8bit bnb_4bit_quant_type use_bnb_nested_quant bnb_4bit_quant_storage",
          "QLoRA: the policy's weights in bitsandbytes 4 or 8 bits under a LoRA adapter, on a CUDA GPU. Refused on "
          "CPU, without bitsandbytes or without `use_peft` ([QLoRA](#qlora-a-quantized-policy)); the `bnb_*` "
          "options with `load_in_4bit`"),
    group(TRL, "dataset_name dataset_train_split", "the training data's source and split ([Data](#data))"),
    group(TRL, "output_dir max_steps resume_from_checkpoint seed full_determinism use_cpu",
          "as in TRL (`resume_from_checkpoint` also takes `last`)"),
    group(TRL, "lr_scheduler_kwargs warmup_steps optim optim_args adam_beta1 adam_beta2 adam_epsilon "
          "optim_target_modules gradient_accumulation_steps",
          "the Trainer's optimizer and schedule (`optim_target_modules` with GaLore/APOLLO optimizers)"),
    group(TRL, "fp16 tf32 activation_checkpointing activation_checkpointing_kwargs gradient_checkpointing_kwargs "
          "torch_compile torch_compile_backend torch_compile_mode torch_empty_cache_steps debug skip_memory_metrics",
          "precision, memory and compilation as in transformers (`fp16` and `tf32` need a GPU: refused on CPU)"),
    group(TRL, "logging_strategy logging_first_step log_on_each_node logging_nan_inf_filter log_level "
          "log_level_replica disable_tqdm report_to run_name project trackio_space_id trackio_bucket_id "
          "trackio_static_space_id", "logging as in TRL ([Logging](#logging))"),
    group(TRL, "save_strategy save_on_each_node save_total_limit save_only_model enable_jit_checkpoint "
          "ignore_data_skip restore_callback_states_from_checkpoint",
          "checkpoints as in transformers, written whole or not at all ([Resume](#resume-and-what-is-refused))"),
    group(TRL, "push_to_hub hub_token hub_private_repo hub_model_id hub_strategy hub_always_push hub_revision",
          "Hub pushes as in transformers, checked first ([Hand off](../README.md#3-hand-off))"),
    group(TRL, "accelerator_config dataloader_drop_last dataloader_num_workers dataloader_pin_memory "
          "dataloader_persistent_workers dataloader_prefetch_factor dataloader_multiprocessing_context "
          "dataloader_in_order remove_unused_columns shuffle_dataset",
          "the data loader and accelerate as in TRL"),
    group(TRL, "ddp_find_unused_parameters ddp_bucket_cap_mb ddp_broadcast_buffers ddp_static_graph ddp_backend "
          "ddp_timeout", "DDP as in transformers ([Multi-node](#multi-node-slurm))"),
    group(TRL, "disable_dropout cast_lm_head_to_fp32 ds3_gather_for_generation pad_to_multiple_of "
          "generation_batch_size steps_per_generation top_p min_p repetition_penalty generation_kwargs "
          "chat_template_kwargs cache_implementation use_transformers_continuous_batching "
          "transformers_continuous_batching_config use_transformers_paged",
          "TRL's generation (`ds3_gather_for_generation` under ZeRO-3; `use_transformers_paged` is TRL's former "
          "name of continuous batching)"),
    group(TRL, "use_vllm vllm_mode vllm_model_impl vllm_enable_sleep_mode vllm_structured_outputs_regex "
          "vllm_server_base_url vllm_server_host vllm_server_port vllm_server_timeout vllm_group_port "
          "vllm_gpu_memory_utilization vllm_max_model_length vllm_tensor_parallel_size "
          "vllm_importance_sampling_correction vllm_importance_sampling_mode vllm_importance_sampling_clip_max "
          "vllm_importance_sampling_clip_min vllm_importance_sampling_cap",
          "rollouts in vLLM ([vllm.md](vllm.md)); the `vllm_*` options with `use_vllm` (`vllm_importance_sampling_cap` "
          "is TRL's former name of `..._clip_max`)"),
    group(TRL, "reward_weights num_iterations epsilon epsilon_high mask_truncated_completions sync_ref_model "
          "ref_model_mixup_alpha ref_model_sync_steps sapo_temperature_neg sapo_temperature_pos vespo_k_pos "
          "vespo_lambda_pos vespo_k_neg vespo_lambda_neg entropy_coef_min entropy_coef_max entropy_coef_delta "
          "entropy_target", "TRL's algorithm (`sapo_*` with `loss_type: sapo`, `vespo_*` with `vespo`, `ref_model_*` "
          "with `sync_ref_model`, `entropy_coef_*`/`entropy_target` with `use_adaptive_entropy`)"),
    group(TRL, "log_completions num_completions_to_print log_unique_prompts log_completions_hub_repo",
          "TRL's completion tables and printouts"),
    # -- refused where minimind-trl replaced what they configure, or where they cannot run --
    group(REFUSED_WHERE, "scale_rewards multi_objective_aggregation",
          "TRL's advantages: with `advantage_estimator: trl` only (a registered estimator computes its own)"),
    group(REFUSED_WHERE, "importance_sampling_level top_entropy_quantile off_policy_mask_threshold delta "
          "entropy_coef use_adaptive_entropy",
          "TRL's loss: with TRL's loss types only (a registered loss replaces TRL's; its own terms come from "
          "`loss_kwargs`)"),
    # -- refused: nothing in a minimind-trl run would act on them --
    group(REFUSED, "ignore_bias_buffers", "TRL's DPO script's DDP workaround; no GRPO script reads it"),
    group(REFUSED, "label_smoothing_factor label_names average_tokens_across_devices",
          "the Trainer's label loss, which GRPO's loss replaces"),
    group(REFUSED, "train_sampling_strategy length_column_name data_seed",
          "the Trainer's sampler, which TRL's replaces: the prompt order comes from `seed`"),
    group(REFUSED, "auto_find_batch_size", "not supported by GRPO: it would halve `per_device_train_batch_size` after an "
          "out-of-memory error, breaking the generation batch's whole groups (and what a resume keeps)"),
    group(REFUSED, "neftune_noise_alpha", "NEFTune noises the embeddings of the loss forward but not the sampling or the "
          "reference, so the ratio and the KL compare different models"),
    group(REFUSED, "include_num_input_tokens_seen",
          "GRPO's batches hold no `input_ids` for the Trainer to count; TRL logs `num_tokens` itself"),
    group(REFUSED, "use_cache", "generation always uses the KV cache, and the loss forwards need none"),
    group(REFUSED, "use_liger_kernel liger_kernel_config", "liger-kernel has no MiniMind kernels"),
    group(REFUSED, "router_aux_loss_coef", "TRL weights Mixtral-style router logits, which MiniMind does not return; "
          "MiniMind's MoE loss is weighted by `moe_aux_loss_weight`"),
    group(REFUSED, "log_multimodal", "MiniMind is text-only: there are no images to log"),
    group(REFUSED, "max_tool_calling_iterations", "TRL's `tools=` loop, which the command never starts: tool calls "
          "train through `rollout: agent` (`agent_max_turns`)"),
    group(REFUSED, "do_train", "a script's switch the Trainer never reads: `minimind-trl grpo` always trains"),
    group(REFUSED, "fsdp fsdp_config deepspeed", "sharding is set by the accelerate config (`recipes/accelerate/`: "
          "`fsdp.yaml`, `zero2.yaml`, `zero3.yaml`), not by TrainingArguments"),
    group(REFUSED, "local_rank", "the argument torch.distributed.launch passed, which nothing reads (`accelerate launch` "
          "and `torchrun` set `LOCAL_RANK`)"),
    group(REFUSED, "parallelism_config", "tensor and context parallelism need a plan MiniMind does not define"),
    # -- held-out prompts, mixtures and evaluation, as TRL's script builds them --
    group(TRL, "dataset_test_split datasets test_split_size", "held-out and mixed data as TRL's script reads them "
          "([Splits, mixtures](#splits-mixtures-and-trls-other-dataset-options))"),
    group(TRL, "eval_strategy eval_steps per_device_eval_batch_size num_generations_eval",
          "evaluation on held-out prompts ([Evaluation during training](#evaluation-during-training))"),
    group(OURS, "eval_dataset_name", "held-out prompts of their own ([Evaluation during training](#evaluation-during-training))"),
    group(REFUSED_WHERE, "dataset_config dataset_streaming streaming", "MiniMind's data has no configurations, and every "
          "row is read and checked before training ([Splits, mixtures](#splits-mixtures-and-trls-other-dataset-options))"),
    group(EVALUATION, "eval_delay prediction_loss_only eval_on_start eval_do_concat_batches eval_use_gather_object "
          "eval_accumulation_steps include_for_metrics batch_eval_metrics bf16_full_eval fp16_full_eval "
          "load_best_model_at_end metric_for_best_model greater_is_better do_eval do_predict",
          "the Trainer's other evaluation settings, with `eval_strategy`, as in transformers; not yet walked one by one"),
)

OPTIONS = {name: entry for entry in OPTION_GROUPS for name in entry.names}


def field_defaults(parser) -> dict:
    """Option -> the default of its dataclass field (what the option means when a recipe does not set it)."""
    defaults = {}
    for dataclass_type in parser.dataclass_types:
        for item in dataclasses.fields(dataclass_type):
            if item.default is not dataclasses.MISSING:
                defaults[item.name] = item.default
            elif item.default_factory is not dataclasses.MISSING:
                defaults[item.name] = item.default_factory()
    return defaults


def _unset(value) -> bool:
    return value is None or value == "" or (isinstance(value, (list, tuple, dict)) and not value)


def _given(value, default) -> bool:
    """Whether a parsed value is other than the field's default (an enum compared as its value; None, "" and an
    empty list all mean unset)."""
    value, default = getattr(value, "value", value), getattr(default, "value", default)
    if _unset(value) or _unset(default):
        return not (_unset(value) and _unset(default))
    return value != default


def refusal(name: str, value, default) -> str | None:
    """Why `name` set to `value` is refused (a `REFUSED` option given other than its `default`), or None."""
    entry = OPTIONS.get(name)
    if entry is None or entry.status != REFUSED or not _given(value, default):
        return None
    return f"{name}={value!r} is not supported by minimind-trl grpo: {entry.here}"


def check_refused_value(key: str, value, defaults: dict, where: str) -> None:
    """A `RecipeError` at `where` (a recipe's file and line) when the recipe sets a `REFUSED` option."""
    problem = refusal(key, value, defaults.get(key))
    if problem is not None:
        raise RecipeError(f"{where}: {problem}")


def check_refused_options(parser, parsed) -> None:
    """A `RecipeError` naming the first `REFUSED` option `parsed` (the parsed dataclasses) sets, and why. (A recipe's
    keys are checked as it is read, `recipe.check_recipe_keys`: some of these fail TRL's own parsing first.)"""
    defaults = field_defaults(parser)
    for args in parsed:
        for item in dataclasses.fields(args):
            problem = refusal(item.name, getattr(args, item.name), defaults.get(item.name))
            if problem is not None:
                raise RecipeError(problem)


def render_options_table() -> str:
    """docs/training.md's table of the options, one row per group."""
    rows = ["| options | whose | here |", "|---|---|---|"]
    for entry in OPTION_GROUPS:
        names = ", ".join(f"`{name}`" for name in entry.names)
        rows.append(f"| {names} | {entry.status} | {entry.here} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(render_options_table())


__all__ = [
    "OPTIONS",
    "OPTION_GROUPS",
    "OptionGroup",
    "check_refused_options",
    "check_refused_value",
    "field_defaults",
    "refusal",
    "render_options_table",
]
