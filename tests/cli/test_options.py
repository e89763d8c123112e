"""Every option `minimind-trl grpo --help` lists (computed from the parser) is placed in `minimind_trl.cli.options` and
has its evidence here: it reaches what the run is built from (the training config, the run plan, the data it loads,
the quantization TRL loads the policy with) with the value given, or it is shown by the tests of the module that acts
on it, or it is refused before any model loads with one line naming it. An option a new TRL or transformers adds
fails `test_every_option_is_placed_and_has_its_evidence` until it is placed and shown.

Evaluation and the held-out data options (`EVALUATION`) are the evaluation tests' (tests/cli/test_evaluation.py).
"""

import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from grpo_fixtures import REPO_ROOT, build_tiny_policy, write_rlaif

from minimind_trl.cli import main as cli
from minimind_trl.cli.options import EVALUATION, OPTIONS, REFUSED, REFUSED_WHERE, render_options_table
from minimind_trl.cli.recipe import make_parser, parse_args

# option: (command-line value, the value the parsed arguments hold, extra flags it needs to act). The value reaches
# the dataclasses the trainer (and the run plan) are built from, unchanged by anything of minimind-trl's.
ARGS = {
    "output_dir": ("elsewhere", "elsewhere", ()), "max_steps": ("5", 5, ()), "seed": ("3", 3, ()),
    "full_determinism": ("true", True, ()), "use_cpu": ("true", True, ()),
    "lr_scheduler_kwargs": ('{"min_lr_rate": 0.2}', {"min_lr_rate": 0.2}, ()), "warmup_steps": ("2", 2, ()),
    "optim": ("sgd", "sgd", ()), "optim_args": ("momentum=0.9", "momentum=0.9", ()),
    "adam_beta1": ("0.8", 0.8, ()), "adam_beta2": ("0.99", 0.99, ()), "adam_epsilon": ("1e-6", 1e-6, ()),
    "optim_target_modules": ("q_proj", "q_proj", ()), "gradient_accumulation_steps": ("2", 2, ()),
    "activation_checkpointing": ("true", True, ()),
    "activation_checkpointing_kwargs": ('{"use_reentrant": false}', {"use_reentrant": False}, ()),
    "gradient_checkpointing_kwargs": ('{"use_reentrant": false}', {"use_reentrant": False}, ()),
    "torch_compile": ("true", True, ()), "torch_compile_backend": ("aot_eager", "aot_eager", ()),
    "torch_compile_mode": ("max-autotune", "max-autotune", ()), "torch_empty_cache_steps": ("5", 5, ()),
    "debug": ("underflow_overflow", ["underflow_overflow"], ()), "skip_memory_metrics": ("false", False, ()),
    "logging_strategy": ("epoch", "epoch", ()), "logging_first_step": ("true", True, ()),
    "log_on_each_node": ("false", False, ()), "logging_nan_inf_filter": ("false", False, ()),
    "log_level": ("info", "info", ()), "log_level_replica": ("error", "error", ()), "disable_tqdm": ("true", True, ()),
    "report_to": ("tensorboard", ["tensorboard"], ()), "run_name": ("run-7", "run-7", ()),
    "project": ("grpo", "grpo", ()), "trackio_space_id": ("me/space", "me/space", ()),
    "trackio_bucket_id": ("bucket", "bucket", ()), "trackio_static_space_id": ("me/static", "me/static", ()),
    "save_strategy": ("epoch", "epoch", ()), "save_on_each_node": ("true", True, ()),
    "save_total_limit": ("2", 2, ()), "save_only_model": ("true", True, ()),
    "enable_jit_checkpoint": ("true", True, ()), "ignore_data_skip": ("true", True, ()),
    "restore_callback_states_from_checkpoint": ("true", True, ()), "push_to_hub": ("true", True, ()),
    "hub_token": ("hf_x", "hf_x", ()), "hub_private_repo": ("true", True, ()), "hub_model_id": ("me/m", "me/m", ()),
    "hub_strategy": ("end", "end", ()), "hub_always_push": ("true", True, ()), "hub_revision": ("dev", "dev", ()),
    "accelerator_config": ('{"split_batches": true}', True, ()), "dataloader_drop_last": ("true", True, ()),
    "dataloader_num_workers": ("2", 2, ()), "dataloader_pin_memory": ("false", False, ()),
    "dataloader_persistent_workers": ("true", True, ("--dataloader_num_workers", "2")),
    "dataloader_prefetch_factor": ("4", 4, ("--dataloader_num_workers", "2")),
    "dataloader_multiprocessing_context": ("spawn", "spawn", ("--dataloader_num_workers", "2")),
    "dataloader_in_order": ("false", False, ()), "remove_unused_columns": ("true", True, ()),
    "shuffle_dataset": ("false", False, ()), "ddp_find_unused_parameters": ("true", True, ()),
    "ddp_bucket_cap_mb": ("50", 50, ()), "ddp_broadcast_buffers": ("true", True, ()),
    "ddp_static_graph": ("true", True, ()), "ddp_timeout": ("600", 600, ()),
    "disable_dropout": ("true", True, ()), "cast_lm_head_to_fp32": ("true", True, ()),
    "ds3_gather_for_generation": ("false", False, ()), "pad_to_multiple_of": ("8", 8, ()),
    "generation_batch_size": ("32", 32, ()), "steps_per_generation": ("2", 2, ()), "top_p": ("0.9", 0.9, ()),
    "min_p": ("0.1", 0.1, ()), "repetition_penalty": ("1.1", 1.1, ()),
    "generation_kwargs": ('{"typical_p": 0.9}', {"typical_p": 0.9}, ()),
    "chat_template_kwargs": ('{"enable_thinking": false}', {"enable_thinking": False}, ()),
    "cache_implementation": ("static", "static", ()), "use_transformers_continuous_batching": ("true", True, ()),
    "transformers_continuous_batching_config": ('{"max_batch_tokens": 256}', {"max_batch_tokens": 256}, ()),
    "use_transformers_paged": ("true", True, ()), "use_vllm": ("true", True, ()), "vllm_mode": ("server", "server", ()),
    "vllm_model_impl": ("transformers", "transformers", ()), "vllm_enable_sleep_mode": ("true", True, ()),
    "vllm_structured_outputs_regex": ("[0-9]+", "[0-9]+", ()), "vllm_server_base_url": ("http://h:1", "http://h:1", ()),
    "vllm_server_host": ("10.0.0.1", "10.0.0.1", ()), "vllm_server_port": ("8001", 8001, ()),
    "vllm_server_timeout": ("60", 60.0, ()), "vllm_group_port": ("51217", 51217, ()),
    "vllm_gpu_memory_utilization": ("0.5", 0.5, ()), "vllm_max_model_length": ("512", 512, ()),
    "vllm_tensor_parallel_size": ("2", 2, ()), "vllm_importance_sampling_correction": ("false", False, ()),
    "vllm_importance_sampling_mode": ("token_truncate", "token_truncate", ()),
    "vllm_importance_sampling_clip_max": ("2.0", 2.0, ()), "vllm_importance_sampling_clip_min": ("0.5", 0.5, ()),
    "vllm_importance_sampling_cap": ("2.5", 2.5, ()), "reward_weights": ("2", [2.0], ()),
    "num_iterations": ("2", 2, ()), "epsilon": ("0.3", 0.3, ()), "epsilon_high": ("0.28", 0.28, ()),
    "mask_truncated_completions": ("true", True, ()), "sync_ref_model": ("true", True, ()),
    "ref_model_mixup_alpha": ("0.5", 0.5, ()), "ref_model_sync_steps": ("10", 10, ()),
    "sapo_temperature_neg": ("1.2", 1.2, ()), "sapo_temperature_pos": ("0.9", 0.9, ()),
    "vespo_k_pos": ("3.0", 3.0, ()), "vespo_lambda_pos": ("2.0", 2.0, ()), "vespo_k_neg": ("2.0", 2.0, ()),
    "vespo_lambda_neg": ("3.0", 3.0, ()), "entropy_coef_min": ("0.1", 0.1, ()), "entropy_coef_max": ("0.5", 0.5, ()),
    "entropy_coef_delta": ("0.01", 0.01, ()), "entropy_target": ("0.3", 0.3, ()),
    "log_completions": ("true", True, ()), "num_completions_to_print": ("2", 2, ()),
    "log_unique_prompts": ("true", True, ()),
    "log_completions_hub_repo": ("me/logs", "me/logs", ("--log_completions", "true")),
    # TRL's, with upstream MiniMind's defaults
    "learning_rate": ("1e-6", 1e-6, ()), "lr_scheduler_type": ("linear", "linear", ()),
    "weight_decay": ("0.0", 0.0, ()), "max_grad_norm": ("0.5", 0.5, ()), "num_train_epochs": ("2", 2.0, ()),
    "per_device_train_batch_size": ("8", 8, ()), "num_generations": ("4", 4, ()),
    "max_completion_length": ("64", 64, ()), "temperature": ("1.0", 1.0, ()), "top_k": ("0", 0, ()),
    "beta": ("0.0", 0.0, ()), "loss_type": ("dapo", "dapo", ()), "use_bias_correction_kl": ("true", True, ()),
    "logging_steps": ("5", 5, ()), "save_steps": ("5", 5, ()), "gradient_checkpointing": ("true", True, ()),
    # TRL's advantages and loss options, where they act: TRL's advantages, TRL's loss types
    "scale_rewards": ("batch", "batch", ("--advantage_estimator", "trl")),
    "multi_objective_aggregation": ("normalize_then_sum", "normalize_then_sum", ("--advantage_estimator", "trl")),
    "importance_sampling_level": ("sequence", "sequence", ()), "top_entropy_quantile": ("0.8", 0.8, ()),
    "off_policy_mask_threshold": ("0.5", 0.5, ()), "delta": ("2.0", 2.0, ()), "entropy_coef": ("0.01", 0.01, ()),
    "use_adaptive_entropy": ("true", True, ()),
}  # fmt: skip

