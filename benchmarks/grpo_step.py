"""One GRPO step, side by side: upstream's loop against minimind-trl's trainer, same model, prompts, rewards.

(a) `seed`: `benchmarks/seed_loop.py`, upstream's step re-implemented from the spec's walk-through (HF
    `generate` in training mode with temperature 0.8 and the then-default `top_k=50`, fp32, full-vocabulary
    per-row log-softmax for policy and reference, a second forward for the MoE aux loss, one reward-model
    call per completion, AdamW + clip + cosine).
(b) `ours`: `MiniMindGRPOTrainer` with its defaults, which include the two CPU levers: the fused log-prob head
    of `minimind_trl.trainer.speed.fast_logprobs` (completion positions only) and rollouts through
    `minimind_trl.trainer.speed.fast_sampling.FastSampler` (`fast_sampling=True`), and the precision chosen for this
    CPU (`bf16` unset: bf16 only where the CPU computes it natively, `minimind_trl.trainer.speed.cpu_precision`), and its
    log-prob passes computing each group's prompt once (`share_prompts`; `--no-share-prompts` turns it off). Same
    rewards as (a) (`format_reward`, `tag_count_reward`, `RewardModelReward` over a batched `InternLM2Scorer`);
    config levers below (`--precision`, `--sampler-dtype` = `sampling_weights_dtype`, ...).
(c) `stock`: the same trainer with both CPU levers switched off, i.e. TRL's own paths: `fast_sampling=False`
    (stock `generate`) and TRL's `trl.trainer.utils.add_fused_lm_head`, swapped in by a subclass defined here
    while the trainer builds its heads, and every prompt computed per completion (`share_prompts=False`). (b)
    against (c) is what the levers gain. `--no-stock` skips it.

All start from the same saved policy, the same tiny InternLM2-layout reward model (random weights in the
published layout, `minimind_trl.models.internlm2_reward.tiny`) and the same two prompts (~62 tokens, cut at 66 as
upstream cuts them; `--prompt-tokens N`: each grown with background text and cut to its last N); all are forced to
generate exactly `--new-tokens` tokens per completion (`min_new_tokens`, checked), so the work is equal. Each side runs
in its own subprocess, one after the other, so its peak RSS is its own. Phase times for (b)/(c) come from
TRL's own profiling hooks (`trl.extras.profiling.ProfilingContext`, recorded instead of sent to a tracker) and
trainer callbacks:

    generation     `transformers.generate`
    logprobs       every `_get_per_token_logps_and_entropies` call (reference + policy)
    reward         `_calculate_rewards`
    backward_step  from the end of each `compute_loss` to what starts next (backward, clip, AdamW, scheduler)
    other          the rest of the step (tokenizing, decoding, advantages, logging)

Figures are medians over `--steps` steps after `--warmup` untimed ones, in wall time and in this process's CPU
time (the step and its generation, log-prob and backward phases; steadier on a shared machine). The first lines
name the CPU (vendor and model, torch's capability, AVX512-BF16 and AMX yes/no) and the precision the automatic
choice makes on it; each side's line says the precision it ran in. The last line printed is one JSON object
(`cpu`, `precision_choice`, `seed_precision`, `ours_precision`, `seed_s_per_step`, `ours_s_per_step`, `speedup`,
`seed_peak_rss_mb`, `ours_peak_rss_mb`, `stock_s_per_step`, `stock_speedup`, `roofline_s_per_step`,
`ours_efficiency`, `ours_cpu_efficiency`, `speedup_ceiling`, ...). Before the sides run, the parent measures the
roofline (`benchmarks/roofline.py`): each phase's FLOPs counted from the shapes and this machine's best GEMM peak at
the phase's shapes (the faster of fp32 and bf16, whichever precision a side picked, so a slow choice shows as low
efficiency). Each side is measured against the FLOPs it really does: (b) with each group's prompt once in its
log-prob and backward passes, (a) and (c) with every prompt per completion. The report prints each side's
efficiency (time at peak / measured time) per phase and step, and for the step against CPU time too (with one
thread the peaks are timed in CPU time, see `roofline.py`), and the FLOP ceiling of (b)/(a): (a)'s measured time
over (b)'s roofline, the speed-up (b) would reach at 100 % efficiency.

    python benchmarks/grpo_step.py --threads 1                    # hidden 256, 4 layers, 128 new tokens
    python benchmarks/grpo_step.py --threads 1 --new-tokens 512 --steps 3
    python benchmarks/grpo_step.py --threads 1 --moe
    python benchmarks/grpo_step.py --threads 1 --prompt-tokens 256 --new-tokens 256 --steps 3
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

PHASES = ("generation", "logprobs", "reward", "backward_step", "other")
# --sampler-dtype -> sampling_weights_dtype ("auto", the trainer's default: bf16 decode GEMMs under bf16 training
# where the CPU computes bf16 natively)
SAMPLER_DTYPES = {"auto": "auto", "fp32": None, "bf16": "bfloat16", "fp16": "float16"}
# --precision -> the config's bf16 (None: the trainer's default, chosen for this CPU)
PRECISIONS = {"auto": None, "bf16": True, "fp32": False}
QUESTIONS = (
    "What is the capital of France? Please think step by step, then answer.",
    "为什么天空是蓝色的？请先思考，再回答。",
)
# --prompt-tokens: background text put before each question until its chat-templated prompt is long enough
FILLER = (
    "Background: the question below comes from a study guide on geography and physics. ",
    "背景：下面的问题来自一本地理和物理的学习指南。",
)
DEFAULT_PROMPT_CUT = 66  # MiniMindGRPOConfig's max_prompt_length, upstream's --max_seq_len


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    model = parser.add_argument_group("model and batch (both loops)")
    model.add_argument("--hidden-size", type=int, default=256)
    model.add_argument("--layers", type=int, default=4)
    model.add_argument("--heads", type=int, default=8)
    model.add_argument("--kv-heads", type=int, default=2)
    model.add_argument("--vocab-size", type=int, default=6400)
    model.add_argument("--moe", action="store_true", help="MiniMind2 MoE (4 experts, top-2, 1 shared expert)")
    model.add_argument("--prompts", type=int, default=2, help="prompts per step (upstream's --batch_size)")
    model.add_argument("--generations", type=int, default=8, help="completions per prompt")
    model.add_argument("--new-tokens", type=int, default=128, help="tokens generated per completion (forced)")
    model.add_argument(
        "--prompt-tokens",
        type=int,
        default=None,
        help="prompt length: each prompt padded with background text to at least N chat-templated tokens and both "
        "loops keep its last N (max_prompt_length / --max_seq_len N); default: the two short questions (~62 tokens) "
        "cut at 66 as upstream cuts them",
    )
    model.add_argument("--rm-hidden-size", type=int, default=64, help="stand-in reward model width")
    model.add_argument("--rm-layers", type=int, default=2, help="stand-in reward model depth")
    run = parser.add_argument_group("run")
    run.add_argument("--steps", type=int, default=5, help="timed steps (median reported)")
    run.add_argument("--warmup", type=int, default=1, help="untimed steps first")
    run.add_argument("--threads", type=int, default=None, help="torch threads in both loops (default: torch's)")
    run.add_argument("--only", choices=["seed", "ours", "stock"], help="run one side only")
    ours = parser.add_argument_group("levers of (b) and (c)")
    ours.add_argument(
        "--precision",
        choices=sorted(PRECISIONS),
        default="auto",
        help="(b)/(c) mixed precision: auto (MiniMindGRPOConfig's default, bf16 unset: bf16 autocast where this CPU "
        "computes bf16 natively, fp32 elsewhere), bf16 (insist) or fp32",
    )
    ours.add_argument(
        "--cache-implementation",
        default=None,
        help="(b)/(c) generation cache, e.g. 'static' (the lean sampler of (b) then falls back to `generate`)",
    )
    ours.add_argument("--rm-batch-size", type=int, default=32, help="(b)/(c) reward-model batch size")
    ours.add_argument(
        "--continuous-batching",
        action="store_true",
        help="(b)/(c) generate with transformers' continuous batching (needs --precision fp32)",
    )
    ours.add_argument(
        "--sampler-dtype",
        choices=sorted(SAMPLER_DTYPES),
        default="auto",
        help="(b): `sampling_weights_dtype` of the lean sampler (auto, the default: the trainer's default, bf16 "
        "decode GEMMs when training in bf16 on a CPU with native bf16; fp32: the policy's own weights; bf16/fp16: "
        "always that dtype)",
    )
    ours.add_argument(
        "--activation-checkpointing",
        action="store_true",
        help="(b)/(c) recompute activations in the backward (less memory, more time)",
    )
    ours.add_argument(
        "--micro-batch",
        type=int,
        default=None,
        help="(b)/(c) completions per forward/backward micro-batch (gradient accumulation over one "
        "generation batch of prompts x generations); default: the whole batch at once",
    )
    ours.add_argument(
        "--attn-implementation",
        default=None,
        choices=["sdpa", "eager"],
        help="(b)/(c) the policy's and reference's attention (default: transformers' choice, sdpa)",
    )
    ours.add_argument(
        "--no-share-prompts",
        action="store_true",
        help="(b) with share_prompts: false (every prompt computed once per completion, as upstream and (c) do)",
    )
    ours.add_argument("--no-stock", action="store_true", help="skip (c), the trainer on TRL's stock paths")
    parser.add_argument("--role", choices=["seed", "ours", "stock"], help=argparse.SUPPRESS)
    parser.add_argument("--workdir", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.continuous_batching and args.precision != "fp32":
        parser.error("--continuous-batching needs --precision fp32 (MiniMindGRPOConfig refuses it with bf16)")
    return args


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def set_threads(args) -> int:
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    return torch.get_num_threads()


# --------------------------------------------------------------------------------------------------------------
# Shared inputs, built once by the parent process


def prepare(args, workdir: Path) -> None:
    """Save the policy, its tokenizer, the reward model and the prompts that both loops load."""
    import torch

    from minimind_trl import MiniMindConfig, MiniMindForCausalLM
    from minimind_trl.models.internlm2_reward.tiny import write_tiny_internlm2_reward_model
    from minimind_trl.models.minimind.tokenization_minimind import build_minimind_tokenizer

    torch.manual_seed(0)
    tokenizer = build_minimind_tokenizer()
    config = MiniMindConfig(
        hidden_size=args.hidden_size,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        vocab_size=args.vocab_size,
        use_moe=args.moe,
        max_position_embeddings=max(32768, prompt_cut(args) + args.new_tokens),
        **({"minimind_generation": args.generation} if getattr(args, "generation", None) else {}),  # gpu_step.py's
    )
    MiniMindForCausalLM(config).save_pretrained(workdir / "policy")
    tokenizer.save_pretrained(workdir / "policy")
    write_tiny_internlm2_reward_model(
        workdir / "reward_model",
        hidden_size=args.rm_hidden_size,
        num_hidden_layers=args.rm_layers,
        intermediate_size=args.rm_hidden_size * 2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
    )
    conversations = [[{"role": "user", "content": q}] for q in QUESTIONS]
    if args.prompt_tokens:
        conversations = [long_conversation(tokenizer, q, f, args.prompt_tokens) for q, f in zip(QUESTIONS, FILLER)]
    conversations = (conversations * ((args.prompts + len(conversations) - 1) // len(conversations)))[: args.prompts]
    (workdir / "prompts.json").write_text(json.dumps(conversations, ensure_ascii=False))


def prompt_cut(args) -> int:
    """The prompt tokens both loops keep (the last ones)."""
    return args.prompt_tokens or DEFAULT_PROMPT_CUT


def templated_length(tokenizer, conversation) -> int:
    ids = tokenizer.apply_chat_template(conversation, tokenize=True, add_generation_prompt=True, return_dict=False)
    return len(ids)


def long_conversation(tokenizer, question: str, filler: str, tokens: int) -> list[dict]:
    """The question after as much background text as makes its chat-templated prompt at least `tokens` long."""
    repeats = 0
    while templated_length(tokenizer, [{"role": "user", "content": filler * repeats + question}]) < tokens:
        repeats += 1
    return [{"role": "user", "content": filler * repeats + question}]


def load_shared(workdir: Path):
    from transformers import AutoTokenizer

    from minimind_trl.models.internlm2_reward import load_internlm2_reward_model, load_internlm2_tokenizer

    tokenizer = AutoTokenizer.from_pretrained(workdir / "policy")
    reward_model = load_internlm2_reward_model(workdir / "reward_model", dtype="float32").eval()
    reward_tokenizer = load_internlm2_tokenizer(workdir / "reward_model")
    conversations = json.loads((workdir / "prompts.json").read_text())
    return tokenizer, reward_model, reward_tokenizer, conversations


# --------------------------------------------------------------------------------------------------------------
# (a) upstream's loop


def run_seed(args, workdir: Path) -> dict:
    threads = set_threads(args)
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from seed_loop import SeedArgs, SeedGRPOLoop

    import minimind_trl  # noqa: F401  (registers MiniMind with the Auto classes)
    from minimind_trl import MiniMindForCausalLM

    tokenizer, reward_model, reward_tokenizer, conversations = load_shared(workdir)
    torch.manual_seed(42)
    policy = MiniMindForCausalLM.from_pretrained(workdir / "policy", dtype=torch.float32)
    reference = MiniMindForCausalLM.from_pretrained(workdir / "policy", dtype=torch.float32)
    prompts = [tokenizer.apply_chat_template(c, tokenize=False, add_generation_prompt=True) for c in conversations]
    seed_args = SeedArgs(
        num_generations=args.generations,
        max_gen_len=args.new_tokens,
        min_new_tokens=args.new_tokens,
        max_seq_len=prompt_cut(args),
    )
    loop = SeedGRPOLoop(
        policy,
        reference,
        tokenizer,
        lambda chat: reward_model.get_score(reward_tokenizer, chat),
        seed_args,
        total_steps=args.warmup + args.steps,
    )
    rss_before_training = peak_rss_mb()
    records = [loop.step(prompts) for _ in range(args.warmup + args.steps)]
    expected_tokens = args.prompts * args.generations * args.new_tokens
    if any(r["stats"]["completion_tokens"] != expected_tokens for r in records):
        raise RuntimeError(
            f"upstream loop generated {[r['stats']['completion_tokens'] for r in records]} tokens per "
            f"step; expected {expected_tokens}"
        )
    timed = records[args.warmup :]
    summary = summarize(
        [r["times"] for r in timed], [r["stats"]["completion_tokens"] for r in timed], threads, rss_before_training
    )
    return {**summary, "precision": "fp32"}  # upstream's autocast is a no-op on CPU


# --------------------------------------------------------------------------------------------------------------
# (b) minimind-trl's trainer


class _PhaseRecorder:
    """Collects TRL's profiling spans and the step boundaries of the trainer's loop. `synchronize` (on CUDA:
    `torch.cuda.synchronize`) runs at each span's edges, so that a span ends when its kernels do, not when they are
    queued (a no-grad pass returns before its GPU work is done; the time would land in the next span)."""

    def __init__(self, synchronize=None):
        self.synchronize = synchronize or (lambda: None)
        self.spans: list[tuple[str, float, float, float, float]] = []  # name, wall start, wall end, CPU start, CPU end
        self.steps: list[dict] = []
        self.logged_lengths: list[tuple[float, float]] = []  # (min, max) completion length per logged step

    @contextmanager
    def trl_spans(self):
        """Record every `ProfilingContext` span TRL opens inside the block (instead of only logging it)."""
        from trl.extras import profiling

        recorder, original_enter, original_exit = (
            self,
            profiling.ProfilingContext.__enter__,
            profiling.ProfilingContext.__exit__,
        )

        def enter_and_record(context):
            recorder.synchronize()
            context._cpu_start = time.process_time()
            return original_enter(context)

        def exit_and_record(context, *exc):
            recorder.synchronize()
            if context._start_time is not None:
                name = context.name.rsplit(".", 1)[-1]
                now, cpu_now = time.perf_counter(), time.process_time()
                recorder.spans.append((name, context._start_time, now, context._cpu_start, cpu_now))
            return original_exit(context, *exc)

        profiling.ProfilingContext.__enter__ = enter_and_record
        profiling.ProfilingContext.__exit__ = exit_and_record
        try:
            yield self
        finally:
            profiling.ProfilingContext.__enter__ = original_enter
            profiling.ProfilingContext.__exit__ = original_exit

    def callback(self):
        from transformers import TrainerCallback

        recorder = self

        class StepTimes(TrainerCallback):
            def on_step_begin(self, args, state, control, **kwargs):
                recorder.steps.append(
                    {"begin": time.perf_counter(), "cpu_begin": time.process_time(), "span_index": len(recorder.spans)}
                )

            def on_step_end(self, args, state, control, **kwargs):
                recorder.steps[-1].update(end=time.perf_counter(), cpu_end=time.process_time())

            def on_log(self, args, state, control, logs=None, **kwargs):
                if logs and "completions/min_length" in logs:
                    recorder.logged_lengths.append((logs["completions/min_length"], logs["completions/max_length"]))

        return StepTimes()

    def step_times(self) -> list[dict]:
        out = []
        for index, step in enumerate(self.steps):
            stop = self.steps[index + 1]["span_index"] if index + 1 < len(self.steps) else len(self.spans)
            spans = self.spans[step["span_index"] : stop]

            def total(names, spans=spans, cpu=False):
                ends = [(s[3], s[4]) if cpu else (s[1], s[2]) for s in spans if s[0] in names]
                return sum(end - start for start, end in ends)

            # backward + optimizer: from the end of each micro-batch's compute_loss to whatever starts next
            # (the next micro-batch's _prepare_inputs) or to the end of the step
            backward = cpu_backward = 0.0
            for name, _, loss_end, _, cpu_loss_end in spans:
                if name == "compute_loss":
                    later = [(start, cpu_start) for _, start, _, cpu_start, _ in spans if start > loss_end]
                    next_start, next_cpu_start = min(later, default=(step["end"], step["cpu_end"]))
                    backward += next_start - loss_end
                    cpu_backward += next_cpu_start - cpu_loss_end
            times = {
                "generation": total(("generate", "generate_batch")),
                "logprobs": total(("_get_per_token_logps_and_entropies",)),
                "reward": total(("_calculate_rewards",)),
                "backward_step": backward,
                "total": step["end"] - step["begin"],
                "cpu_total": step["cpu_end"] - step["cpu_begin"],
                "cpu_generation": total(("generate", "generate_batch"), cpu=True),
                "cpu_logprobs": total(("_get_per_token_logps_and_entropies",), cpu=True),
                "cpu_backward_step": cpu_backward,
            }
            times["other"] = times["total"] - sum(times[k] for k in PHASES[:-1])
            out.append(times)
        return out


def stock_trainer_class():
    """`MiniMindGRPOTrainer` on TRL's own log-prob head: while the trainer builds its fused heads (it calls
    `minimind_trl.trainer.speed.fast_logprobs.add_fused_lm_head` at the scoring temperature), that name points at TRL's
    `trl.trainer.utils.add_fused_lm_head`. With `fast_sampling=False` in its config this is the trainer without
    its CPU levers."""
    from trl.trainer import utils as trl_utils

    from minimind_trl.trainer.speed import fast_logprobs
    from minimind_trl.trainer import MiniMindGRPOTrainer

    class StockMiniMindGRPOTrainer(MiniMindGRPOTrainer):
        def __init__(self, *args, **kwargs):
            def trl_head(model, **head_kwargs):
                return trl_utils.add_fused_lm_head(model, **head_kwargs)

            ours, fast_logprobs.add_fused_lm_head = fast_logprobs.add_fused_lm_head, trl_head
            try:
                super().__init__(*args, **kwargs)
            finally:
                fast_logprobs.add_fused_lm_head = ours

    return StockMiniMindGRPOTrainer


def log_prob_head(model) -> str:
    """Which fused log-prob head the model's forward is: `minimind_trl.trainer.speed.fast_logprobs`, `trl.trainer.utils` or
    the forward's source file (accelerate's autocast wrapper is looked through)."""
    from trl.trainer import utils as trl_utils

    from minimind_trl.trainer.speed import fast_logprobs

    forward = model.__dict__.get("forward")
    if forward is not None and "accelerate" in Path(forward.__code__.co_filename).parts:
        forward = model.__dict__.get("_original_forward", forward)
    if forward is None:
        return "class forward"
    filename = getattr(forward, "__func__", forward).__code__.co_filename
    modules = {fast_logprobs.__file__: "minimind_trl.trainer.speed.fast_logprobs", trl_utils.__file__: "trl.trainer.utils"}
    return modules.get(filename, filename)


def run_ours(args, workdir: Path, stock: bool = False) -> dict:
    threads = set_threads(args)
    import torch
    from datasets import Dataset

    from minimind_trl.rewards import RewardModelReward, format_reward, tag_count_reward
    from minimind_trl.rewards import InternLM2Scorer
    from minimind_trl.trainer import MiniMindGRPOConfig, MiniMindGRPOTrainer

    tokenizer, reward_model, reward_tokenizer, conversations = load_shared(workdir)
    recorder = _PhaseRecorder()
    total_steps = args.warmup + args.steps
    micro_batch = args.micro_batch or args.prompts * args.generations
    accumulation, remainder = divmod(args.prompts * args.generations, micro_batch)
    if remainder:
        raise SystemExit(f"--micro-batch {micro_batch} must divide prompts x generations")
    config = MiniMindGRPOConfig(
        output_dir=str(workdir / "ours"),
        use_cpu=True,
        bf16=PRECISIONS[args.precision],
        per_device_train_batch_size=micro_batch,
        gradient_accumulation_steps=accumulation,
        generation_batch_size=args.prompts * args.generations,
        num_generations=args.generations,
        max_prompt_length=prompt_cut(args),
        max_completion_length=args.new_tokens,
        generation_kwargs={"min_new_tokens": args.new_tokens},
        share_prompts=not (stock or args.no_share_prompts),
        cache_implementation=args.cache_implementation,
        use_transformers_continuous_batching=args.continuous_batching,
        activation_checkpointing=args.activation_checkpointing,
        fast_sampling=not stock,
        model_init_kwargs={"attn_implementation": args.attn_implementation} if args.attn_implementation else None,
        sampling_weights_dtype=None if stock else SAMPLER_DTYPES[args.sampler_dtype],
        max_steps=total_steps,
        shuffle_dataset=False,
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
        logging_steps=1,
        dataloader_num_workers=0,
    )
    scorer = InternLM2Scorer(reward_model, reward_tokenizer, batch_size=args.rm_batch_size)
    reward_funcs = [format_reward, tag_count_reward, RewardModelReward(scorer, tokenizer=tokenizer)]
    dataset = Dataset.from_dict({"prompt": conversations * total_steps})
    torch.manual_seed(42)
    trainer_class = stock_trainer_class() if stock else MiniMindGRPOTrainer
    trainer = trainer_class(
        str(workdir / "policy"),
        reward_funcs=reward_funcs,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[recorder.callback()],
    )
    levers = {
        "log_prob_head": log_prob_head(trainer.accelerator.unwrap_model(trainer.model)),
        "lean_samples": 0,
        "shared_prompts": trainer._shares_prompts,
    }
    precision = "bf16" if trainer.args.bf16 else "fp32"  # after the config's automatic choice
    if trainer._sampler is not None:  # count the generations the lean loop itself ran (not its `generate` fallback)
        policy = trainer.accelerator.unwrap_model(trainer.model)
        levers["decode_kernel"] = trainer._sampler.kernel_applies(policy)
        levers["decode_weights"] = str(trainer._sampler.weights_dtype or policy.dtype).removeprefix("torch.")
        sample = trainer._sampler._sample

        def counted_sample(*sample_args, **sample_kwargs):
            levers["lean_samples"] += 1
            return sample(*sample_args, **sample_kwargs)

        trainer._sampler._sample = counted_sample
    rss_before_training = peak_rss_mb()
    with recorder.trl_spans():
        trainer.train()
    step_times = recorder.step_times()
    if len(step_times) != total_steps:
        raise RuntimeError(f"expected {total_steps} trainer steps, recorded {len(step_times)}")
    lengths = recorder.logged_lengths
    if len(lengths) != total_steps or any(length != (args.new_tokens, args.new_tokens) for length in lengths):
        raise RuntimeError(f"completion lengths (min, max) per step {lengths}; expected {args.new_tokens} everywhere")
    tokens = [args.prompts * args.generations * args.new_tokens] * args.steps
    summary = summarize(step_times[args.warmup :], tokens, threads, rss_before_training)
    return {**summary, "levers": levers, "precision": precision}


def summarize(step_times: list[dict], completion_tokens: list[int], threads: int, rss_before: float) -> dict:
    median = {
        key: statistics.median(t[key] for t in step_times)
        for key in (*PHASES, "total", "cpu_total", "cpu_generation", "cpu_logprobs", "cpu_backward_step")
    }
    tokens = statistics.median(completion_tokens)
    return {
        "s_per_step": median["total"],
        "cpu_s_per_step": median["cpu_total"],
        "cpu_generation_s": median["cpu_generation"],
        "cpu_logprobs_s": median["cpu_logprobs"],
        "cpu_backward_step_s": median["cpu_backward_step"],
        "phases": {key: median[key] for key in PHASES},
        "steps_s": [t["total"] for t in step_times],
        "completion_tokens_per_step": tokens,
        "gen_tokens_per_s": tokens / median["generation"],
        "step_tokens_per_s": tokens / median["total"],
        "peak_rss_mb": peak_rss_mb(),
        "peak_rss_before_training_mb": rss_before,
        "threads": threads,
    }


# --------------------------------------------------------------------------------------------------------------
# Parent: prepare, run both sides, compare


def child(role: str, args, workdir: Path, argv: list[str]) -> dict:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    if args.threads:
        env["OMP_NUM_THREADS"] = str(args.threads)
    command = [sys.executable, __file__, *argv, "--role", role, "--workdir", str(workdir)]
    result = subprocess.run(command, check=False, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        sys.stderr.write(result.stdout[-4000:] + result.stderr[-8000:])
        raise SystemExit(f"the {role} loop failed (exit {result.returncode})")
    return json.loads(result.stdout.strip().splitlines()[-1])


SIDES = (("seed", "seed (a)"), ("ours", "ours (b)"), ("stock", "stock (c)"))


def cpu_report() -> dict:
    """Print this CPU and the precision the automatic choice makes on it; the JSON keys it adds."""
    from minimind_trl.trainer.speed.cpu_precision import machine_choice

    choice = machine_choice()
    print(f"CPU: {choice.cpu.describe()}")
    print(f"automatic precision (bf16 unset): {'bf16' if choice.bf16 else 'fp32'}: {choice.reason}")
    return {"cpu": choice.cpu.as_dict(), "precision_choice": choice.as_dict()}


def report(args, results: dict) -> dict:
    seed = results.get("seed")
    print(
        f"hidden {args.hidden_size}, {args.layers} layers, {args.heads} heads / {args.kv_heads} kv, vocab "
        f"{args.vocab_size}{', MoE' if args.moe else ''}; {args.prompts} prompts (cut at {prompt_cut(args)} tokens) x "
        f"{args.generations} generations x {args.new_tokens} new tokens; median of {args.steps} steps after "
        f"{args.warmup} warm-up; "
        f"{next(iter(results.values()))['threads']} threads"
    )
    print(
        f"(b)/(c) MiniMindGRPOTrainer: --precision {args.precision}, cache_implementation={args.cache_implementation}, "
        f"reward-model batch={args.rm_batch_size}, continuous_batching={args.continuous_batching}, "
        f"activation_checkpointing={args.activation_checkpointing}, micro_batch={args.micro_batch or 'all'}, "
        f"attention={args.attn_implementation or 'sdpa (default)'}"
    )
    if "seed" in results:
        print(f"seed (a): precision {results['seed']['precision']} (upstream's bf16 autocast is a no-op on CPU)")
    for key, label in SIDES[1:]:
        if key in results:
            levers = results[key]["levers"]
            print(
                f"{label}: precision {results[key]['precision']}, log-prob head {levers['log_prob_head']}, "
                f"prompts shared per group {levers['shared_prompts']}, "
                f"lean-sampler generations {levers['lean_samples']}"
                + (
                    f" (decode kernel {levers.get('decode_kernel')}, GEMM weights {levers.get('decode_weights')})"
                    if key == "ours"
                    else " (stock `generate`)"
                )
            )
    sides = [(key, label, results[key]) for key, label in SIDES if key in results]
    header = f"{'':<16}" + "".join(f"{label:>14}" for _, label, _ in sides)
    if seed:
        header += "".join(f"{'(' + label[-2] + ')/(a)':>10}" for key, label, _ in sides if key != "seed")
    print(header)
    rows = [(p + " s", lambda r, p=p: r["phases"][p]) for p in PHASES] + [
        ("s/step", lambda r: r["s_per_step"]),
        ("cpu s/step", lambda r: r["cpu_s_per_step"]),
        ("cpu gen s", lambda r: r["cpu_generation_s"]),
        ("cpu logprobs s", lambda r: r["cpu_logprobs_s"]),
        ("cpu bwd+step s", lambda r: r["cpu_backward_step_s"]),
        ("gen tok/s", lambda r: r["gen_tokens_per_s"]),
        ("step tok/s", lambda r: r["step_tokens_per_s"]),
        ("peak RSS MB", lambda r: r["peak_rss_mb"]),
        ("  before train", lambda r: r["peak_rss_before_training_mb"]),
    ]
    for label, get in rows:
        line = f"{label:<16}" + "".join(f"{get(r):>14.3f}" for _, _, r in sides)
        if seed:
            line += "".join(
                (f"{get(r) / get(seed):>10.3f}" if get(seed) else f"{'-':>10}") for key, _, r in sides if key != "seed"
            )
        print(line)
    summary = {
        "hidden_size": args.hidden_size,
        "layers": args.layers,
        "moe": args.moe,
        "new_tokens": args.new_tokens,
        "prompt_tokens_cut": prompt_cut(args),
        "prompts": args.prompts,
        "generations": args.generations,
        "steps": args.steps,
        "threads": next(iter(results.values()))["threads"],
        "precision": args.precision,
        "sampler_dtype": args.sampler_dtype,
        "cache_implementation": args.cache_implementation,
        "attn_implementation": args.attn_implementation or "sdpa",
        "load_avg_1m_after": os.getloadavg()[0],
    }
    for key, _, r in sides:
        summary[f"{key}_s_per_step"] = r["s_per_step"]
        summary[f"{key}_cpu_s_per_step"] = r["cpu_s_per_step"]
        summary[f"{key}_cpu_phases"] = {
            name: r[f"cpu_{name}_s"] for name in ("generation", "logprobs", "backward_step")
        }
        summary[f"{key}_peak_rss_mb"] = r["peak_rss_mb"]
        summary[f"{key}_phases"] = r["phases"]
        summary[f"{key}_gen_tokens_per_s"] = r["gen_tokens_per_s"]
        summary[f"{key}_precision"] = r["precision"]
        if key != "seed":
            summary[f"{key}_levers"] = r["levers"]
        if seed and key != "seed":
            prefix = "" if key == "ours" else f"{key}_"
            summary[f"{prefix}speedup"] = seed["s_per_step"] / r["s_per_step"]
            summary[f"{prefix}speedup_cpu_time"] = seed["cpu_s_per_step"] / r["cpu_s_per_step"]
            summary[f"{prefix}rss_ratio"] = r["peak_rss_mb"] / seed["peak_rss_mb"]
            print(
                f"{key}: speedup (a)/({'b' if key == 'ours' else 'c'}) {summary[f'{prefix}speedup']:.2f}x wall, "
                f"{summary[f'{prefix}speedup_cpu_time']:.2f}x CPU time; "
                f"peak RSS ratio {summary[f'{prefix}rss_ratio']:.2f}"
            )
    if "ours" in results and "stock" in results:  # what the trainer's CPU levers gain over TRL's paths
        ours, stock = results["ours"], results["stock"]
        summary["lever_speedup"] = stock["s_per_step"] / ours["s_per_step"]
        summary["lever_rss_ratio"] = ours["peak_rss_mb"] / stock["peak_rss_mb"]
        print(
            f"levers: speedup (c)/(b) {summary['lever_speedup']:.2f}x wall; "
            f"peak RSS ratio (b)/(c) {summary['lever_rss_ratio']:.2f}"
        )
    return summary


# --------------------------------------------------------------------------------------------------------------
# Roofline: the FLOPs of the step and this machine's GEMM peak at its shapes (benchmarks/roofline.py)


def step_roofline(args, workdir: Path) -> dict:
    """FLOPs per phase and this machine's best measured GEMM peak at each phase's shapes (fp32 or bf16, whichever
    is faster here: the best the machine can do, not the precision a side chose)."""
    from transformers import AutoConfig, AutoTokenizer

    import minimind_trl  # noqa: F401  (registers MiniMind's config)

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from roofline import StepShapes, roofline

    set_threads(args)
    tokenizer = AutoTokenizer.from_pretrained(workdir / "policy")
    conversations = json.loads((workdir / "prompts.json").read_text())
    lengths = [min(prompt_cut(args), templated_length(tokenizer, c)) for c in conversations]  # as both loops cut them
    shapes = StepShapes.from_config(
        AutoConfig.from_pretrained(workdir / "policy"),
        completions=args.prompts * args.generations,
        groups=args.prompts,
        prompt_tokens=round(statistics.mean(lengths)),
        new_tokens=args.new_tokens,
        rm_hidden=args.rm_hidden_size,
        rm_layers=args.rm_layers,
    )
    return roofline(shapes)


def side_roofline(roof: dict, result: dict) -> dict:
    """The roofline of the FLOPs a side really does: each group's prompt once where it shares prompts ((b) by
    default), once per completion otherwise ((a) like upstream, (c) on TRL's paths)."""
    return roof["shared_prompts"] if result.get("levers", {}).get("shared_prompts") else roof


def report_roofline(args, roof: dict, results: dict) -> dict:
    """Print the roofline beside each side's phase times, each side against the FLOPs it does; the JSON keys it
    adds."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from roofline import efficiency

    phases = [name for name in PHASES if name in roof["phases"]]
    shared = roof["shared_prompts"]
    print(
        f"roofline (each phase at the faster of fp32 and bf16 GEMMs measured here): {roof['roofline_s_per_step']:.3f} "
        f"s/step at peak with every prompt computed per completion, {shared['roofline_s_per_step']:.3f} with each "
        "group's prompt once (shared)"
    )
    print(
        f"{'':<16}{'GFLOP':>9}{'shared':>8}{'peak GF/s':>11}{'best':>6}{'fp32':>8}{'bf16':>8}{'at peak s':>11}"
        f"{'shared':>8}" + "".join(f"{k + ' eff':>13}" for k in results)
    )
    rooflines = {key: side_roofline(roof, r) for key, r in results.items()}
    efficiencies = {key: efficiency(rooflines[key], r["phases"], r["s_per_step"]) for key, r in results.items()}
    for name in phases:
        p, q = roof["phases"][name], shared["phases"][name]
        by_dtype = p["peak_gflops_by_dtype"]
        line = (
            f"{name:<16}{p['gflop']:>9.2f}{q['gflop']:>8.2f}{p['peak_gflops']:>11.1f}{p['peak_dtype']:>6}"
            f"{by_dtype['fp32']:>8.1f}{by_dtype['bf16']:>8.1f}{p['roofline_s']:>11.3f}{q['roofline_s']:>8.3f}"
        )
        for key in results:
            value = efficiencies[key]["phases"][name]
            line += f"{value:>13.1%}" if value is not None else f"{'-':>13}"
        print(line)
    print(f"{'step':<16}{'':>69}" + "".join(f"{efficiencies[key]['step']:>13.1%}" for key in results))
    cpu_efficiency = {key: rooflines[key]["roofline_s_per_step"] / r["cpu_s_per_step"] for key, r in results.items()}
    print(f"{'step, CPU time':<16}{'':>69}" + "".join(f"{cpu_efficiency[key]:>13.1%}" for key in results))
    generation = roof["phases"]["generation"]
    print(
        f"decode peak ({generation['peak_dtype']}) at its working set ({generation['weight_mb']:.1f} MB of weights per "
        "step, cycled): "
        f"{generation['peak_gflops']:.1f} GF/s; one warm matrix: {generation['peak_gflops_warm']:.1f} GF/s"
    )
    summary = {
        "roofline_s_per_step": roof["roofline_s_per_step"],
        "shared_prompts_roofline_s_per_step": shared["roofline_s_per_step"],
        "roofline": roof,
    }
    for key in results:
        summary[f"{key}_roofline_s_per_step"] = rooflines[key]["roofline_s_per_step"]
        summary[f"{key}_efficiency"] = efficiencies[key]["step"]
        summary[f"{key}_cpu_efficiency"] = cpu_efficiency[key]
        summary[f"{key}_phase_efficiency"] = efficiencies[key]["phases"]
    if "seed" in results and "ours" in results:  # (b) at 100 % of its roofline against (a) as measured
        ceiling = rooflines["ours"]["roofline_s_per_step"]
        summary["speedup_ceiling"] = results["seed"]["s_per_step"] / ceiling
        summary["speedup_ceiling_cpu_time"] = results["seed"]["cpu_s_per_step"] / ceiling
        print(
            f"FLOP ceiling of (b)/(a): {summary['speedup_ceiling']:.2f}x wall, "
            f"{summary['speedup_ceiling_cpu_time']:.2f}x CPU time ((b) running every phase at its roofline)"
        )
    return summary


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.role:
        workdir = Path(args.workdir)
        if args.role == "seed":
            result = run_seed(args, workdir)
        else:
            result = run_ours(args, workdir, stock=args.role == "stock")
        print(json.dumps(result))
        return 0
    print(f"load average before: {tuple(round(x, 2) for x in os.getloadavg())}", flush=True)
    cpu = cpu_report()
    with tempfile.TemporaryDirectory(prefix="grpo_step_") as tmp:
        workdir = Path(tmp)
        prepare(args, workdir)
        roof = step_roofline(args, workdir)  # measured before the sides run, on the same idle threads
        roles = [args.only] if args.only else ["seed", "ours"] + ([] if args.no_stock else ["stock"])
        results = {role: child(role, args, workdir, argv) for role in roles}
    summary = {**cpu, **report(args, results)}
    summary.update(report_roofline(args, roof, results))
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
