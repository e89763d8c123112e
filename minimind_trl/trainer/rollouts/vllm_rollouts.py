"""What MiniMind's GRPO asks of vLLM rollouts (`use_vllm: true`) beyond what TRL sets up.

* The dtype rollouts run in follows the recipe: bfloat16 with `bf16: true`, float16 with `fp16: true`, float32
  otherwise. TRL's colocate mode gives vLLM no dtype (vLLM would pick one from the folder and the platform: a
  float32 policy rolled out in bfloat16 on CPU); a server runs the `--dtype` it was started with.
* The log-probs vLLM returns with each token (TRL's `sampling_per_token_logps`, which its importance-sampling
  correction compares with the trainer's own) are taken where the trainer scores: over the raw logits
  (`raw_logprobs`: temperature 1, whole vocabulary) unless `tempered_logprobs` is set, at the sampling temperature
  after top-k/top-p (`processed_logprobs`, TRL's choice) when it is. Either way the ratio measures the engines'
  difference, not the sampling settings.
* A MiniMind policy vLLM cannot run (MiniMind2 MoE, see `minimind_trl.vllm_plugin`) is refused before vLLM starts.
* Server mode needs CUDA: TRL 1.16 pushes the trainer's weights to the server over vLLM's NCCL weight-transfer
  engine, the only one vLLM 0.32 offers that works across processes without CUDA IPC.
* On CPU, vLLM packs each linear layer's weights for its GEMM kernels once they are loaded and drops the unpacked
  parameter, so TRL's colocated weight sync (`load_weights`, one tensor at a time) would find nothing to write to.
  vLLM's layerwise reload (restore the layers, load, pack again) wraps the sync there (`reload_layerwise_on_cpu`).
* A colocated engine is stopped by `MiniMindGRPOTrainer.end()` (`shut_down_engine`) before transformers destroys the
  process group. Left to vLLM's exit-time finalizer, the engine tears down its own groups after the default one is
  gone (a `ValueError: Invalid process group specified` traceback after every finished run); a standalone
  multiprocess engine left there can abort the exit (its monitor thread races the interpreter's shutdown:
  `terminate called without an active exception`, exit -6, seen once in CI's vLLM tests).
"""

import torch

from ...errors import RecipeError


def rollout_dtype(args) -> str:
    """The dtype vLLM rolls out in for this recipe (vLLM's name for it)."""
    if args.bf16:
        return "bfloat16"
    if args.fp16:
        return "float16"
    return "float32"


def logprobs_mode(args) -> str:
    """The vLLM `logprobs_mode` whose log-probs are on the trainer's scale (`tempered_logprobs`)."""
    return "processed_logprobs" if args.tempered_logprobs else "raw_logprobs"


def colocated_engine_kwargs(args) -> dict:
    """What `MiniMindGRPOTrainer` passes to the colocated `vllm.LLM` over TRL's arguments (none without it)."""
    if not args.use_vllm or args.vllm_mode != "colocate":
        return {}
    return {"dtype": rollout_dtype(args), "logprobs_mode": logprobs_mode(args)}


def check_vllm_policy(model, args) -> None:
    """Refuse, before vLLM starts, a policy vLLM cannot roll out and a server mode that cannot sync weights here."""
    if not args.use_vllm:
        return
    if args.vllm_mode == "server" and (args.use_cpu or not torch.cuda.is_available()):
        raise RecipeError(
            "vllm_mode: server needs a CUDA device: TRL 1.16 sends the trained weights to the vLLM server over vLLM's "
            "NCCL weight-transfer engine, which has no CPU backend. On CPU use vllm_mode: colocate."
        )
    config = _policy_config(model)
    if getattr(config, "model_type", None) == "minimind":
        from ...formats.vllm_config import native_config

        native_config(config)  # VLLMModelError naming the folder and why
    if args.use_cpu or not torch.cuda.is_available():
        check_cpu_head_size(config)


# vLLM's CPU attention (`CPUAttentionBackend.get_supported_head_sizes`, vllm/v1/attention/backends/cpu_attn.py in
# vLLM 0.11 to 0.32); asked of vLLM itself when it is installed.
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256)


def cpu_head_sizes() -> tuple[int, ...]:
    """The head sizes vLLM's CPU attention runs: the installed vLLM's own list, else `CPU_HEAD_SIZES`."""
    try:
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend
    except ImportError:  # vLLM not installed (the check runs before `check_extras` names it) or moved
        return CPU_HEAD_SIZES
    return tuple(CPUAttentionBackend.get_supported_head_sizes())