# option: the test module that shows what it does (it names the option); minimind-trl's own options, and those whose
# effect the parse cannot show (bf16 is chosen per machine; a resume, the policy and the data need a run)
SHOWN_BY = {
    "reward_funcs": "tests/rewards/test_reward_registry.py", "reward_model_name_or_path": "tests/cli/test_grpo_cli.py",
    "reward_model_type": "tests/rewards/test_reward_registry.py", "reasoning": "tests/trainer/test_python_trainer.py",
    "reward_model_clip": "tests/rewards/test_minimind3_rewards.py", "dataset_roles": "tests/test_prompt_rendering.py",
    "thinking_ratio": "tests/test_prompt_rendering.py", "system_prompt_ratio": "tests/test_prompt_rendering.py",
    "dataset_data_files": "tests/cli/test_agent_recipe.py", "dataset_max_samples": "tests/trainer/outputs/test_run_identity.py",
    "tokenizer_name_or_path": "tests/conversion/test_native_settings.py",
    "native_num_attention_heads": "tests/cli/test_grpo_cli.py", "native_config": "tests/conversion/test_native_settings.py",
    "callbacks": "tests/trainer/test_distributed.py", "rollout": "tests/agent/test_agent_training.py",
    "agent_tools": "tests/agent/test_agent_training.py", "agent_tool_timeout": "tests/cli/test_agent_recipe.py",
    "agent_max_turns": "tests/agent/test_agent_training.py", "agent_max_total_length": "tests/agent/test_agent_training.py",
    "agent_max_tool_output": "tests/agent/test_rollout.py", "advantage_estimator": "tests/trainer/test_distributed.py",
    "loss_aggregation": "tests/trainer/algorithm/test_seams.py", "loss_kwargs": "tests/trainer/algorithm/test_loss_inputs.py",
    "upstream": "tests/test_generations.py", "tempered_logprobs": "tests/trainer/test_trainer.py",
    "moe_aux_loss_weight": "tests/trainer/test_trainer.py", "dynamic_sampling": "tests/trainer/algorithm/test_dynamic_sampling.py",
    "max_resample_rounds": "tests/trainer/algorithm/test_dynamic_sampling.py",
    "max_prompt_length": "tests/trainer/test_grpo_config.py", "fast_sampling": "tests/trainer/speed/test_fast_sampling.py",
    "sampling_weights_dtype": "tests/trainer/speed/test_decode_kernel.py",
    "share_prompts": "tests/trainer/speed/test_prompt_sharing.py",
    "compile_generation": "tests/trainer/speed/test_compiled_generation.py",
    "save_native_pth": "tests/trainer/test_distributed.py", "overwrite_output_dir": "tests/trainer/outputs/test_output_dir.py",
    "accept_inexact_resume": "tests/trainer/outputs/test_run_safety.py", "bf16": "tests/trainer/speed/test_cpu_precision.py",
    "resume_from_checkpoint": "tests/trainer/test_resume.py", "model_name_or_path": "tests/cli/test_grpo_cli.py",
    "dataset_name": "tests/cli/test_grpo_cli.py",
    "ddp_backend": "tests/trainer/test_fsdp_launch.py",  # a launched run's: one process has no process group to name
    "dataset_test_split": "tests/cli/test_evaluation.py", "datasets": "tests/cli/test_run_data.py",
    "test_split_size": "tests/cli/test_run_data.py", "eval_strategy": "tests/cli/test_evaluation.py",
    "eval_steps": "tests/cli/test_evaluation.py", "per_device_eval_batch_size": "tests/cli/test_shipped_recipes.py",
    "num_generations_eval": "tests/cli/test_evaluation.py", "eval_dataset_name": "tests/cli/test_evaluation.py",
}  # fmt: skip

