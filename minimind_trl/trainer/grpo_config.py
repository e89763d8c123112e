"""`MiniMindGRPOConfig`: TRL's `GRPOConfig` with upstream MiniMind's `train_grpo.py` defaults and the switches
MiniMind's GRPO needs. Each field documents the upstream flag it stands for.
"""

import math
import os
from dataclasses import dataclass, field

from trl import GRPOConfig

from ..errors import RecipeError, RewardSpecError
from ..generations import TRAINING, UPSTREAMS, RunPrecision, get_generation, render_generations_table
from .algorithm.advantages import TRL_ADVANTAGES
from .checks.config_ranges import check_ranges, warn_loss_options
from .checks.extras import require_deepspeed_extra
from .fsdp_launch import check_fsdp_launch
from .speed.compiled_generation import check_compile_generation
from .speed.cpu_precision import choose_bf16, runs_on_cpu
from .algorithm.loss_aggregation import effective_loss_aggregation
from .algorithm.policy_losses import check_loss_kwargs, loss_option_problems
from .algorithm.seam_choice import check_seam_choices

SAMPLING_WEIGHTS_DTYPES = ("auto", "bfloat16", "float16")  # or None


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
            the generation prompt `<|im_start|>assistant\n` survives). Upstream: `--max_seq_len 66`. `None` keeps
            whole prompts. TRL 1.16 itself has no prompt truncation.
        advantage_estimator (`str`, *optional*, defaults to `"minimind"`):
            An estimator registered with `register_adv_est` (`minimind_trl.trainer.algorithm.advantages`), or `"trl"`: TRL's
            own advantages (`scale_rewards`, `multi_objective_aggregation`). `"minimind"`: the seed's (see
            [`minimind_advantages`]): per-group z-score with the unbiased std + 1e-4, clamped to [-10, 10], then
            re-normalised over the process-local generation batch. `"group_zscore"`: MiniMind-3's, the per-group
            z-score with the population std + 1e-4, no clamp, no batch step. Any importable
            `package.module:function` works too (imported and registered when the config is built). With a
            registered estimator `scale_rewards` and `multi_objective_aggregation` must keep their defaults, since
            they would have no effect.
        loss_aggregation (`str` or `None`, *optional*, defaults to `None`):
            For a registered `loss_type`, how its per-token losses become the loss (a mode of
            `minimind_trl.trainer.algorithm.loss_aggregation`): `"seq-mean-token-mean"` (`None`; upstream's, both generations:
            each completion's masked token mean, then the mean), `"token-mean"` (TRL's `dapo`/`cispo`: over the
            tokens of the accumulated batch), `"local-token-mean"` (`bnpo`), `"seq-mean-token-sum-norm"`
            (`dr_grpo`), `"seq-mean-token-sum"` (`luspo`). TRL's loss types aggregate their own way: leave it unset.
        loss_kwargs (`dict` or `None`, *optional*, defaults to `None`):
            A registered `loss_type`'s own keyword arguments (e.g. `{"entropy_coef": 0.01}`; JSON on the command
            line), which it receives as `PolicyLossInputs.loss_kwargs` over the defaults it declared. A key it does
            not declare, a value of another type or outside its range is refused naming the key.
        upstream (`str` or `None`, *optional*, defaults to `None`):
            The upstream generation the run follows: a name of `minimind_trl.generations.UPSTREAMS` (the
            generations of the table below, or `"trl"`: TRL's own `GRPOConfig` defaults). It sets no value itself: the model
            card's parity table compares the run against it (`None`: against `minimind2`, whose defaults these
            are) and `minimind-trl grpo` lists where a recipe setting it departs from that generation.
            [`~MiniMindGRPOConfig.trl_defaults`] builds a config with TRL's defaults (and `upstream="trl"`).
        tempered_logprobs (`bool`, *optional*, defaults to `False`):
            Score the loss's log-probs at the sampling `temperature` (TRL's behaviour). Off by default: upstream
            samples at 0.8 but scores with untempered logits. With `use_vllm` it also chooses the log-probs vLLM
            returns with each token (`sampling_per_token_logps`): over the raw logits when off (vLLM's
            `raw_logprobs`), at the sampling temperature after top-k/top-p when on (`processed_logprobs`), so
            `vllm_importance_sampling_correction` compares log-probs on the trainer's own scale either way.
        fast_sampling (`bool`, *optional*, defaults to `True`):
            Sample rollouts with [`~minimind_trl.trainer.speed.fast_sampling.FastSampler`]: temperature + top-k drawn
            among the k candidates only (the distribution `generate` samples from), no logits-processor chain; for
            MiniMind models the decoding steps run through [`~minimind_trl.trainer.speed.decode_kernel.DecodeKernel`]
            (fused q|k|v and gate|up weights, in-place KV cache). Settings it does not implement fall back to
            `generate`. Not used under ZeRO-3/FSDP (stock `generate` keeps the ranks' forwards in step) nor with
            vLLM.
        sampling_weights_dtype (`str` or `None`, *optional*, defaults to `"auto"`):
            With `fast_sampling`, the dtype of the GEMM weights the rollouts decode with, packed from the policy at
            every generation. `"auto"`: `"bfloat16"` when training in bf16 (upstream's `--dtype bfloat16`, under
            which its GPU rollouts ran bf16 GEMMs), the decode kernel applies (MiniMind on CPU) and this CPU
            computes bf16 natively (the choice `bf16` unset makes, see `bf16`), the policy's own dtype otherwise,
            so `bf16: false` samples in exact fp32. `None`: always the policy's dtype. The loss always scores the
            real weights; the measured difference is in docs/deviations.md#bf16-numerics and
            `benchmarks/bf16_sampling.py`.
        save_native_pth (`bool`, *optional*, defaults to `False`):
            Also write the weights as upstream MiniMind's native state dict (`grpo_<hidden_size>[_moe].pth`, fp16)
            in every checkpoint and in `output_dir` at the end, like upstream's `--save_weight grpo`, for
            MiniMind's own scripts. A LoRA run (`use_peft`, `peft_config`) writes the merged model there: the base
            it loaded with the saved adapter folded in.
        dynamic_sampling (`bool`, *optional*, defaults to `False`):
            Replace groups without spread (all completions rewarded alike: advantage 0) by groups generated for
            further prompts drawn from the training set (DAPO's dynamic sampling; see
            `minimind_trl.trainer.algorithm.dynamic_sampling`). Logs `dynamic_sampling/zero_spread_before`, `.../after` and
            `.../extra_completions`. Upstream has none, so it is off by default.
        max_resample_rounds (`int`, *optional*, defaults to `3`):
            With `dynamic_sampling`, the most extra generation rounds spent on one generation batch.
        share_prompts (`bool` or `None`, *optional*, unset by default: on where the policy trains on the CPU):
            For MiniMind policies, compute each prompt once per group in the log-prob passes the trainer owns (the
            policy forward with gradient, the reference forward, TRL's old-log-prob pass), its G completions
            attending to its keys and values (`minimind_trl.trainer.speed.prompt_sharing`). Groups are found by content;
            rows whose prompts differ are computed row by row. Log-probs, gradients and the MoE loss equal the
            unshared passes' up to summation order (docs/deviations.md); a resume may switch it. Upstream computes
            every prompt G times. Unset: on CPU, off on GPUs (where at MiniMind's sizes kernel launches, not FLOPs,
            set the time: measured slower in bf16); `true` everywhere it applies; never with DeepSpeed ZeRO-3 or
            FSDP (said once in the log).
        compile_generation (`str` or `None`, *optional*, unset by default):
            Rollouts through transformers' static KV cache and a forward compiled in this torch.compile mode
            (`"reduce-overhead"`: CUDA graphs), which TRL's trainer never enables (`speed.compiled_generation`).
            Unset: the lean sampler, or stock `generate`. Not with vLLM, continuous batching, activation
            checkpointing, ZeRO-3 or FSDP.
        moe_aux_loss_weight (`float`, *optional*, defaults to `1.0`):
            Weight of the model's own MoE load-balancing loss (MiniMind's `aux_loss`, already scaled by the
            model config's `router_aux_loss_coef`), taken from the same forward that computes the policy
            log-probs. Upstream: implicit weight 1 (`loss = policy_loss + aux_loss`). Dense models return 0.

        > TRL / transformers parameters whose defaults are upstream's

        learning_rate (`float`, defaults to `8e-8`): seed `--learning_rate`.
        lr_scheduler_type (`str`, defaults to `"cosine_with_min_lr"`) and lr_scheduler_kwargs (defaults to
            `{"min_lr_rate": 0.1}` for that scheduler): cosine from the peak to 10 % of it over the run, upstream's
            `CosineAnnealingLR(T_max=total_steps, eta_min=lr / 10)`.
        weight_decay (`float`, defaults to `0.01`): upstream's `torch.optim.AdamW` default. (transformers exempts
            norm weights and biases from decay; upstream decays every parameter.)
        max_grad_norm (`float`, defaults to `1.0`): seed `--grad_clip`.
        num_train_epochs (`float`, defaults to `1`): seed `--epochs`.
        per_device_train_batch_size (`int`, defaults to `16`): completions per device and step, i.e. upstream's
            `--batch_size 2` prompts x `--num_generations 8`.
        gradient_accumulation_steps: seed `--accumulation_steps` (1).
        steps_per_generation (`int`, defaults to `1` unless `generation_batch_size` is set): generate for every
            micro-batch as upstream does, so the advantages' batch normalisation spans one micro-batch per
            process, as in upstream. TRL's default (`gradient_accumulation_steps`) generates once per optimizer
            step instead.
        num_generations (`int`, defaults to `8`): seed `--num_generations`.
        max_completion_length (`int`, defaults to `1536`): seed `--max_gen_len`.
        temperature (`float`, defaults to `0.8`): upstream's hard-coded sampling temperature.
        top_k (`int`, defaults to `50`): upstream never sets it, so it sampled with the transformers 4.x
            generation default `top_k=50` (`top_p=1.0`, which is also TRL's default). TRL's default is `0`
            (disabled); set `top_k: 0` for plain temperature sampling. `-1` (vLLM's "disabled") is taken as `0`,
            so the lean sampler, stock `generate` and vLLM all sample the whole vocabulary; below -1 is refused.
        top_p (`float`, defaults to `1.0`): TRL's default, and the transformers 4.x default the seed sampled with.
        beta (`float`, defaults to `0.02`): seed `--beta`, the weight of the k3 KL to the frozen reference.
        loss_type (`str`, defaults to `"grpo"`): one of TRL's loss types (computed by TRL's own code) or a policy
            loss registered with `register_policy_loss` (`minimind_trl.trainer.algorithm.policy_losses`, aggregated with
            `loss_aggregation`). The seed's is TRL's `"grpo"`: the mean over completions of the masked token mean,
            divided by the accumulation steps (with ratio 1 its clipping never binds). MiniMind-3's are
            `"minimind3_cispo"` (its default) and `"minimind3_grpo"`. Which arithmetic a name gives:
            `"cispo"` (TRL): `-clamp(ratio, max=epsilon_high).detach() * A * logp` summed over the tokens of the
            accumulated batch and divided by their count (like `"dapo"`); `"minimind3_cispo"`: the same token term,
            averaged per completion first (upstream's, `loss_aggregation`); `"grpo"` (TRL): the ratio clipped to
            [1 - epsilon, 1 + epsilon_high], per completion; `"minimind3_grpo"`: clipped to [1 - epsilon, 1 +
            epsilon] (upstream's `epsilon_high` is CISPO's cap only), per completion. Every loss adds
            `beta` x the k3 KL. Any loss type can be used with any advantage estimator.
        num_iterations (`int`, defaults to `1`): one optimisation pass per generation, so the PPO ratio is
            exactly 1 in value and its clipping never binds (upstream has no clipping).
        use_bias_correction_kl (`bool`, defaults to `False`): upstream's KL carries no importance-sampling weight.
        bf16 (`bool` or `None`, *optional*, unset by default: chosen for the machine): bf16 mixed precision
            (autocast, fp32 master weights), upstream's `--dtype bfloat16`. Unset, it is chosen before the Trainer
            is built: on GPUs and other accelerators bf16 (TRL's default, unless `fp16`); on CPU bf16 only where
            the CPU computes bf16 natively (AMX, AVX512-BF16) and a start-up probe finds its GEMMs faster than
            fp32's, fp32 otherwise, with one log line saying which and why (`minimind_trl.trainer.speed.cpu_precision`,
            docs/cpu.md); on a machine without accelerator an automatic bf16 also sets `use_cpu`. `true`/`false`
            are kept as given (an explicit `true` on a CPU where bf16 is many times slower warns once, with the
            measured ratio). As in TRL, an explicit bf16 on a machine without a GPU needs `use_cpu: true`.
        activation_checkpointing / gradient_checkpointing (`bool`, default off): upstream does not recompute
            activations; TRL's default (on) trades a second forward of every layer for memory.
        logging_steps (`float`, defaults to `1`): seed `--log_interval`.
        save_steps (`float`, defaults to `10`): seed `--save_interval`.
        seed (`int`, defaults to `42`): upstream's `setup_seed(42)`.
    """

    _VALID_DICT_FIELDS = GRPOConfig._VALID_DICT_FIELDS + ["loss_kwargs"]  # a command line's JSON becomes a dict

    # MiniMind-specific parameters
    max_prompt_length: int | None = field(
        default=66,
        metadata={
            "help": "Keep only the last `max_prompt_length` tokens of each prompt (left side dropped), like the "
            "upstream's `--max_seq_len`. `None` keeps whole prompts."
        },
    )
    advantage_estimator: str = field(
        default="minimind",
        metadata={
            "help": "A registered advantage estimator or 'trl' (TRL's, with `scale_rewards` and "
            "`multi_objective_aggregation`). 'minimind': the seed's double-normalised advantages (group z-score with "
            "unbiased std + 1e-4, clamp to [-10, 10], then re-normalised over the process-local batch); "
            "'group_zscore': MiniMind-3's (group z-score with the population std + 1e-4, nothing else). Or any "
            "importable 'package.module:function' of AdvantageInputs."
        },
    )
    loss_aggregation: str | None = field(
        default=None,
        metadata={
            "help": "For a registered loss_type: 'seq-mean-token-mean' (None; upstream's per-completion mean), "
            "'token-mean', 'local-token-mean', 'seq-mean-token-sum-norm', 'seq-mean-token-sum' or an importable "
            "'package.module:function'. TRL's loss types aggregate their own way."
        },
    )
    loss_kwargs: dict | str | None = field(
        default=None,
        metadata={
            "help": "A registered loss_type's own keyword arguments, as JSON (e.g. '{\"entropy_coef\": 0.01}'); "
            "checked against what the loss declares (register_policy_loss(name, loss_kwargs=...))."
        },
    )
    upstream: str | None = field(
        default=None,
        metadata={
            "help": f"The upstream generation the run follows ({', '.join(map(repr, UPSTREAMS))}; 'trl': TRL's "
            "GRPOConfig defaults): the model card compares against it and `minimind-trl grpo` lists the recipe's departures from "
            "it. Sets no value (MiniMindGRPOConfig.trl_defaults() sets TRL's)."
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
            "help": "Sample rollouts with minimind_trl.trainer.speed.fast_sampling's lean top-k loop (the same distribution as "
            "`generate`, less per-step overhead; stock `generate` for settings it does not implement). Applies "
            "to transformers generation without ZeRO-3/FSDP; vLLM and continuous batching are unaffected."
        },
    )
    sampling_weights_dtype: str | None = field(
        default="auto",
        metadata={
            "help": "Decode rollouts with GEMM weights in this dtype, packed from the policy every generation "
            "('auto': bfloat16 with bf16 where the MiniMind decode kernel applies and the CPU computes bf16 "
            "natively, else the policy's dtype; "
            "None: the policy's dtype). Halves the bytes read per decoding step. The loss still scores the real "
            "weights. One of auto, bfloat16, float16, None.",
        },
    )
    save_native_pth: bool = field(
        default=False,
        metadata={
            "help": "Also save the weights as upstream MiniMind's native .pth (fp16) in every checkpoint and at the "
            "end, like upstream's --save_weight grpo (a LoRA run: the base with its adapter merged in)."
        },
    )
    share_prompts: bool | None = field(
        default=None,
        metadata={
            "help": "Compute each prompt once per group in the policy, reference and old-log-prob passes (MiniMind "
            "policies; groups found by content). Same log-probs and gradients up to summation order. Unset: on "
            "CPU only (on GPUs at MiniMind's sizes it was measured slower in bf16)."
        },
    )
    compile_generation: str | None = field(
        default=None,
        metadata={
            "help": "Rollouts through transformers' static cache and a forward compiled in this torch.compile mode "
            "(default, reduce-overhead: CUDA graphs, ...). Unset: not compiled."
        },
    )
    moe_aux_loss_weight: float = field(
        default=1.0,
        metadata={
            "help": "Weight of the model's own MoE load-balancing loss (`aux_loss` of the policy forward, already "
            "scaled by the model's `router_aux_loss_coef`). Upstream adds it with weight 1."
        },
    )
    dynamic_sampling: bool = field(
        default=False,
        metadata={
            "help": "Replace groups whose completions all got the same reward (advantage 0, nothing to learn) by "
            "groups generated for further prompts drawn from the training set, up to `max_resample_rounds` extra "
            "generation rounds per batch (DAPO's dynamic sampling). Off by default: upstream has none."
        },
    )
    max_resample_rounds: int = field(
        default=3,
        metadata={
            "help": "With `dynamic_sampling`, the most extra generation rounds (each a whole generation batch) "
            "spent refilling one batch; slots still without spread then keep their group, with advantage 0."
        },
    )

    overwrite_output_dir: bool = field(
        default=False,
        metadata={
            "help": "Start a new run in an output_dir that holds another run's checkpoint-N folders, deleting them "
            "(refused otherwise: a later `resume_from_checkpoint last` would continue the other run)."
        },
    )
    accept_inexact_resume: bool = field(
        default=False,
        metadata={
            "help": "Resume from a checkpoint that lacks optimizer, scheduler or RNG state (refused otherwise): "
            "training continues with fresh state and no longer matches an uninterrupted run."
        },
    )

    # TRL / transformers parameters with upstream's defaults
    bf16: bool | None = field(
        default=None,
        metadata={
            "help": "bf16 mixed precision (upstream's --dtype bfloat16). Unset: chosen for the machine, bf16 on GPUs, "
            "on CPU only where bf16 is native and faster than fp32 (a start-up probe; docs/cpu.md)."
        },
    )
    learning_rate: float = field(default=8e-8, metadata={"help": "Peak learning rate of AdamW (upstream: 8e-8)."})
    lr_scheduler_type: str = field(
        default="cosine_with_min_lr",
        metadata={"help": "Scheduler; the default decays the lr along a cosine to `min_lr_rate` (0.1) of its peak."},
    )
    weight_decay: float = field(default=0.01, metadata={"help": "AdamW weight decay (torch's AdamW default)."})
    max_grad_norm: float = field(default=1.0, metadata={"help": "Gradient clipping norm (upstream: 1.0)."})
    num_train_epochs: float = field(default=1.0, metadata={"help": "Training epochs (upstream: 1)."})
    per_device_train_batch_size: int = field(
        default=16, metadata={"help": "Completions per device and step: 2 prompts x 8 generations, as in upstream."}
    )
    num_generations: int | None = field(default=8, metadata={"help": "Completions per prompt (upstream: 8)."})
    max_completion_length: int | None = field(default=1536, metadata={"help": "Maximum new tokens (upstream: 1536)."})
    temperature: float = field(default=0.8, metadata={"help": "Sampling temperature (upstream: 0.8)."})
    top_k: int = field(
        default=50,
        metadata={
            "help": "Top-k sampling; 50 is what upstream implicitly used (transformers 4.x default). 0 disables "
            "(-1 too, vLLM's spelling: it becomes 0, so every sampler reads the same value)."
        },
    )
    beta: float = field(default=0.02, metadata={"help": "Weight of the k3 KL to the reference model (upstream: 0.02)."})
    loss_type: str = field(
        default="grpo",
        metadata={
            "help": "A TRL loss type ('grpo': the seed's, mean over completions of the masked token mean; 'dapo', "
            "'cispo', ...) or a registered policy loss ('minimind3_cispo', 'minimind3_grpo': MiniMind-3's, "
            "aggregated per completion) or an importable 'package.module:function' of PolicyLossInputs."
        },
    )
    use_bias_correction_kl: bool = field(
        default=False, metadata={"help": "Weight the KL by the importance-sampling ratio (upstream does not)."}
    )
    # transformers 5.24 renamed it `activation_checkpointing`; None lets either name switch it on (off by default)
    gradient_checkpointing: bool | None = field(
        default=None,
        metadata={"help": "Deprecated alias of `activation_checkpointing`; off unless set, like upstream."},
    )
    logging_steps: float = field(default=1, metadata={"help": "Log every X optimizer steps (upstream: 1)."})
    save_steps: float = field(default=10, metadata={"help": "Save a checkpoint every X optimizer steps (upstream: 10)."})

    def __post_init__(self):
        check_ranges(self)  # every numeric field against its declared range (config_ranges.RANGES), first
        require_deepspeed_extra(self)
        if self.lr_scheduler_type == "cosine_with_min_lr" and self.lr_scheduler_kwargs is None:
            self.lr_scheduler_kwargs = {"min_lr_rate": 0.1}
        if self.steps_per_generation is None and self.generation_batch_size is None:
            self.steps_per_generation = 1
        self._check_sampling_and_weights()
        check_compile_generation(self)
        self._choose_precision()
        super().__post_init__()

        check_fsdp_launch()  # FSDP2 saving whole weights, from the accelerate config
        check_seam_choices(self)  # after `package.module:function` values are imported and registered
        problems = loss_option_problems(self)
        if problems:
            raise ValueError("; ".join(problems))
        check_loss_kwargs(self)  # after super().__post_init__ has read a command line's JSON into a dict
        warn_loss_options(self)
        if self.upstream is not None:
            get_generation(self.upstream)  # a ValueError naming the known generations
        if self.dynamic_sampling:
            if self.advantage_estimator == TRL_ADVANTAGES:
                raise RecipeError(
                    "dynamic_sampling needs a registered advantage_estimator (it computes the refilled batch's "
                    "advantages itself, e.g. minimind or group_zscore), got advantage_estimator: trl"
                )
            if self.use_vllm:
                raise RecipeError("dynamic_sampling is not supported with use_vllm: true")
        if self.use_transformers_continuous_batching and (self.bf16 or self.fp16):
            raise ValueError(
                "use_transformers_continuous_batching with bf16/fp16: TRL 1.16 casts the trainable fp32 policy to the "
                "half dtype in place for that path and never casts it back. Set bf16: false (and fp16: false)."
            )
        if self.sampling_weights_dtype not in (None, "auto") and not self.fast_sampling:
            raise ValueError("sampling_weights_dtype needs fast_sampling: true (it is the lean sampler's option)")

    def setting_value(self, name: str):
        """What the run does for the setting `name`: the field, or for a derived setting the value the fields
        imply (TRL's loss types fix their own aggregation). `generations.compare` reads a run through it, since the
        record of upstream's defaults sits below the trainer and cannot compute them."""
        if name == "loss_aggregation":
            return effective_loss_aggregation(self.loss_type, self.loss_aggregation)
        if name == "bf16":  # compared with upstream's per-device precision (generations.DevicePrecision)
            return self.run_precision
        return getattr(self, name)

    @classmethod
    def trl_defaults(cls, output_dir: str | None = None, **kwargs) -> "MiniMindGRPOConfig":
        """A config with TRL's `GRPOConfig` defaults wherever this class keeps upstream MiniMind's (the `trl` record of
        `minimind_trl.generations`: lr 1e-6, linear schedule, `dapo`, beta 0, TRL's advantages, tempered log-probs,
        no prompt cut, ...) and `upstream="trl"`, so the model card compares the run with TRL. `kwargs` set fields as
        the constructor does. To swap TRL's `GRPOTrainer` for `MiniMindGRPOTrainer` and keep TRL's algorithm, pass
        this where `GRPOConfig(...)` was (docs/parity.md#as-a-grpotrainer)."""
        record = get_generation("trl")
        values = {row.name: row.value for row in record.rows() if row.kind == TRAINING}
        values = {**values, "upstream": record.name, **kwargs}
        if values.get("steps_per_generation") is None and values.get("generation_batch_size") is None:
            values["steps_per_generation"] = values.get("gradient_accumulation_steps", 1)  # TRL's rule
        return cls(output_dir=output_dir, **values)

    def _check_sampling_and_weights(self):
        """Values the CLI, recipes and the Python API all pass through here (a recipe skips argparse's checks):
        finite reward weights, a known sampling dtype, one meaning of `top_k` (its range: `config_ranges`)."""
        weights = self.reward_weights
        if weights is not None and not all(isinstance(w, (int, float)) and math.isfinite(w) for w in weights):
            raise RewardSpecError(
                f"reward_weights must be finite numbers, got {list(weights)}: a NaN or infinite weight turns every "
                "reward, advantage and gradient into 0 or NaN, so nothing would be learned"
            )
        if isinstance(self.sampling_weights_dtype, str) and self.sampling_weights_dtype.lower() == "none":
            self.sampling_weights_dtype = None  # the command line's spelling of None
        if self.sampling_weights_dtype is not None and self.sampling_weights_dtype not in SAMPLING_WEIGHTS_DTYPES:
            raise RecipeError(
                f"sampling_weights_dtype must be one of {', '.join(SAMPLING_WEIGHTS_DTYPES)} or None (the policy's "
                f"dtype), got {self.sampling_weights_dtype!r}"
            )
        if self.top_k == -1:
            self.top_k = 0  # vLLM's "disabled"; stock `generate` refuses -1 and the lean sampler would read it as 0

    def _choose_precision(self) -> None:
        """`bf16` unset: chosen for this machine (`cpu_precision.choose_bf16`), before `TrainingArguments` turns it
        into accelerate's mixed precision. `accelerate launch --mixed_precision bf16` counts as an explicit bf16."""
        auto = self.bf16 is None and os.environ.get("ACCELERATE_MIXED_PRECISION") != "bf16"
        on_cpu = runs_on_cpu(self.use_cpu)
        self.bf16 = choose_bf16(None if auto else (self.bf16 is not False), self.fp16, on_cpu)
        if auto and self.bf16 and on_cpu and not self.use_cpu:
            self.use_cpu = True  # no accelerator here; transformers refuses bf16 on CPU without use_cpu
        dtype = "bf16" if self.bf16 else "fp16" if self.fp16 else "fp32"
        self.run_precision = RunPrecision(dtype, on_cpu, chosen_for_cpu=auto and on_cpu)


MiniMindGRPOConfig.__doc__ += f"""
    > The upstream generations side by side (`minimind_trl.generations`; these defaults are MiniMind2's)

{render_generations_table()}"""

__all__ = ["MiniMindGRPOConfig", "SAMPLING_WEIGHTS_DTYPES"]
