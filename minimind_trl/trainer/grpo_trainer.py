"""`MiniMindGRPOTrainer`: MiniMind's GRPO on TRL, the one trainer the CLI and Python users construct.

The trainer is TRL's `GRPOTrainer` (generation, rewards, accelerate/DeepSpeed, PEFT, vLLM, logging and
checkpoints stay TRL's) with upstream MiniMind's arithmetic where the two differ: advantages from a registered
estimator (`advantages`), policy losses from a registered function and aggregation mode (`policy_losses`,
`loss_aggregation`; TRL's own loss types run TRL's code), log-probs scored at temperature 1 (`fast_logprobs`),
the MoE load-balancing loss of the policy forward, and prompts cut to their last `max_prompt_length` tokens.
Around training it adds what a run needs to be trusted: checkpoints that appear only when complete, the prompt order of every epoch reproducible
on resume (`checkpointed_training`), the run's model card section (`model_card`) and, with `save_native_pth`,
upstream's native `.pth` at every save.

Where to find upstream's `train_grpo.py` here: rollouts `_generate_single_turn` (sampler: `fast_sampling`),
rewards `_calculate_rewards` (functions: `minimind_trl.rewards`), advantages `_advantages` (on the rewards of
`_scored`), loss and k3 KL `_compute_loss` (TRL's for its loss types, `_registered_policy_loss` for the
registered ones such as MiniMind-3's, + the MoE aux loss), old log-probs `_old_per_token_logps`, saving
`_save_checkpoint` (in `checkpointed_training`, with the guarded run, staged saves and the epoch's prompt order).
Every private member of TRL's overridden or read here is listed in `trl_private.PRIVATE_MEMBERS`.
"""

import inspect
import os
from contextlib import contextmanager, nullcontext
from types import MappingProxyType

import torch
from accelerate.utils import is_peft_model
from trl import GRPOTrainer

from ..errors import RecipeError
from .algorithm.advantages import TRL_ADVANTAGES, estimate_advantages, minimind_advantages
from .outputs.checkpointed_training import CheckpointedTraining
from .checks.reward_checks import check_trainer_arguments, check_weighted_rewards, checked_reward_funcs
from .outputs.run_identity import trainer_run_identity
from .outputs.output_dir import reward_model_sources, run_inputs
from .algorithm.dynamic_sampling import refill
from .checks.trainer_settings import trainer_settings
from .speed import cpu_precision
from .speed.compiled_generation import compile_generation
from .speed.fast_sampling import FastSampler
from .grpo_config import MiniMindGRPOConfig
from .algorithm.loss_aggregation import LossScale, aggregate, effective_loss_aggregation
from .outputs.model_card import RunCard, describe_run, extend_model_card, render_run_section
from .algorithm.policy_losses import TRL_LOSS_TYPES, PolicyLossInputs, compute_policy_loss, k3_kl, loss_metric_values
from .algorithm.policy_losses import check_loss_kwargs, upto_first_eos_mask
from .speed.prompt_sharing import shares_prompts, with_shared_prompt
from .rollouts.tool_loop_checks import record_unanswered_calls
from .fsdp_launch import shard_on_cpu
from .trl_overrides import completions_as_text, reference_copy, trl_init_overrides
from .rollouts.vllm_rollouts import check_server_logprobs_mode, reload_layerwise_on_cpu, shut_down_engine


