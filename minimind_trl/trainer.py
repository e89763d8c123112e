"""MiniMind's GRPO on TRL: `MiniMindGRPOConfig` and `MiniMindGRPOTrainer`.

The trainer is TRL's `GRPOTrainer` (generation, rewards, accelerate/DeepSpeed, PEFT, vLLM, logging and
checkpoints stay TRL's) with MiniMind's arithmetic where the two differ: the double-normalised advantages,
log-probs scored at temperature 1, the MoE load-balancing loss of the policy forward, and prompts cut to
their last `max_prompt_length` tokens. `MiniMindGRPOConfig`'s defaults are the seed script's
(`train_grpo.py`); each field documents the seed flag it stands for.
"""

import copy
import inspect
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field

import torch
from accelerate.utils import is_peft_model
from trl import GRPOConfig, GRPOTrainer
from trl.trainer import grpo_trainer as _trl_grpo

from . import fast_logprobs
from .advantages import batch_renormalize, group_zscore, minimind_advantages
from .fast_generation import FastSampler

ADVANTAGE_ESTIMATORS = ("minimind", "trl")


@dataclass
class MiniMindGRPOConfig(GRPOConfig):
    r"""
    [`GRPOConfig`] with MiniMind's defaults and the switches MiniMind's GRPO needs.

    Every TRL option keeps working; only the defaults below differ from TRL's. Seed flags are those of
    MiniMind's `train_grpo.py`.

    Parameters:
        > MiniMind-specific parameters

        max_prompt_length (`int` or `None`, *optional*, defaults to `66`):
            Keep only the last `max_prompt_length` tokens of each tokenized prompt (the left side is dropped, so
            the generation prompt `<|im_start|>assistant\n` survives). Seed: `--max_seq_len 66`. `None` keeps
            whole prompts. TRL 1.16 itself has no prompt truncation.
        advantage_estimator (`str`, *optional*, defaults to `"minimind"`):
            `"minimind"`: the seed's advantages (see [`minimind_advantages`]): per-group z-score with the unbiased
            std + 1e-4, clamped to [-10, 10], then re-normalised over the process-local generation batch.
            `scale_rewards` and `multi_objective_aggregation` must keep their defaults then, since they would
            have no effect. `"trl"`: TRL's own advantages (`scale_rewards`, `multi_objective_aggregation`).
        tempered_logprobs (`bool`, *optional*, defaults to `False`):
            Score the loss's log-probs at the sampling `temperature` (TRL's behaviour). Off by default: the seed
            samples at 0.8 but scores with untempered logits.
        fast_sampling (`bool`, *optional*, defaults to `True`):
            Sample rollouts with [`~minimind_trl.fast_generation.FastSampler`]: temperature + top-k drawn among the
            k candidates only (the distribution `generate` samples from), no logits-processor chain, decoding with
            the class forward (no autocast wrapper). Settings it does not implement fall back to `generate`. Not
            used under ZeRO-3/FSDP (stock `generate` keeps the ranks' forwards in step) nor with vLLM.
        sampling_weights_dtype (`str` or `None`, *optional*, defaults to `None`):
            With `fast_sampling`, decode with a copy of the weights in this dtype (`"bfloat16"`), refreshed from
            the policy at every generation. Worth it on CPU from hidden size ~512 (benchmarks/README.md).
        moe_aux_loss_weight (`float`, *optional*, defaults to `1.0`):
            Weight of the model's own MoE load-balancing loss (MiniMind's `aux_loss`, already scaled by the
            model config's `router_aux_loss_coef`), taken from the same forward that computes the policy
            log-probs. Seed: implicit weight 1 (`loss = policy_loss + aux_loss`). Dense models return 0.

        > TRL / transformers parameters whose defaults are the seed's

        learning_rate (`float`, defaults to `8e-8`): seed `--learning_rate`.
        lr_scheduler_type (`str`, defaults to `"cosine_with_min_lr"`) and lr_scheduler_kwargs (defaults to
            `{"min_lr_rate": 0.1}` for that scheduler): cosine from the peak to 10 % of it over the run, the seed's
            `CosineAnnealingLR(T_max=total_steps, eta_min=lr / 10)`.
        weight_decay (`float`, defaults to `0.01`): the seed's `torch.optim.AdamW` default. (transformers exempts
            norm weights and biases from decay; the seed decays every parameter.)
        max_grad_norm (`float`, defaults to `1.0`): seed `--grad_clip`.
        num_train_epochs (`float`, defaults to `1`): seed `--epochs`.
        per_device_train_batch_size (`int`, defaults to `16`): completions per device and step, i.e. the seed's
            `--batch_size 2` prompts x `--num_generations 8`.
        gradient_accumulation_steps: seed `--accumulation_steps` (1).
        steps_per_generation (`int`, defaults to `1` unless `generation_batch_size` is set): generate for every
            micro-batch as the seed does, so the advantages' batch normalisation spans one micro-batch per
            process, as in the seed. TRL's default (`gradient_accumulation_steps`) generates once per optimizer
            step instead.
        num_generations (`int`, defaults to `8`): seed `--num_generations`.
        max_completion_length (`int`, defaults to `1536`): seed `--max_gen_len`.
        temperature (`float`, defaults to `0.8`): the seed's hard-coded sampling temperature.
        top_k (`int`, defaults to `50`): the seed never sets it, so it sampled with the transformers 4.x
            generation default `top_k=50` (`top_p=1.0`, which is also TRL's default). TRL's default is `0`
            (disabled); set `top_k: 0` for plain temperature sampling.
        beta (`float`, defaults to `0.02`): seed `--beta`, the weight of the k3 KL to the frozen reference.
        loss_type (`str`, defaults to `"grpo"`): the seed's aggregation, the mean over completions of the
            masked token mean, divided by the accumulation steps. Any TRL loss type can be used with the seed's
            advantages (e.g. `"dapo"` sums token losses over the batch's completion tokens instead).
        num_iterations (`int`, defaults to `1`): one optimisation pass per generation, so the PPO ratio is
            exactly 1 in value and its clipping never binds (the seed has no clipping).
        use_bias_correction_kl (`bool`, defaults to `False`): the seed's KL carries no importance-sampling weight.
        bf16 (`bool`, defaults to `True` unless `fp16` is set): bf16 mixed precision (autocast, fp32 master
            weights), the seed's `--dtype bfloat16`. `bf16: false` restores fp32 numerics. As in TRL, bf16 on a
            machine without a GPU needs `use_cpu: true`.
        activation_checkpointing / gradient_checkpointing (`bool`, default off): the seed does not recompute
            activations; TRL's default (on) trades a second forward of every layer for memory.
        logging_steps (`float`, defaults to `1`): seed `--log_interval`.
        save_steps (`float`, defaults to `10`): seed `--save_interval`.
        seed (`int`, defaults to `42`): the seed script's `setup_seed(42)`.
    """

    # MiniMind-specific parameters
    max_prompt_length: int | None = field(
        default=66,
        metadata={
            "help": "Keep only the last `max_prompt_length` tokens of each prompt (left side dropped), like the "
            "seed's `--max_seq_len`. `None` keeps whole prompts."
        },
    )
    advantage_estimator: str = field(
        default="minimind",
        metadata={
            "help": "'minimind': the seed's double-normalised advantages (group z-score with unbiased std + 1e-4, "
            "clamp to [-10, 10], then re-normalised over the process-local batch). 'trl': TRL's advantages "
            "(`scale_rewards`, `multi_objective_aggregation`).",
            "choices": list(ADVANTAGE_ESTIMATORS),
        },
    )
    tempered_logprobs: bool = field(
        default=False,
        metadata={
            "help": "Score the loss's log-probs at the sampling temperature (TRL's behaviour). Off by default: the "
            "seed samples at 0.8 and scores with untempered logits."
        },
    )
    fast_sampling: bool = field(
        default=True,
        metadata={
            "help": "Sample rollouts with minimind_trl.fast_generation's lean top-k loop (the same distribution as "
            "`generate`, less per-step overhead; stock `generate` for settings it does not implement). Applies "
            "to transformers generation without ZeRO-3/FSDP; vLLM and continuous batching are unaffected."
        },
    )
    sampling_weights_dtype: str | None = field(
        default=None,
        metadata={
            "help": "Decode rollouts with a copy of the weights in this dtype (e.g. 'bfloat16'; refreshed every "
            "generation). Halves the bytes read per decoding step; pays on CPU from hidden size ~512. The loss "
            "still scores the real weights.",
            "choices": [None, "bfloat16", "float16"],
        },
    )
    moe_aux_loss_weight: float = field(
        default=1.0,
        metadata={
            "help": "Weight of the model's own MoE load-balancing loss (`aux_loss` of the policy forward, already "
            "scaled by the model's `router_aux_loss_coef`). The seed adds it with weight 1."
        },
    )

    # TRL / transformers parameters with the seed's defaults
    learning_rate: float = field(default=8e-8, metadata={"help": "Peak learning rate of AdamW (seed: 8e-8)."})
    lr_scheduler_type: str = field(
        default="cosine_with_min_lr",
        metadata={"help": "Scheduler; the default decays the lr along a cosine to `min_lr_rate` (0.1) of its peak."},
    )
    weight_decay: float = field(default=0.01, metadata={"help": "AdamW weight decay (torch's AdamW default)."})
    max_grad_norm: float = field(default=1.0, metadata={"help": "Gradient clipping norm (seed: 1.0)."})
    num_train_epochs: float = field(default=1.0, metadata={"help": "Training epochs (seed: 1)."})
    per_device_train_batch_size: int = field(
        default=16, metadata={"help": "Completions per device and step: 2 prompts x 8 generations, as in the seed."}
    )
    num_generations: int | None = field(default=8, metadata={"help": "Completions per prompt (seed: 8)."})
    max_completion_length: int | None = field(default=1536, metadata={"help": "Maximum new tokens (seed: 1536)."})
    temperature: float = field(default=0.8, metadata={"help": "Sampling temperature (seed: 0.8)."})
    top_k: int = field(
        default=50,
        metadata={
            "help": "Top-k sampling; 50 is what the seed implicitly used (transformers 4.x default). 0 disables."
        },
    )
    beta: float = field(default=0.02, metadata={"help": "Weight of the k3 KL to the reference model (seed: 0.02)."})
    loss_type: str = field(
        default="grpo",
        metadata={"help": "Loss aggregation; 'grpo' is the seed's (mean over completions of the masked token mean)."},
    )
    use_bias_correction_kl: bool = field(
        default=False, metadata={"help": "Weight the KL by the importance-sampling ratio (the seed does not)."}
    )
    # transformers 5.24 renamed it `activation_checkpointing`; None lets either name switch it on (off by default)
    gradient_checkpointing: bool | None = field(
        default=None,
        metadata={"help": "Deprecated alias of `activation_checkpointing`; off unless set, like the seed."},
    )
    logging_steps: float = field(default=1, metadata={"help": "Log every X optimizer steps (seed: 1)."})
    save_steps: float = field(default=10, metadata={"help": "Save a checkpoint every X optimizer steps (seed: 10)."})

    def __post_init__(self):
        if self.lr_scheduler_type == "cosine_with_min_lr" and self.lr_scheduler_kwargs is None:
            self.lr_scheduler_kwargs = {"min_lr_rate": 0.1}
        if self.steps_per_generation is None and self.generation_batch_size is None:
            self.steps_per_generation = 1
        super().__post_init__()

        if self.max_prompt_length is not None and self.max_prompt_length < 1:
            raise ValueError(
                f"max_prompt_length must be a positive number of tokens or None, got {self.max_prompt_length}."
            )
        if self.advantage_estimator not in ADVANTAGE_ESTIMATORS:
            raise ValueError(
                f"advantage_estimator must be one of {ADVANTAGE_ESTIMATORS}, got {self.advantage_estimator!r}."
            )
        if self.advantage_estimator == "minimind":
            if self.scale_rewards != "group":
                raise ValueError(
                    f"scale_rewards={self.scale_rewards!r} has no effect with advantage_estimator='minimind' (the "
                    "seed's group z-score then batch re-normalisation). Use advantage_estimator='trl' for TRL's "
                    "scaling."
                )
            if self.multi_objective_aggregation != "sum_then_normalize":
                raise ValueError(
                    f"multi_objective_aggregation={self.multi_objective_aggregation!r} has no effect with "
                    "advantage_estimator='minimind', which normalises the weighted sum of the rewards. Use "
                    "advantage_estimator='trl' for TRL's aggregation."
                )
        if self.use_transformers_continuous_batching and (self.bf16 or self.fp16):
            raise ValueError(
                "use_transformers_continuous_batching with bf16/fp16: TRL 1.16 casts the trainable fp32 policy to the "
                "half dtype in place for that path and never casts it back. Set bf16: false (and fp16: false)."
            )
        if self.sampling_weights_dtype is not None and not self.fast_sampling:
            raise ValueError("sampling_weights_dtype needs fast_sampling: true (it is the lean sampler's option)")
        if self.use_vllm and self.vllm_importance_sampling_correction and not self.tempered_logprobs:
            raise ValueError(
                "vllm_importance_sampling_correction compares vLLM's log-probs, taken at the sampling temperature, "
                "with the trainer's; with tempered_logprobs=False the trainer scores at temperature 1 and the ratio "
                "would be biased. Set tempered_logprobs=True or vllm_importance_sampling_correction=False."
            )