# option: the flags that make it refused (in the context where it cannot act; a dict: recipe keys, for values the
# command line cannot give), and what the one line says
REFUSALS = {
    "dataset_config": (["--dataset_config", "zh"], "RLAIF data has no configurations"),
    "dataset_streaming": (["--dataset_streaming", "true"], "every row is read and checked before training"),
    "streaming": (["--streaming", "true"], "every row is read and checked before training"),
    "ignore_bias_buffers": (["--ignore_bias_buffers", "true"], "no GRPO script reads it"),
    "label_smoothing_factor": (["--label_smoothing_factor", "0.1"], "the Trainer's label loss"),
    "label_names": (["--label_names", "labels"], "the Trainer's label loss"),
    "average_tokens_across_devices": (["--average_tokens_across_devices", "false"], "the Trainer's label loss"),
    "train_sampling_strategy": (["--train_sampling_strategy", "group_by_length"], "the Trainer's sampler"),
    "length_column_name": (["--length_column_name", "n"], "the Trainer's sampler"),
    "data_seed": (["--data_seed", "3"], "the prompt order comes from `seed`"),
    "auto_find_batch_size": (["--auto_find_batch_size", "true"], "not supported by GRPO"),  # TRL's own refusal
    "neftune_noise_alpha": (["--neftune_noise_alpha", "5"], "NEFTune noises the embeddings"),
    "include_num_input_tokens_seen": (["--include_num_input_tokens_seen", "true"], "TRL logs `num_tokens` itself"),
    "use_cache": (["--use_cache", "true"], "generation always uses the KV cache"),
    "use_liger_kernel": (["--use_liger_kernel", "true"], "liger-kernel has no MiniMind kernels"),
    "liger_kernel_config": ({"liger_kernel_config": {"rms_norm": True}}, "liger-kernel has no MiniMind kernels"),
    "router_aux_loss_coef": (["--router_aux_loss_coef", "0.01"], "moe_aux_loss_weight"),
    "log_multimodal": (["--log_multimodal", "false"], "MiniMind is text-only"),
    "max_tool_calling_iterations": (["--max_tool_calling_iterations", "2"], "`rollout: agent`"),
    "do_train": (["--do_train", "true"], "`minimind-trl grpo` always trains"),
    "fsdp": (["--fsdp", "full_shard"], "sharding is set by the accelerate config"),
    "fsdp_config": (["--fsdp_config", '{"version": 2}'], "sharding is set by the accelerate config"),
    "deepspeed": ({"deepspeed": {"zero_optimization": {"stage": 2}}}, "sharding is set by the accelerate config"),
    "parallelism_config": ({"parallelism_config": {"tp_size": 2}}, "a plan MiniMind does not define"),
    "local_rank": (["--local_rank", "0"], "torch.distributed.launch"),
    # refused where they cannot act: minimind-trl's advantages and losses replace TRL's; CPU runs
    "scale_rewards": (["--scale_rewards", "batch"], "scale_rewards='batch' has no effect with advantage_estimator"),
    "multi_objective_aggregation": (["--multi_objective_aggregation", "normalize_then_sum"], "has no effect with"),
    "importance_sampling_level": (["--importance_sampling_level", "sequence", "--loss_type", "minimind3_cispo",
                                   "--epsilon_high", "5"], "importance_sampling_level='sequence' is implemented by "
                                  "TRL's loss types only"),
    "top_entropy_quantile": (["--top_entropy_quantile", "0.8", "--loss_type", "minimind3_cispo", "--epsilon_high", "5"],
                             "top_entropy_quantile=0.8 is implemented by TRL's loss types only"),
    "off_policy_mask_threshold": (["--off_policy_mask_threshold", "0.5", "--loss_type", "minimind3_cispo",
                                   "--epsilon_high", "5"], "off_policy_mask_threshold=0.5 is implemented by"),
    "delta": (["--delta", "2", "--loss_type", "minimind3_cispo", "--epsilon_high", "5"], "delta=2.0 is implemented by"),
    "entropy_coef": (["--entropy_coef", "0.1", "--loss_type", "minimind3_cispo", "--epsilon_high", "5"],
                     "entropy_coef=0.1 is implemented by TRL's loss types only"),
    "use_adaptive_entropy": (["--use_adaptive_entropy", "true", "--loss_type", "minimind3_cispo", "--epsilon_high", "5"],
                             "use_adaptive_entropy=True is implemented by TRL's loss types only"),
    "fp16": (["--fp16", "true", "--use_cpu", "true"], "fp16"),
    "tf32": (["--tf32", "true", "--use_cpu", "true"], "--tf32 requires"),
    "load_in_4bit": (["--load_in_4bit", "true", "--use_peft", "true"], "--load_in_4bit true: bitsandbytes quantizes"),
    "load_in_8bit": (["--load_in_8bit", "true", "--use_peft", "true"], "--load_in_8bit true: bitsandbytes quantizes"),
}  # fmt: skip