def check_cpu_head_size(config) -> None:
    """Refuse, before the engine's minute of start-up, a policy whose attention head size vLLM's CPU attention
    does not run (it would fail there with vLLM's traceback)."""
    heads = getattr(config, "num_attention_heads", None)
    head_size = getattr(config, "head_dim", None) or (config.hidden_size // heads if heads else None)
    supported = cpu_head_sizes()
    if head_size is not None and head_size not in supported:
        folder = getattr(config, "_name_or_path", "") or "the policy"
        raise RecipeError(
            f"{folder}: use_vllm on CPU needs an attention head size vLLM's CPU attention supports "
            f"({', '.join(map(str, supported))}); this policy's is {head_size} (hidden_size {config.hidden_size} / "
            f"{heads} heads, or head_dim). Use a policy with a supported head size, or use_vllm: false."
        )


def check_server_logprobs_mode(server_logprobs_mode: str, wanted: str) -> None:
    """A server must return log-probs on the trainer's scale, `wanted` (`logprobs_mode`; `trl vllm-serve` starts
    it with TRL's `processed_logprobs`; a later `--logprobs-mode` on its command line wins)."""
    if server_logprobs_mode != wanted:
        tempered = wanted == "processed_logprobs"
        raise RecipeError(
            f"the vLLM server returns {server_logprobs_mode} but this recipe scores log-probs as {wanted} "
            f"(tempered_logprobs: {str(tempered).lower()}): restart it with `--logprobs-mode {wanted}` "
            f"(e.g. `trl vllm-serve --model ... --logprobs-mode {wanted}`), or set tempered_logprobs: "
            f"{str(not tempered).lower()}."
        )


def reload_layerwise_on_cpu(vllm_generation) -> None:
    """Wrap a colocated CPU engine's `sync_weights` in vLLM's layerwise reload (see the module doc). Elsewhere (GPU
    engines, server mode) TRL's sync is left as it is."""
    from vllm.platforms import current_platform

    if vllm_generation.mode != "colocate" or not current_platform.is_cpu():
        return
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod
    from vllm.model_executor.model_loader.reload import finalize_layerwise_reload, initialize_layerwise_reload

    trl_sync_weights = vllm_generation.sync_weights

    def sync_weights():
        runner = vllm_generation.llm.llm_engine.model_executor.driver_worker.model_runner
        initialize_layerwise_reload(runner.model)
        trl_sync_weights()
        finalize_layerwise_reload(runner.model, runner.model_config)
        # The layerwise reload processes a tied head's weight as the embedding only, so the LM head would keep the
        # GEMM weights packed from the old embedding: pack every embedding-shaped layer again (they keep their
        # weight, so this is the processing vLLM did at load time, on the new values).
        for module in runner.model.modules():
            if isinstance(getattr(module, "quant_method", None), UnquantizedEmbeddingMethod):
                module.quant_method.process_weights_after_loading(module)
        repack_cpu_moe_experts(runner.model)

    vllm_generation.sync_weights = sync_weights


def shut_down_engine(llm) -> None:
    """Stop a `vllm.LLM`'s engine (its engine-core process and the threads that watch it) while the interpreter is
    whole. Stopping it detaches vLLM's own exit-time finalizer, so nothing is left for the exit to race."""
    llm.llm_engine.engine_core.shutdown()


def repack_cpu_moe_experts(model) -> None:
    """vLLM 0.32's MoE layers, processed again on a weight update, copy the new expert weights into place unpacked
    but pack them for the CPU kernel only at the first load (`UnquantizedFusedMoEMethod._setup_kernel`): pack them
    again. Every expert weight must just have been reloaded (TRL's sync sends every parameter)."""
    for module in model.modules():
        moe_kernel = getattr(getattr(module, "quant_method", None), "moe_kernel", None)
        if moe_kernel is not None:
            moe_kernel.fused_experts.process_weights_after_loading(module)


def _policy_config(model):
    if isinstance(model, str):
        from transformers import AutoConfig

        import minimind_trl  # noqa: F401  (MiniMind's config class for AutoConfig)

        return AutoConfig.from_pretrained(model)
    return getattr(model, "config", None)


__all__ = [
    "CPU_HEAD_SIZES",
    "check_cpu_head_size",
    "check_server_logprobs_mode",
    "check_vllm_policy",
    "colocated_engine_kwargs",
    "logprobs_mode",
    "reload_layerwise_on_cpu",
    "rollout_dtype",
    "shut_down_engine",
]