class MiniMindGRPOTrainer(CheckpointedTraining, GRPOTrainer):
    """TRL's `GRPOTrainer` computing MiniMind's GRPO: upstream's advantages and losses (by name, from the
    registries), untempered log-probs, the MoE load-balancing loss of the policy forward, prompts cut from the left
    and generation in eval mode.

    Takes `GRPOTrainer`'s arguments; `args` must be a [`MiniMindGRPOConfig`]. `model` may be a path, a Hub id
    or an in-memory model; for the latter the frozen reference is a copy of the object itself. `run_card`
    describes the run in the model card (`minimind-trl grpo` passes the recipe's); by default it is built from
    the arguments given here. `run_identity` adds to (or corrects) what the trainer records as defining the run
    (`run_identity.trainer_run_identity`: policy, tokenizer, rewards, data), which a resume must not change;
    `minimind-trl grpo` adds the recipe's data and reward options.
    """

    _tag_names = ["trl", "grpo", "minimind"]
    _refill_step = None  # dynamic sampling: the optimizer step and generation count its refill prompts key on
    _refill_count = 0
    _shares_prompts = False  # the log-prob passes compute each prompt once per group (`prompt_sharing`)
    _compiles_generation = False  # rollouts through the static cache and a compiled forward (`compile_generation`)

    def __init__(
        self,
        model,
        reward_funcs=None,
        args: MiniMindGRPOConfig | None = None,
        *trl_args,
        run_card: RunCard | None = None,
        run_identity: dict | None = None,
        **trl_kwargs,
    ):
        given = inspect.signature(GRPOTrainer.__init__).bind(self, model, reward_funcs, args, *trl_args, **trl_kwargs)
        check_trainer_arguments(model, reward_funcs, given.arguments.get("environment_factory"))
        if args is None:
            name = model if isinstance(model, str) else getattr(model.config, "_name_or_path", "") or "MiniMind"
            args = MiniMindGRPOConfig(f"{name.rstrip('/').split('/')[-1]}-GRPO")
        if not isinstance(args, MiniMindGRPOConfig):
            raise TypeError(f"args must be a MiniMindGRPOConfig, got {type(args).__name__}")
        bound = inspect.signature(GRPOTrainer.__init__).bind(self, model, reward_funcs, args, *trl_args, **trl_kwargs)
        datasets = bound.arguments.get("train_dataset"), bound.arguments.get("eval_dataset")
        settings = trainer_settings(model, args, *datasets)  # checked and derived once
        peft_config = bound.arguments.get("peft_config")
        uses_peft = peft_config is not None or (not isinstance(model, str) and is_peft_model(model))
        reference = None
        if not isinstance(model, str) and args.beta != 0.0 and not uses_peft:
            reference = reference_copy(model)
        with trl_init_overrides(settings.scoring_temperature, reference, settings.vllm_engine_kwargs):
            super().__init__(model, reward_funcs, args, *trl_args, **trl_kwargs)
        if settings.missing_after_trl is not None:
            raise RecipeError(settings.missing_after_trl)
        completions_as_text(self)  # MiniMind's rewards score the whole decoded completion (see trl_overrides)
        if self.use_vllm:
            reload_layerwise_on_cpu(self.vllm_generation)
        if self.use_vllm and self.vllm_mode == "server" and settings.server_logprobs_mode is not None:
            if self.accelerator.is_main_process:
                server_info = self.vllm_generation.vllm_client.get_server_info()
                check_server_logprobs_mode(server_info["model_config"]["logprobs_mode"], settings.server_logprobs_mode)
        # TRL's own MoE aux path is Mixtral's (router logits). MiniMind has no router-logits output and returns its
        # loss on the backbone output instead, but its config names the coefficient `router_aux_loss_coef`, and an
        # `output_router_logits` attribute left on it (TRL's SFTTrainer sets one) would switch TRL's path on.
        if getattr(self.model.config, "model_type", None) == "minimind":
            self.aux_loss_enabled = False
        self._adds_model_aux_loss = not self.aux_loss_enabled and args.moe_aux_loss_weight != 0.0
        self._registered_loss = args.loss_type not in TRL_LOSS_TYPES
        self._loss_kwargs = MappingProxyType(check_loss_kwargs(args))  # the loss's declared defaults + the recipe's
        self._rewards_per_func = None
        self._past_eos_attended = False
        self._shares_prompts = shares_prompts(self)
        self._compiles_generation = compile_generation(self)
        self._sampler = self._fast_sampler()
        self.run_card = run_card if run_card is not None else self._default_run_card(model, peft_config)
        known = trainer_run_identity(
            model, reward_funcs, self.reward_func_names, self.processing_class, self.train_dataset, self.rollout_func,
            self.eval_dataset if args.eval_strategy != "no" else None,
        ) | settings.seam_identity
        self.run_identity = {**known, **(run_identity or {})}
        tokenizer = getattr(self.processing_class, "name_or_path", None)
        self._run_inputs = run_inputs(self.run_identity, tokenizer, reward_model_sources(reward_funcs))

    def create_accelerator_and_postprocess(self):
        """transformers' accelerator, sharded with FSDP2 on CPU too when the launch asks for FSDP (accelerate does so
        only on accelerators: `fsdp_launch.shard_on_cpu`)."""
        super().create_accelerator_and_postprocess()
        if shard_on_cpu(self.accelerator):
            self.is_fsdp_enabled = True

    # --- prompts and generation ------------------------------------------------------------------------

    def _tokenize_prompts(self, prompts: list):
        """TRL's tokenization, then each prompt cut to its last `max_prompt_length` tokens (upstream's cut)."""
        prompt_ids, images, multimodal_fields = super()._tokenize_prompts(prompts)
        limit = self.args.max_prompt_length
        if limit is not None and any(len(ids) > limit for ids in prompt_ids):
            if images is not None or multimodal_fields:
                raise ValueError(
                    f"max_prompt_length={limit} would cut image tokens out of a multimodal prompt; set it to None"
                )
            prompt_ids = [ids[-limit:] for ids in prompt_ids]
        return prompt_ids, images, multimodal_fields

    def _fast_sampler(self) -> FastSampler | None:
        """The lean sampler, where it applies (transformers generation on unpartitioned weights): decided after
        TRL's constructor, which knows whether DeepSpeed or FSDP partitions them."""
        args = self.args
        if not args.fast_sampling or self.use_vllm or args.use_transformers_continuous_batching:
            return None
        if self._compiles_generation:  # stock `generate` compiles; the lean loop would step aside at every call
            return None
        if self.is_deepspeed_enabled or self.is_fsdp_enabled:
            # ZeRO-3/FSDP gather parameters inside every forward; stock `generate` keeps the ranks in step
            # (`synced_gpus`), the lean loop stops as soon as the local rows finish.
            if args.sampling_weights_dtype not in (None, "auto"):
                raise RecipeError(f"sampling_weights_dtype: {args.sampling_weights_dtype} is the lean sampler's, which "
                                  "DeepSpeed and FSDP runs do not use; leave it unset")
            return None
        sampler = FastSampler()
        if args.sampling_weights_dtype == "auto":  # bf16 decode GEMMs only through the kernel (see the config)
            kernel = sampler.kernel_applies(self.accelerator.unwrap_model(self.model))  # MiniMind on CPU
            if args.bf16 and kernel and cpu_precision.machine_choice().bf16:
                sampler.weights_dtype = torch.bfloat16
        elif args.sampling_weights_dtype is not None:
            sampler.weights_dtype = getattr(torch, args.sampling_weights_dtype)
        return sampler

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

    def _tool_call_loop(self, prompts, *args, **kwargs):
        """TRL's tool loop, then the calls it left unanswered logged and warned about (`tool_loop_checks`)."""
        result = super()._tool_call_loop(prompts, *args, **kwargs)
        record_unanswered_calls(self, result[1])
        return result

    # --- advantages ------------------------------------------------------------------------------------

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        with checked_reward_funcs(self, len(prompts)):  # one clear error naming the function and the step
            rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        check_weighted_rewards(self, rewards_per_func)  # finite rewards whose weighted sum overflows
        self._rewards_per_func = rewards_per_func  # gathered over processes; read back just below
        return rewards_per_func

    def _generate_and_score_completions(self, inputs):
        mode = "train" if self.model.training else "eval"
        row_round = None
        if self.args.dynamic_sampling and mode == "train":
            output, row_round = self._dynamically_sampled(inputs)
        else:
            output, rewards = self._scored(inputs, mode)
            if rewards is not None:
                output["advantages"] = self._advantages(rewards, mode)[self._local_rows(len(output["advantages"]))]
        all_advantages = self.accelerator.gather(output["advantages"])
        if self.args.advantage_estimator != TRL_ADVANTAGES:  # the completions table shows the advantages trained on
            values = all_advantages
            if row_round is not None:  # one table row per generated completion: NaN for the groups not kept
                rounds = range(int(row_round.max()) + 1)
                values = torch.cat([all_advantages.where(row_round == r, torch.nan) for r in rounds])
            logged = self._logs["advantages"]
            for _ in range(min(len(values), len(logged))):
                logged.pop()
            logged.extend(values.tolist())
        self._metrics[mode]["advantages/mean"].append(all_advantages.mean().item())
        self._metrics[mode]["advantages/std"].append(
            all_advantages.std().item() if all_advantages.numel() > 1 else 0.0
        )
        return output

    def _local_rows(self, num_local: int) -> slice:
        start = self.accelerator.process_index * num_local
        return slice(start, start + num_local)

    def _scored(self, inputs, mode: str):
        """TRL's generation and scoring, and with a registered advantage estimator the gathered rewards its
        advantages come from (`_weighted_rewards`), else None."""
        output = super()._generate_and_score_completions(inputs)
        rewards_per_func, self._rewards_per_func = self._rewards_per_func, None
        if self.args.advantage_estimator == TRL_ADVANTAGES:
            return output, None
        if rewards_per_func is None:
            raise RuntimeError("the rewards of this batch did not go through `_calculate_rewards`")
        return output, self._weighted_rewards(rewards_per_func)

    def _weighted_rewards(self, rewards_per_func: torch.Tensor) -> torch.Tensor:
        """TRL's weighted sum of the reward functions per completion; NaN where no function could score it."""
        weights = self.reward_weights.to(rewards_per_func.device)
        rewards = (rewards_per_func * weights.unsqueeze(0)).nansum(dim=1)
        rewards[torch.isnan(rewards_per_func).all(dim=1)] = torch.nan
        return rewards

    def _advantages(self, rewards: torch.Tensor, mode: str) -> torch.Tensor:
        """The configured estimator's advantages for the gathered batch (`rewards` from `_weighted_rewards`, NaN
        where unscorable), through `advantages.estimate_advantages`: no NaN in, checked out, 0 for unscorable rows."""
        num_generations = self.num_generations if mode == "train" else self.num_generations_eval
        process_rows = rewards.numel() // self.accelerator.num_processes
        return estimate_advantages(self.args.advantage_estimator, rewards, num_generations, process_rows)

    def _dynamically_sampled(self, inputs):
        """The generation batch with its groups without spread replaced (`dynamic_sampling.refill`)."""
        return refill(self, inputs)

    # --- loss ------------------------------------------------------------------------------------------

    def _compute_loss(self, model, inputs):
        """The policy loss (TRL's for its loss types, else `_registered_policy_loss`) plus MiniMind's MoE
        load-balancing loss, read from the policy forward that made the log-probs."""
        policy_loss = self._registered_policy_loss if self._registered_loss else super()._compute_loss
        if not self._adds_model_aux_loss:
            return policy_loss(model, inputs)
        with self._captured_aux_losses() as aux_losses, self._attending_past_eos():
            loss = policy_loss(model, inputs)
        if not aux_losses:
            if getattr(self.model.config, "model_type", None) != "minimind":
                return loss  # no MiniMind backbone: no aux loss to add or log
            # MiniMind sets `aux_loss` only for MoE in training mode; upstream logs 0 for dense models (and eval)
            aux_losses = [loss.new_zeros((), dtype=torch.float32)]
        aux_loss = torch.stack(aux_losses).mean()
        mode = "train" if self.model.training else "eval"
        normalizer = self.current_gradient_accumulation_steps if mode == "train" else 1.0  # like TRL's policy loss
        loss = loss + self.args.moe_aux_loss_weight * aux_loss.to(loss.dtype) / normalizer
        self._metrics[mode]["aux_loss"].append(self.accelerator.gather(aux_loss.detach()).mean().item())
        return loss

    def _registered_policy_loss(self, model, inputs):
        """A registered `loss_type` on one micro-batch: the policy's log-probs, the completion mask through the first
        EOS, the per-token loss of the registered function, `beta` x k3 KL, then `loss_aggregation`'s scalar."""
        if any(key in inputs for key in ("pixel_values", "image_grid_thw", "num_images", "token_type_ids")):
            raise ValueError(f"loss_type {self.loss_type!r} (a registered policy loss) supports text-only batches")
        completion_ids = inputs["completion_ids"]
        input_ids = torch.cat([inputs["prompt_ids"], completion_ids], dim=1)
        attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        per_token_logps, entropies, _ = self._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, completion_ids.size(1), compute_entropy=True
        )
        mask = self._loss_mask(inputs)
        old_per_token_logps = self._old_per_token_logps(inputs, per_token_logps)
        advantages = inputs["advantages"]
        batch = PolicyLossInputs(
            per_token_logps=per_token_logps,
            old_per_token_logps=old_per_token_logps,
            advantages=advantages.unsqueeze(1) if advantages.dim() == 1 else advantages,
            mask=mask,
            epsilon=self.epsilon_low,
            epsilon_high=self.epsilon_high,
            entropies=entropies,
            ref_per_token_logps=inputs.get("ref_per_token_logps"),  # TRL computes them only when beta != 0
            loss_kwargs=self._loss_kwargs,
        )
        per_token_loss, loss_metrics = compute_policy_loss(self.loss_type, batch)
        if "importance_sampling_ratio" in inputs:  # TRL's vLLM correction, applied as TRL applies it to its losses
            per_token_loss = per_token_loss * inputs["importance_sampling_ratio"]
        mode = "train" if self.model.training else "eval"
        if self.beta != 0.0:
            per_token_kl = k3_kl(inputs["ref_per_token_logps"], per_token_logps)
            if self.args.use_bias_correction_kl:
                per_token_kl = per_token_kl * batch.ratio
            per_token_loss = per_token_loss + self.beta * per_token_kl
            self._metrics[mode]["kl"].append(self._global_masked_mean(per_token_kl, mask))
        self._metrics[mode]["entropy"].append(self._global_masked_mean(entropies, mask))
        for key, value in loss_metric_values(loss_metrics, mask, self.accelerator).items():  # beside TRL's
            self._metrics[mode][key].append(value)
        aggregation = effective_loss_aggregation(self.loss_type, self.args.loss_aggregation)
        return aggregate(aggregation, per_token_loss, mask, self._loss_scale(inputs, mode))

    def _loss_mask(self, inputs) -> torch.Tensor:
        """The completion tokens a registered loss counts: up to and including the first EOS inside the rollout's
        own mask (TRL's `completion_mask`, times `tool_mask` when tools ran), and only there (MiniMind-3's rule)."""
        rollout_mask = inputs["completion_mask"]
        if "tool_mask" in inputs:
            rollout_mask = rollout_mask * inputs["tool_mask"]
        return upto_first_eos_mask(inputs["completion_ids"], rollout_mask, self.eos_token_ids)

    def _old_per_token_logps(self, inputs, per_token_logps: torch.Tensor) -> torch.Tensor:
        """The log-probs of the policy that produced the rollout. With vLLM rollouts: vLLM's own, returned with each
        sampled token (TRL's `sampling_per_token_logps`, on the trainer's scale: `vllm_rollouts.logprobs_mode`), as
        upstream MiniMind-3 takes SGLang's; likewise those a `rollout_func` returns (the agent rollout passes on its
        generation step's); a position without one (NaN) falls back as below. Otherwise TRL's
        `old_per_token_logps` when it computed them (`num_iterations > 1`, generation misaligned with optimizer
        steps), else the current ones detached (the batch is on-policy: ratio 1 in value)."""
        old = inputs.get("old_per_token_logps")
        old = per_token_logps.detach() if old is None else old
        rollout_engine = self.use_vllm or self.rollout_func is not None
        sampling = inputs.get("sampling_per_token_logps") if rollout_engine else None
        return old if sampling is None else torch.where(torch.isnan(sampling), old, sampling)

    def _loss_scale(self, inputs, mode: str) -> LossScale:
        """The normalisers of the aggregation modes, as TRL's `_compute_loss` computes them for its loss types."""
        accumulation_steps = self.current_gradient_accumulation_steps if mode == "train" else 1.0
        window_tokens = inputs["num_items_in_batch"].clamp(min=1.0) / self.accelerator.num_processes
        if mode == "train":
            window_tokens = window_tokens * self.current_gradient_accumulation_steps / self.args.steps_per_generation
        return LossScale(accumulation_steps, window_tokens, self.max_completion_length)

    def _global_masked_mean(self, values: torch.Tensor, mask: torch.Tensor) -> float:
        """The mean of `values` over the masked tokens of every process (TRL's logging of `kl` and `entropy`)."""
        local = torch.stack([(values * mask).sum(), mask.sum().float()])
        total = self.accelerator.reduce(local.detach(), reduction="sum")
        return (total[0] / total[1].clamp(min=1.0)).item()

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, *args, **kwargs):
        if self._past_eos_attended:
            # completion positions all visible, as in upstream's mask-free forward (see `_attending_past_eos`)
            attention_mask = attention_mask.clone()
            attention_mask[:, -logits_to_keep:] = 1
        if self._shares_prompts:  # each prompt computed once per group (`prompt_sharing`)
            model = with_shared_prompt(model, input_ids, logits_to_keep)
        return super()._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, logits_to_keep, *args, **kwargs
        )

    @contextmanager
    def _attending_past_eos(self):
        """Inside the block, the policy forward attends to the padding after each completion's first EOS.

        Upstream's loss forward passes no attention mask. Causal attention keeps the log-probs of real completion
        tokens independent of what follows them, so only MiniMind's MoE load-balancing loss, which upstream takes
        over every position, sees the difference: with TRL's mask the padded positions' hidden states (and so their
        routing) differ from upstream's. Prompt padding stays masked (a documented deviation).
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


    # --- model card ------------------------------------------------------------------------------------

    def _default_run_card(self, model, peft_config) -> RunCard:
        """What the trainer itself knows about the run: base model, reward functions and weights, PEFT, settings."""
        named = getattr(model.config, "_name_or_path", "") if not isinstance(model, str) else model
        base_model = named or "in-memory model"
        return describe_run(
            base_model,
            self.args,
            peft_config=peft_config,
            reward_funcs=list(self.reward_func_names),
            reward_weights=self.reward_weights.tolist(),
        )

    def create_model_card(self, model_name=None, dataset_name=None, tags=None):
        """TRL's card, plus the MiniMind GRPO section (recipe, rewards, final metrics, upstream parity)."""
        super().create_model_card(model_name=model_name, dataset_name=dataset_name, tags=tags)
        if not self.is_world_process_zero():
            return
        location = self.hub_model_id or self.args.output_dir  # where the card's code loads the model from
        section = render_run_section(self.run_card, self.state.log_history, location)
        readme = os.path.join(self.args.output_dir, "README.md")
        extend_model_card(readme, section, self.run_card.base_model, location)

    def end(self):
        """transformers' end of a script (trackers, process group), after stopping a colocated vLLM engine, which
        must tear down its process groups while the default one still exists (see `vllm_rollouts`)."""
        llm = getattr(getattr(self, "vllm_generation", None), "llm", None)
        if llm is not None:
            shut_down_engine(llm)
        super().end()


__all__ = ["MiniMindGRPOConfig", "MiniMindGRPOTrainer", "minimind_advantages"]