# shown below by the run plan, the data loaded and the quantization config
PLAN = {"model_revision", "dtype", "attn_implementation", "model_init_kwargs", "trust_remote_code", "use_peft", "lora_r",
        "lora_alpha", "lora_dropout", "lora_target_modules", "lora_target_parameters", "lora_modules_to_save",
        "lora_task_type", "use_rslora", "use_dora", "dataset_train_split", "load_in_4bit", "load_in_8bit",
        "bnb_4bit_quant_type", "use_bnb_nested_quant", "bnb_4bit_quant_storage"}  # fmt: skip


def parser_options() -> set[str]:
    """Every option of `minimind-trl grpo --help` but `--help` and `--config` (the recipe those options come from)."""
    return {action.dest for action in make_parser()._actions} - {"help", "config"}


def test_every_option_is_placed_and_has_its_evidence():
    options = parser_options()
    assert sorted(options - set(OPTIONS)) == [], "place these in minimind_trl/cli/options.py"
    assert sorted(set(OPTIONS) - options) == [], "minimind_trl/cli/options.py places options the parser lacks"
    evidence = set(ARGS) | set(SHOWN_BY) | set(REFUSALS) | PLAN
    acting = {name for name, entry in OPTIONS.items() if entry.status != EVALUATION}
    assert sorted(acting - evidence) == [], "show what these do here (or refuse them)"
    assert sorted(evidence - acting) == []
    refused = {name for name, entry in OPTIONS.items() if entry.status in (REFUSED, REFUSED_WHERE)}
    assert sorted(refused - set(REFUSALS)) == [], "every refused option needs its refusal example"