def _reference_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A frozen copy of an in-memory policy, taken before TRL patches its forward.

    A policy handed to an earlier trainer carries instance-level forwards (TRL's fused LM head, accelerate's
    autocast wrapper) that close over the ORIGINAL module: a deep copy would keep computing with the policy's
    live weights. Dropping them restores the class forward on the copy.
    """
    if any(hasattr(parameter, "ds_id") for parameter in model.parameters()):
        raise ValueError(
            "The policy is an in-memory model already partitioned by DeepSpeed ZeRO-3, which cannot be copied for "
            "the reference model; pass its path (or Hub id) so the reference is loaded like the policy."
        )
    reference = copy.deepcopy(model)
    reference.__dict__.pop("_original_forward", None)
    if not hasattr(reference, "_hf_hook"):  # accelerate's device-map hooks deep-copy correctly; keep those
        reference.__dict__.pop("forward", None)
    return reference.requires_grad_(False).eval()


@contextmanager
def _trl_init_overrides(scoring_temperature: float, reference_model: torch.nn.Module | None):
    """Two substitutions while `GRPOTrainer.__init__` runs, which has no argument for either.

    * `add_fused_lm_head` gets `scoring_temperature` instead of the sampling temperature, so the loss's
      log-probs come from untempered logits unless `tempered_logprobs` is set.
    * For an in-memory policy TRL would reload the reference from `config._name_or_path` (empty for an
      unsaved model, stale for a modified one); `create_model_from_path` hands it `reference_model` instead.
    """
    add_fused_lm_head, create_model_from_path = _trl_grpo.add_fused_lm_head, _trl_grpo.create_model_from_path
    pending_reference = [reference_model] if reference_model is not None else []

    def add_fused_lm_head_at_scoring_temperature(model, temperature=1.0, **kwargs):
        # TRL's head, plus a CPU path scoring only completion positions (TRL's without Triton scores every one)
        return fast_logprobs.add_fused_lm_head(model, temperature=scoring_temperature, **kwargs)

    def create_reference_model(model_id, *args, **kwargs):
        # Only called for the reference once the policy is an instance (TRL loads a str policy itself).
        return pending_reference.pop() if pending_reference else create_model_from_path(model_id, *args, **kwargs)

    _trl_grpo.add_fused_lm_head = add_fused_lm_head_at_scoring_temperature
    _trl_grpo.create_model_from_path = create_reference_model
    try:
        yield
    finally:
        _trl_grpo.add_fused_lm_head, _trl_grpo.create_model_from_path = add_fused_lm_head, create_model_from_path
    if pending_reference:
        raise RuntimeError("GRPOTrainer did not build a reference model; the in-memory reference copy was unused")


class MiniMindGRPOTrainer(GRPOTrainer):
    """TRL's `GRPOTrainer` computing MiniMind's GRPO: the seed's advantages, untempered log-probs, the MoE
    load-balancing loss of the policy forward, prompts cut from the left and generation in eval mode.

    Takes `GRPOTrainer`'s arguments; `args` must be a [`MiniMindGRPOConfig`]. `model` may be a path, a Hub id
    or an in-memory model; for the latter the frozen reference is a copy of the object itself.
    """

    _tag_names = ["trl", "grpo", "minimind"]

    def __init__(self, model, reward_funcs=None, args: MiniMindGRPOConfig | None = None, *trl_args, **trl_kwargs):
        if args is None:
            name = model if isinstance(model, str) else getattr(model.config, "_name_or_path", "") or "MiniMind"
            args = MiniMindGRPOConfig(f"{name.rstrip('/').split('/')[-1]}-GRPO")
        if not isinstance(args, MiniMindGRPOConfig):
            raise TypeError(f"args must be a MiniMindGRPOConfig, got {type(args).__name__}")
        bound = inspect.signature(GRPOTrainer.__init__).bind(self, model, reward_funcs, args, *trl_args, **trl_kwargs)
        peft_config = bound.arguments.get("peft_config")
        uses_peft = peft_config is not None or (not isinstance(model, str) and is_peft_model(model))
        reference = None
        if not isinstance(model, str) and args.beta != 0.0 and not uses_peft:
            reference = _reference_copy(model)
        scoring_temperature = args.temperature if args.tempered_logprobs else 1.0
        with _trl_init_overrides(scoring_temperature, reference):
            super().__init__(model, reward_funcs, args, *trl_args, **trl_kwargs)
        # TRL's own MoE aux path is Mixtral's (router logits). MiniMind has no router-logits output and returns its
        # loss on the backbone output instead, but its config names the coefficient `router_aux_loss_coef`, and an
        # `output_router_logits` attribute left on it (TRL's SFTTrainer sets one) would switch TRL's path on.
        if getattr(self.model.config, "model_type", None) == "minimind":
            self.aux_loss_enabled = False
        self._adds_model_aux_loss = not self.aux_loss_enabled and args.moe_aux_loss_weight != 0.0
        self._rewards_per_func = None
        self._past_eos_attended = False
        self._sampler = self._fast_sampler(args)

    # --- prompts and generation ------------------------------------------------------------------------

    def _tokenize_prompts(self, prompts: list):
        """TRL's tokenization, then each prompt cut to its last `max_prompt_length` tokens (the seed's cut)."""
        prompt_ids, images, multimodal_fields = super()._tokenize_prompts(prompts)
        limit = self.args.max_prompt_length
        if limit is not None and any(len(ids) > limit for ids in prompt_ids):
            if images is not None or multimodal_fields:
                raise ValueError(
                    f"max_prompt_length={limit} would cut image tokens out of a multimodal prompt; set it to None"
                )
            prompt_ids = [ids[-limit:] for ids in prompt_ids]
        return prompt_ids, images, multimodal_fields

    def _fast_sampler(self, args: MiniMindGRPOConfig) -> FastSampler | None:
        """The lean sampler, where it applies (transformers generation on unpartitioned weights)."""
        if not args.fast_sampling or self.use_vllm or args.use_transformers_continuous_batching:
            return None
        if self.is_deepspeed_enabled or self.is_fsdp_enabled:
            # ZeRO-3/FSDP gather parameters inside every forward; stock `generate` keeps the ranks in step
            # (`synced_gpus`), the lean loop stops as soon as the local rows finish.
            if args.sampling_weights_dtype is not None:
                raise ValueError("sampling_weights_dtype is not supported with DeepSpeed or FSDP")
            return None
        dtype = getattr(torch, args.sampling_weights_dtype) if args.sampling_weights_dtype else None
        return FastSampler(weights_dtype=dtype)

    def _generate_single_turn(self, *args, **kwargs):
        """Sample in eval mode (no dropout, no MoE load-balancing loss at every decoding step), through the lean
        sampler when it applies."""
        was_training = self.model.training
        self.model.eval()
        sampling = self._sampler.patch(self.accelerator.unwrap_model(self.model)) if self._sampler else nullcontext()
        try:
            with sampling:
                return super()._generate_single_turn(*args, **kwargs)
        finally:
            self.model.train(was_training)

    # --- advantages ------------------------------------------------------------------------------------

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._rewards_per_func = rewards_per_func  # gathered over processes; read back just below
        return rewards_per_func

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        mode = "train" if self.model.training else "eval"
        rewards_per_func, self._rewards_per_func = self._rewards_per_func, None
        if self.args.advantage_estimator == "minimind":
            if rewards_per_func is None:
                raise RuntimeError("the rewards of this batch did not go through `_calculate_rewards`")
            output["advantages"] = self._minimind_advantages(rewards_per_func, len(output["advantages"]), mode)
        all_advantages = self.accelerator.gather(output["advantages"])
        if self.args.advantage_estimator == "minimind":  # the completions table shows the advantages trained on
            logged = self._logs["advantages"]
            for _ in range(min(len(all_advantages), len(logged))):
                logged.pop()
            logged.extend(all_advantages.tolist())
        self._metrics[mode]["advantages/mean"].append(all_advantages.mean().item())
        self._metrics[mode]["advantages/std"].append(
            all_advantages.std().item() if all_advantages.numel() > 1 else 0.0
        )
        return output

    def _minimind_advantages(self, rewards_per_func: torch.Tensor, num_local: int, mode: str) -> torch.Tensor:
        """The seed's advantages for this process: group z-scores over the gathered batch (a group may span
        processes), batch re-normalisation over this process's slice (the seed normalised per rank)."""
        num_generations = self.num_generations if mode == "train" else self.num_generations_eval
        weights = self.reward_weights.to(rewards_per_func.device)
        rewards = (rewards_per_func * weights.unsqueeze(0)).nansum(dim=1)  # TRL's weighted sum
        rewards[torch.isnan(rewards_per_func).all(dim=1)] = torch.nan  # no function could score the row
        stage_one = group_zscore(rewards, num_generations)
        start = self.accelerator.process_index * num_local
        return batch_renormalize(stage_one[start : start + num_local])

    # --- loss ------------------------------------------------------------------------------------------

    def _compute_loss(self, model, inputs):
        """TRL's loss plus MiniMind's MoE load-balancing loss, read from the policy forward that made the log-probs."""
        if not self._adds_model_aux_loss:
            return super()._compute_loss(model, inputs)
        with self._captured_aux_losses() as aux_losses, self._attending_past_eos():
            loss = super()._compute_loss(model, inputs)
        if not aux_losses:  # the backbone carries no `aux_loss` (not a MiniMind model)
            return loss
        aux_loss = torch.stack(aux_losses).mean()
        mode = "train" if self.model.training else "eval"
        normalizer = self.current_gradient_accumulation_steps if mode == "train" else 1.0  # like TRL's policy loss
        loss = loss + self.args.moe_aux_loss_weight * aux_loss.to(loss.dtype) / normalizer
        self._metrics[mode]["aux_loss"].append(self.accelerator.gather(aux_loss.detach()).mean().item())
        return loss

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, *args, **kwargs):
        if self._past_eos_attended:
            # completion positions all visible, as in the seed's mask-free forward (see `_attending_past_eos`)
            attention_mask = attention_mask.clone()
            attention_mask[:, -logits_to_keep:] = 1
        return super()._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, logits_to_keep, *args, **kwargs
        )

    @contextmanager
    def _attending_past_eos(self):
        """Inside the block, the policy forward attends to the padding after each completion's first EOS.

        The seed's loss forward passes no attention mask. Causal attention keeps the log-probs of real completion
        tokens independent of what follows them, so only MiniMind's MoE load-balancing loss, which upstream takes
        over every position, sees the difference: with TRL's mask the padded positions' hidden states (and so their
        routing) differ from the seed's. Prompt padding stays masked (a documented deviation).
        """
        self._past_eos_attended = True
        try:
            yield
        finally:
            self._past_eos_attended = False

    @contextmanager
    def _captured_aux_losses(self):
        """Collect `aux_loss` from every forward of the policy's backbone inside the block (the loss's own)."""
        policy = self.accelerator.unwrap_model(self.model)
        policy = policy.get_base_model() if is_peft_model(policy) else policy
        captured = []

        def keep_aux_loss(module, args, output):
            aux_loss = getattr(output, "aux_loss", None)
            if aux_loss is not None:
                captured.append(aux_loss)

        handle = policy.base_model.register_forward_hook(keep_aux_loss)
        try:
            yield captured
        finally:
            handle.remove()


__all__ = ["MiniMindGRPOConfig", "MiniMindGRPOTrainer", "minimind_advantages"]