@pytest.mark.parametrize("option", sorted(SHOWN_BY))
def test_the_module_showing_an_option_names_it(option):
    assert option in (REPO_ROOT / SHOWN_BY[option]).read_text(encoding="utf-8")


def test_the_docs_table_is_the_options_rendering():
    text = (REPO_ROOT / "docs" / "training.md").read_text(encoding="utf-8")
    start = text.index("\n", text.index("<!-- options table:")) + 1
    end = text.index("\n<!-- end of options table -->")
    assert text[start:end] == render_options_table(), (
        "docs/training.md is out of date: paste `python -m minimind_trl.cli.options` between its markers"
    )


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("options")
    data = root / "data"
    data.mkdir()
    write_rlaif(data / "train.jsonl")
    write_rlaif(data / "test.jsonl", prompts=["Only in the test split?"] * 4)
    return SimpleNamespace(root=root, policy=build_tiny_policy(root / "policy"), data=data)


BASE = ["--model_name_or_path", "./never/loaded", "--dataset_name", "never.jsonl", "--bf16", "false"]


def plain(value):
    """A parsed value as a recipe writes it (enums as their value, a config object as the dict it was given)."""
    if isinstance(value, list):
        return [plain(item) for item in value]
    if dataclasses.is_dataclass(value):
        return dataclasses.asdict(value)
    return getattr(value, "value", value)


@pytest.mark.parametrize("option", sorted(ARGS))
def test_an_option_reaches_the_arguments_the_run_is_built_from(option, tmp_path):
    value, expected, context = ARGS[option]
    base = [*BASE, "--output_dir", str(tmp_path / "out"), *context]
    given = parse_args([*base, f"--{option}", value])
    default = parse_args(base)
    for parsed, unset in zip(given[:3], default[:3]):
        if any(item.name == option for item in dataclasses.fields(parsed)):
            got, before = plain(getattr(parsed, option)), plain(getattr(unset, option))
            break
    if option == "accelerator_config":
        got, before = got["split_batches"], before["split_batches"]
    assert got == expected and got != before


@pytest.mark.parametrize("option", sorted(REFUSALS))
def test_a_refused_option_is_one_line_naming_it_before_any_model_loads(option, sources, tmp_path, capsys, monkeypatch):
    import yaml

    from minimind_trl.cli import build

    monkeypatch.setattr(build, "build_from_plan", lambda *a, **k: pytest.fail("the run went on to load the models"))
    given, reason = REFUSALS[option]
    argv = ["--model_name_or_path", str(sources.policy), "--dataset_name", str(sources.data), "--use_cpu", "true",
            "--bf16", "false", "--output_dir", str(tmp_path / "out")]  # fmt: skip
    if isinstance(given, dict):  # in a recipe, refused naming its file and line
        recipe = {key.removeprefix("--"): value for key, value in zip(argv[::2], argv[1::2])}
        recipe = {**recipe, "use_cpu": True, "bf16": False, **given}
        (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
        argv = ["--config", str(tmp_path / "recipe.yaml")]
        reason = f"recipe.yaml:{sorted(recipe).index(option) + 1}: {option}="  # safe_dump sorts the keys
    assert cli(["grpo", *argv, *([] if isinstance(given, dict) else given)]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("minimind-trl grpo: error:")]
    assert len(lines) == 1 and option in lines[0] and reason in lines[0], err[-2000:]
    assert "Traceback" not in err


def plan_for(sources, tmp_path, *flags):
    from minimind_trl.cli.run_plan import check_run

    argv = ["--model_name_or_path", str(sources.policy), "--dataset_name", str(sources.data), "--reward_funcs",
            "format", "--use_cpu", "true", "--bf16", "false", "--output_dir", str(tmp_path / "out"), *flags]  # fmt: skip
    script_args, training_args, model_args, _ = parse_args(argv)
    return check_run(script_args, training_args, model_args), (script_args, training_args, model_args)


@pytest.mark.parametrize(
    "flags, key, expected",
    [
        (["--model_revision", "v2"], "revision", "v2"),
        (["--dtype", "bfloat16"], "dtype", "bfloat16"),
        (["--attn_implementation", "eager"], "attn_implementation", "eager"),
        (["--trust_remote_code", "true"], "trust_remote_code", True),
        (["--model_init_kwargs", '{"low_cpu_mem_usage": true}'], "low_cpu_mem_usage", True),
    ],
)  # fmt: skip
def test_the_policy_options_reach_its_from_pretrained_arguments(sources, tmp_path, flags, key, expected):
    plan, _ = plan_for(sources, tmp_path, *flags)
    assert plan.model_init_kwargs[key] == expected
    assert plan_for(sources, tmp_path)[0].model_init_kwargs.get(key) != expected


def test_the_lora_options_reach_the_adapter(sources, tmp_path):
    lora = ["--use_peft", "true", "--lora_r", "4", "--lora_alpha", "8", "--lora_dropout", "0.1",
            "--lora_target_modules", "q_proj", "v_proj", "--lora_modules_to_save", "lm_head",
            "--lora_task_type", "CAUSAL_LM", "--use_rslora", "true", "--use_dora", "true"]  # fmt: skip
    assert plan_for(sources, tmp_path)[0].peft_config is None
    config = plan_for(sources, tmp_path, *lora)[0].peft_config
    assert (config.r, config.lora_alpha, config.lora_dropout) == (4, 8, 0.1)
    assert set(config.target_modules) == {"q_proj", "v_proj"} and config.modules_to_save == ["lm_head"]
    assert config.task_type == "CAUSAL_LM" and config.use_rslora and config.use_dora
    on_parameters = plan_for(sources, tmp_path, "--use_peft", "true", "--lora_target_parameters", "mlp.gate_proj.weight")
    assert list(on_parameters[0].peft_config.target_parameters) == ["mlp.gate_proj.weight"]


def test_dataset_train_split_picks_the_split_trained_on(sources, tmp_path):
    from minimind_trl.cli.run_data import load_run_data

    plan, _ = plan_for(sources, tmp_path, "--dataset_train_split", "test")
    prompts = {row["prompt"][-1]["content"] for row in load_run_data(plan.prompts).train}
    assert prompts == {"Only in the test split?"}


def test_the_quantization_options_reach_the_config_trl_loads_the_policy_with(sources, tmp_path, monkeypatch):
    """Where bitsandbytes and CUDA are (here: said so), QLoRA's flags become TRL's `BitsAndBytesConfig`; the GPU check's
    `qlora` part trains with it (tests/gpu/test_gpu_qlora.py)."""
    import importlib.util

    from minimind_trl.cli import policy

    monkeypatch.setattr(policy, "runs_on_cpu", lambda use_cpu: False)
    found = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "bitsandbytes" else found(name, *a))
    qlora = ["--use_peft", "true", "--load_in_4bit", "true", "--bnb_4bit_quant_type", "fp4", "--use_bnb_nested_quant",
             "true", "--bnb_4bit_quant_storage", "uint8"]  # fmt: skip
    config = plan_for(sources, tmp_path, *qlora)[0].quantization_config
    assert config.load_in_4bit and config.bnb_4bit_quant_type == "fp4" and config.bnb_4bit_use_double_quant
    assert str(config.bnb_4bit_quant_storage) == "torch.uint8"
    assert plan_for(sources, tmp_path, "--use_peft", "true", "--load_in_8bit", "true")[0].quantization_config.load_in_8bit
    assert plan_for(sources, tmp_path, "--use_peft", "true")[0].quantization_config is None
    for flags, fragment in [(["--load_in_4bit", "true"], "add --use_peft true"),
                            (["--use_peft", "true", "--load_in_4bit", "true", "--load_in_8bit", "true"],
                             "can't use 8 bit and 4 bit precision at the same time")]:  # fmt: skip  (TRL's refusal)
        with pytest.raises(ValueError, match=fragment):
            plan_for(sources, tmp_path, *flags)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "bitsandbytes" else found(name, *a))
    with pytest.raises(ValueError, match="needs the bitsandbytes package"):
        plan_for(sources, tmp_path, "--use_peft", "true", "--load_in_4bit", "true")


# --------------------------------------------------------------------------- side by side with TRL's own `trl grpo`

# TRL keys only, as a TRL user's GRPO recipe has them (the policy, data and rewards are added below)
TRL_RECIPES = {
    "dapo": {"learning_rate": 0.01, "beta": 0.04, "loss_type": "dapo", "per_device_train_batch_size": 8,
             "num_generations": 4, "max_completion_length": 8, "logging_steps": 1},
    "lora": {"use_peft": True, "lora_r": 8, "lora_alpha": 16, "lora_target_modules": ["q_proj", "v_proj"],
             "learning_rate": 1e-5, "num_generations": 4, "per_device_train_batch_size": 8},
    "schedule": {"lr_scheduler_type": "cosine", "warmup_steps": 1, "gradient_accumulation_steps": 2,
                 "steps_per_generation": 2, "num_iterations": 2, "temperature": 1.0, "top_p": 0.95, "top_k": 0,
                 "epsilon_high": 0.28, "mask_truncated_completions": True, "log_completions": True,
                 "num_generations": 4, "per_device_train_batch_size": 8},
    "dr_grpo": {"loss_type": "dr_grpo", "scale_rewards": "none", "num_generations": 4, "per_device_train_batch_size": 8},
}  # fmt: skip


def side_by_side_recipe(sources, tmp_path, keys: dict) -> Path:
    """`keys` with what both commands read the same way: a saved MiniMind folder, a data folder whose rows carry TRL's
    `prompt` and MiniMind's `conversations`, a reward named by its dotted path, and CPU settings."""
    import yaml

    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    rows = [{"prompt": [{"role": "user", "content": text}],
             "conversations": [{"role": "user", "content": text}, {"role": "assistant", "content": ""}]}
            for text in ("中国的首都是哪里？", "Say hello in French.", "What is 2+2?", "Name a colour.")]  # fmt: skip
    (data / "train.jsonl").write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
    recipe = {"model_name_or_path": str(sources.policy), "dataset_name": str(data), "trust_remote_code": True,
              "reward_funcs": ["grpo_fixtures.token_reward"], "max_steps": 1, "save_strategy": "no",
              "report_to": "none", "bf16": False, "use_cpu": True, "seed": 7, **keys}  # fmt: skip
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def trl_accepts(recipe: Path, tmp_path) -> bool:
    from trl.scripts.grpo import make_parser as trl_parser

    trl_parser().parse_args_and_config(["--config", str(recipe), "--output_dir", str(tmp_path / "trl")])
    return True


@pytest.mark.parametrize("name", sorted(TRL_RECIPES))
def test_a_trl_recipe_is_accepted_as_trl_grpo_accepts_it(name, sources, tmp_path, capsys):
    """Both commands take the recipe, or minimind-trl refuses it in one line saying what to add: `dr_grpo`'s
    `scale_rewards` acts only with TRL's advantages here (`advantage_estimator: trl`), where `trl grpo` computes TRL's
    advantages always."""
    from minimind_trl.cli.run_plan import check_run

    recipe = side_by_side_recipe(sources, tmp_path, TRL_RECIPES[name])
    assert trl_accepts(recipe, tmp_path)
    argv = ["--config", str(recipe), "--output_dir", str(tmp_path / "ours")]
    if name == "dr_grpo":
        with pytest.raises(ValueError, match="scale_rewards='none' has no effect with advantage_estimator='minimind'"):
            parse_args(argv)
        argv += ["--advantage_estimator", "trl"]
    script_args, training_args, model_args, recipe_record = parse_args(argv)
    check_run(script_args, training_args, model_args, recipe=recipe_record)


@pytest.mark.slow(minutes=1)
def test_trl_grpo_and_minimind_trl_grpo_train_the_same_recipe_on_the_same_folder(sources, tmp_path):
    """`trl grpo` (its own script, loading the saved folder's code with trust_remote_code) and `minimind-trl grpo`
    train the same recipe for a step each, both saving a model that moved."""
    import subprocess
    import sys

    from grpo_fixtures import subprocess_env
    from safetensors.torch import load_file

    recipe = side_by_side_recipe(sources, tmp_path, TRL_RECIPES["dapo"])
    initial = load_file(sources.policy / "model.safetensors")
    for command, out in (("trl", "trl"), ("minimind-trl", "ours")):  # the executables installed beside python
        executable = str(Path(sys.executable).parent / command)
        argv = [executable, "grpo", "--config", str(recipe), "--output_dir", str(tmp_path / out)]
        result = subprocess.run(argv, capture_output=True, text=True, env=subprocess_env(), cwd=tmp_path, timeout=600)
        assert result.returncode == 0, (command, result.stderr[-3000:])
        saved = load_file(tmp_path / out / "model.safetensors")
        assert max((saved[key] - initial[key]).abs().max().item() for key in initial) > 0, command
