"""One GRPO step on a GPU, side by side: upstream's loop (`seed_loop.py`) against minimind-trl's trainer, same model,
prompts and rewards, at upstream MiniMind-3's defaults (d65ef2c: hidden 768, 8 layers, 8/4 heads, 2 prompts x 6
generations, 768-token prompts, 1024 new tokens, bf16).

(a) `seed`: upstream's step (`benchmarks/seed_loop.py`) on the device, fp32 weights under bf16 autocast for the whole
    step (upstream's `--dtype bfloat16`; generation included, so never slower than upstream's loop).
(b) `ours`, one run per variant of `--variants`:
    - `default`: `MiniMindGRPOTrainer` as a user gets it on CUDA (bf16, the lean sampler, TRL's Triton log-prob head;
      the lean sampler decodes in the policy's fp32 there: the report's `levers.decode_precision`);
    - `share_prompts`: the same with `share_prompts: true` (unset shares on CPU only; benchmarks/README.md, issue 32);
    - `static_compile`: `compile_generation: default`, stock `generate` with transformers' static cache and its
      compiled forward (`minimind_trl.trainer.speed.compiled_generation`);
    - `reduce_overhead`: `compile_generation: reduce-overhead`, the same with CUDA graphs through torch.compile.
    transformers compiles `generate`'s forward on accelerators only; the setting compiles on CPU too (`CompileConfig`'s
    own switch), so with `--cpu` the static cache and the compiled forward run in the trainer, without CUDA graphs
    (inductor's CPU code has none): the path is checked there, not its speed.

Each side runs in its own subprocess (its own peak GPU memory), `--warmup` untimed steps then `--steps` timed ones
(median; the device synchronised at the edges of each step and each phase). Reported per side: s/step and its phases
(generation, log-probs, reward, backward with the optimizer step), generation tokens/s,
peak GPU memory (torch's allocator, during training), MFU: the step's model FLOPs (`roofline.phase_flops`, every prompt
per completion for every side, so the same work) over its time, against the bf16 GEMM peak measured here first (an
8192^3 product on CUDA; on CPU a 1024^3 fp32 one, the `--cpu` form's tiny sizes make MFU meaningless there), and
`mfu_datasheet` against the GPU's datasheet bf16 peak where its name is known (`DATASHEET_BF16_TFLOPS`). The last
line is one JSON object. Speed is reported, never asserted.

    python benchmarks/gpu_step.py                                   # on a GPU, upstream's defaults
    python benchmarks/gpu_step.py --variants default,reduce_overhead
    python benchmarks/gpu_step.py --cpu                             # tiny sizes on CPU (what CI runs)
"""

import argparse
import contextlib
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

# dense bf16 tensor-core peaks by the vendor's datasheets (SXM parts), for MFU beside the measured GEMM peak
DATASHEET_BF16_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0, "L40S": 362.0, "RTX 4090": 165.0, "RTX 3090": 71.0}
VARIANTS = ("default", "share_prompts", "static_compile", "reduce_overhead")
COMPILED = {"static_compile": "default", "reduce_overhead": "reduce-overhead"}  # variant: compile_generation
# the phases reported per side; the reward model's (the stand-in, on the CPU) is in s/step on both sides alike
PHASES = ("generation", "logprobs", "reward", "backward_step")
# --cpu: the sizes of tests/test_benchmarks.py, one step
TINY = dict(hidden_size=32, layers=1, heads=4, kv_heads=2, prompts=2, generations=2, prompt_tokens=80, new_tokens=4,
            steps=1, warmup=0)  # fmt: skip


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu", action="store_true", help="tiny sizes on CPU (compiled variants without CUDA graphs)")
    parser.add_argument("--hidden-size", type=int, default=768)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=4)
    parser.add_argument("--vocab-size", type=int, default=6400)
    parser.add_argument("--generation", choices=["minimind2", "minimind3"], default="minimind3")
    parser.add_argument("--moe", action="store_true")
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--generations", type=int, default=6)
    parser.add_argument("--prompt-tokens", type=int, default=768)
    parser.add_argument("--new-tokens", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--variants", default="default,static_compile,reduce_overhead",
                        help=f"comma-separated, of {', '.join(VARIANTS)}")  # fmt: skip
    parser.add_argument("--no-seed", action="store_true", help="skip (a), upstream's loop")
    parser.add_argument("--profile", action="store_true",
                        help="one more step per side, untimed, under torch.profiler: its summary in the report "
                        "(benchmarks/step_profile.py)")  # fmt: skip
    parser.add_argument("--side-timeout", type=float, default=300, help="seconds a side may take before it is stopped")
    parser.add_argument("--role", help=argparse.SUPPRESS)
    parser.add_argument("--workdir", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.cpu:
        for key, value in TINY.items():
            if parser.get_default(key) == getattr(args, key):
                setattr(args, key, value)
    args.rm_hidden_size, args.rm_layers = 64, 2  # grpo_step.prepare's stand-in reward model (runs on the CPU)
    args.device = "cpu" if args.cpu else "cuda"
    args.variants = [v for v in args.variants.split(",") if v]
    unknown = set(args.variants) - set(VARIANTS)
    if unknown:
        parser.error(f"unknown variants {sorted(unknown)}; known: {', '.join(VARIANTS)}")
    return args


def synchronized(device: str) -> float:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter()


def bf16_peak_tflops(device: str) -> dict:
    """The best of 5 timed products (after 2 warm-ups) on random data: 8192^3 bf16 on CUDA, 1024^3 fp32 on CPU."""
    import torch

    n, dtype = (8192, torch.bfloat16) if device == "cuda" else (1024, torch.float32)
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    best = float("inf")
    for repeat in range(7):
        start = synchronized(device)
        a @ b
        elapsed = synchronized(device) - start
        best = elapsed if repeat >= 2 and elapsed < best else best
    return {"peak_tflops": 2 * n**3 / best / 1e12, "peak_shape": n, "peak_dtype": str(dtype).removeprefix("torch.")}


def memory_reset(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()


def memory_peak_mb(device: str) -> float | None:
    import torch

    return torch.cuda.max_memory_allocated() / 2**20 if device == "cuda" else None


def with_peak(result: dict, device: str) -> dict:
    return {**result, "peak_memory_mb": memory_peak_mb(device)}


def step_medians(step_times: list[dict]) -> dict:
    """s/step and each phase's seconds: medians over the timed steps (each a dict of `total` and the PHASES), as both
    sides record them."""
    return {"s_per_step": statistics.median(t["total"] for t in step_times),
            "phases": {k: statistics.median(t[k] for t in step_times) for k in PHASES}}  # fmt: skip


def emit(result: dict) -> None:
    """A side's figures as one JSON line on stdout, at once: the parent reads the last such line."""
    print(json.dumps(result), flush=True)


# --------------------------------------------------------------------------------------------------------------
# (a) upstream's loop


def run_seed(args, workdir: Path) -> dict:
    import torch
    from grpo_step import load_shared, prompt_cut
    from seed_loop import SeedArgs, SeedGRPOLoop
    from step_profile import profiled_step

    from minimind_trl import MiniMindForCausalLM

    tokenizer, reward_model, reward_tokenizer, conversations = load_shared(workdir)
    torch.manual_seed(42)
    policy = MiniMindForCausalLM.from_pretrained(workdir / "policy", dtype=torch.float32).to(args.device)
    reference = MiniMindForCausalLM.from_pretrained(workdir / "policy", dtype=torch.float32).to(args.device)
    prompts = [tokenizer.apply_chat_template(c, tokenize=False, add_generation_prompt=True) for c in conversations]
    seed_args = SeedArgs(num_generations=args.generations, max_gen_len=args.new_tokens, min_new_tokens=args.new_tokens,
                         max_seq_len=prompt_cut(args), autocast_dtype=torch.bfloat16)  # fmt: skip
    loop = SeedGRPOLoop(policy, reference, tokenizer, lambda chat: reward_model.get_score(reward_tokenizer, chat),
                        seed_args, total_steps=args.warmup + args.steps + int(args.profile))  # fmt: skip
    records = []
    for index in range(args.warmup + args.steps):
        if index == args.warmup:
            memory_reset(args.device)
        records.append(loop.step(prompts))
    timed = records[args.warmup :]
    tokens = [r["stats"]["completion_tokens"] for r in timed]
    phases = {k: statistics.median(r["times"][k] for r in timed) for k in PHASES}
    result = with_peak({"s_per_step": statistics.median(r["times"]["total"] for r in timed), "phases": phases,
                        "completion_tokens_per_step": statistics.median(tokens), "precision": "bf16 autocast"
                        if args.device == "cuda" else "fp32"}, args.device)  # fmt: skip
    if args.profile:  # one more step, untimed, under the profiler; the timed figures first (kept if it is stopped)
        emit(result)
        with profiled_step(args.device, lambda: synchronized(args.device)) as profile:
            loop.step(prompts)
        result["profile"] = profile
    return result


# --------------------------------------------------------------------------------------------------------------
# (b) minimind-trl's trainer


def compile_counters(skip_reasons: list[str]) -> dict:
    """What torch.compile did in this process: graphs compiled (each recompilation adds one) and the graphs inductor
    ran without CUDA graphs although asked for them (`reduce-overhead`), with the reasons it logged."""
    from torch._dynamo.utils import counters

    return {"compiled_graphs": counters["stats"]["unique_graphs"],
            "cudagraph_skips": counters["inductor"]["cudagraph_skips"],
            "cudagraph_skip_reasons": sorted(set(skip_reasons))}  # fmt: skip


def cudagraphs_logger() -> str:
    """The logger on which inductor says why it skipped CUDA graphs (`log_cudagraph_skip_and_bump_counter`)."""
    from torch._inductor import cudagraph_utils

    return cudagraph_utils.cudagraphs_log.name


def decode_precision(trainer) -> str:
    """What the rollouts' GEMMs run in, by the trainer's settings: the lean sampler drops accelerate's autocast wrapper
    and decodes in its weights' dtype (the policy's, or `sampling_weights_dtype`'s: bf16 by default on CPUs with
    native bf16 only); stock `generate` (the compiled variants) calls the wrapped forward, under bf16 autocast when
    training in bf16."""
    weights = next(trainer.accelerator.unwrap_model(trainer.model).parameters()).dtype
    if trainer._sampler is not None:
        return str(trainer._sampler.weights_dtype or weights).removeprefix("torch.")
    return "bf16 autocast" if trainer.args.bf16 else str(weights).removeprefix("torch.")


class LoggedWarnings(logging.Handler):
    """The messages of WARNING and above that a logger emits while attached: inductor logs why it runs a graph
    without CUDA graphs (on its `cudagraphs` artifact logger) and only counts the skip, so a failing side can say why
    in its error rather than in a log tail that a traceback may push out."""

    def __init__(self, logger_name: str):
        super().__init__(logging.WARNING)
        self.logger, self.messages = logging.getLogger(logger_name), []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())

    def __enter__(self) -> list[str]:
        self.logger.addHandler(self)
        return self.messages

    def __exit__(self, *exc) -> None:
        self.logger.removeHandler(self)


def run_ours(args, workdir: Path, variant: str) -> dict:
    import torch
    from datasets import Dataset
    from grpo_step import _PhaseRecorder, load_shared, log_prob_head, prompt_cut
    from step_profile import profiled_step
    from transformers import TrainerCallback

    from minimind_trl.rewards import RewardModelReward, format_reward, tag_count_reward
    from minimind_trl.rewards import InternLM2Scorer
    from minimind_trl.trainer import MiniMindGRPOConfig, MiniMindGRPOTrainer

    tokenizer, reward_model, reward_tokenizer, conversations = load_shared(workdir)
    rows, total_steps = args.prompts * args.generations, args.warmup + args.steps + int(args.profile)
    compiled = variant in COMPILED
    config = MiniMindGRPOConfig(
        output_dir=str(workdir / f"ours-{variant}"), use_cpu=args.device == "cpu", per_device_train_batch_size=rows,
        generation_batch_size=rows, num_generations=args.generations, max_prompt_length=prompt_cut(args),
        max_completion_length=args.new_tokens, generation_kwargs={"min_new_tokens": args.new_tokens},
        share_prompts=True if variant == "share_prompts" else None,
        compile_generation=COMPILED.get(variant), max_steps=total_steps, shuffle_dataset=False,
        save_strategy="no", report_to=[], disable_tqdm=True, logging_steps=1, dataloader_num_workers=0,
    )  # fmt: skip
    scorer = InternLM2Scorer(reward_model, reward_tokenizer, batch_size=32)
    device = args.device
    recorder = _PhaseRecorder(synchronize=lambda: synchronized(device))  # a span ends when its kernels do

    class Synchronize(TrainerCallback):  # step edges after the device's queued work, peak memory from the first timed
        def on_step_begin(self, a, state, control, **kwargs):
            synchronized(device)
            if state.global_step == args.warmup:
                memory_reset(device)

        def on_step_end(self, a, state, control, **kwargs):
            synchronized(device)

    class ProfileLastStep(TrainerCallback):  # with --profile: the extra step after the timed ones
        def __init__(self):
            self.block, self.profile, self.timed = None, None, None

        def on_step_begin(self, a, state, control, **kwargs):
            if args.profile and state.global_step == args.warmup + args.steps:
                # the timed figures (peak memory included) before the profiled step: what the side reports, and
                # what it keeps if it is stopped while profiling
                self.timed = with_peak(measured(), device)
                emit(self.timed)
                self.block = profiled_step(device, lambda: synchronized(device))
                self.profile = self.block.__enter__()

        def on_step_end(self, a, state, control, **kwargs):
            if self.block is not None:
                self.block.__exit__(None, None, None)
                self.block = None

    profiler = ProfileLastStep()
    torch.manual_seed(42)
    # the profiler's callback before the recorder's: at the profiled step's begin the recorder has not opened it yet
    trainer = MiniMindGRPOTrainer(
        str(workdir / "policy"), reward_funcs=[format_reward, tag_count_reward, RewardModelReward(scorer, tokenizer=tokenizer)],
        args=config, train_dataset=Dataset.from_dict({"prompt": conversations * total_steps}),
        processing_class=tokenizer, callbacks=[Synchronize(), profiler, recorder.callback()],
    )  # fmt: skip
    levers = {"log_prob_head": log_prob_head(trainer.accelerator.unwrap_model(trainer.model)),
              "shared_prompts": trainer._shares_prompts, "lean_sampler": trainer._sampler is not None,
              "decode_precision": decode_precision(trainer),
              "cache_implementation": trainer.generation_config.cache_implementation}  # fmt: skip
    skips = LoggedWarnings(cudagraphs_logger()) if compiled else None
    skip_reasons = skips.messages if skips else []

    def measured() -> dict:
        """The timed steps' figures, after the checks that make them this variant's."""
        if compiled:  # the compiled forward really ran (transformers keeps it on the model once built)
            model = trainer.accelerator.unwrap_model(trainer.model)
            levers["compiled_forward"] = getattr(model, "_compiled_call", None) is not None
            if not levers["compiled_forward"]:
                raise RuntimeError(f"variant {variant}: generate did not compile the forward (static cache not taken?)")
            levers.update(compile_counters(skip_reasons))
            if device == "cuda" and COMPILED[variant] == "reduce-overhead" and levers["cudagraph_skips"]:
                # inductor falls back to the plain compiled graph and goes on: its speed would not be CUDA graphs'
                raise RuntimeError(f"variant {variant}: CUDA graphs skipped {levers['cudagraph_skips']} time(s): "
                                   f"{'; '.join(levers['cudagraph_skip_reasons'])[:1500]}")  # fmt: skip
        steps = recorder.step_times()[args.warmup : args.warmup + args.steps]
        lengths = recorder.logged_lengths
        if any(length != (args.new_tokens, args.new_tokens) for length in lengths):
            raise RuntimeError(f"completion lengths (min, max) per step {lengths}; expected {args.new_tokens}")
        return {**step_medians(steps), "completion_tokens_per_step": rows * args.new_tokens, "levers": dict(levers),
                "precision": "bf16" if trainer.args.bf16 else "fp32"}  # fmt: skip

    with recorder.trl_spans(), skips or contextlib.nullcontext():
        trainer.train()
    if profiler.timed is None:
        return with_peak(measured(), device)
    return {**profiler.timed, "profile": profiler.profile}


# --------------------------------------------------------------------------------------------------------------
# Parent


def model_flops(args, workdir: Path) -> float:
    """One step's FLOPs (generation, log-probs, backward; the reward model's left out), every prompt per completion."""
    from grpo_step import prompt_cut, templated_length
    from roofline import StepShapes, phase_flops
    from transformers import AutoConfig, AutoTokenizer

    import minimind_trl  # noqa: F401  (registers MiniMind's config)

    tokenizer = AutoTokenizer.from_pretrained(workdir / "policy")
    conversations = json.loads((workdir / "prompts.json").read_text())
    lengths = [min(prompt_cut(args), templated_length(tokenizer, c)) for c in conversations]
    shapes = StepShapes.from_config(AutoConfig.from_pretrained(workdir / "policy"),
                                    completions=args.prompts * args.generations, groups=args.prompts,
                                    prompt_tokens=round(statistics.mean(lengths)), new_tokens=args.new_tokens,
                                    rm_hidden=args.rm_hidden_size, rm_layers=args.rm_layers)  # fmt: skip
    flops = phase_flops(shapes)
    return flops["generation"] + flops["logprobs"] + flops["backward_step"]


def child(role: str, argv: list[str], workdir: Path, timeout: float) -> dict:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    command = [sys.executable, __file__, *argv, "--role", role, "--workdir", str(workdir)]
    start = time.perf_counter()
    try:
        result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as stopped:
        status, stdout, error = "timeout", stopped.stdout, f"stopped after {timeout:.0f} s"
    else:
        status, stdout, error = "ok" if result.returncode == 0 else "failed", result.stdout, None
        if status == "failed":
            sys.stderr.write(result.stdout[-3000:] + result.stderr[-6000:])
            error = (result.stderr.strip().splitlines() or ["?"])[-1][-500:]
    figures = last_json_line(stdout)
    if status == "ok":
        return {"status": "ok", "wall_s": time.perf_counter() - start, **figures}
    if figures is None or "--profile" not in argv:
        return {"status": status, "error": error}
    # the timed figures came out before the profiled step was stopped or broke: kept, and the profile's error reported
    while_profiling = ", while profiling" if status == "timeout" else ""
    return {"status": "ok", "wall_s": time.perf_counter() - start, **figures,
            "profile": {"error": error + while_profiling}}  # fmt: skip


def last_json_line(stdout: str | bytes | None) -> dict | None:
    """The last line of a side's output that holds its figures (a stopped side's output may end mid-line)."""
    if isinstance(stdout, bytes):
        stdout = stdout.decode(errors="replace")
    for line in reversed((stdout or "").strip().splitlines()):
        if line.startswith("{"):
            try:
                figures = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(figures, dict) and "s_per_step" in figures:
                return figures
    return None


def side_timeout(longest: float, sides_left: int, margin: float = 15.0) -> float:
    """A side's limit: `longest`, or less where the check's part ends sooner (`GPU_CHECK_DEADLINE`, epoch seconds),
    shared by the sides still to run, so that a slow side costs itself and the summary of the others still prints."""
    deadline = os.environ.get("GPU_CHECK_DEADLINE")
    if deadline is None:
        return longest
    return max(min(longest, (float(deadline) - time.time() - margin) / sides_left), 1.0)


def report(args, results: dict, flops: float, peak: dict) -> dict:
    summary = {"device": args.device, "hidden_size": args.hidden_size, "layers": args.layers, "generation":
               args.generation, "moe": args.moe, "prompts": args.prompts, "generations": args.generations,
               "prompt_tokens": args.prompt_tokens, "new_tokens": args.new_tokens, "steps": args.steps,
               "warmup": args.warmup, "model_gflop_per_step": flops / 1e9, **peak, "sides": {}}  # fmt: skip
    print(f"{'side':<24}{'status':>9}{'s/step':>9}{'gen s':>8}{'gen tok/s':>11}{'peak MB':>10}{'MFU':>8}{'(a)/side':>9}")
    seed = results.get("seed", {})
    for side, r in results.items():
        if r.get("status") == "ok":
            r["gen_tokens_per_s"] = r["completion_tokens_per_step"] / r["phases"]["generation"]
            r["mfu"] = flops / r["s_per_step"] / (peak["peak_tflops"] * 1e12)
            if peak.get("datasheet_bf16_tflops"):
                r["mfu_datasheet"] = flops / r["s_per_step"] / (peak["datasheet_bf16_tflops"] * 1e12)
            if seed.get("status") == "ok" and side != "seed":
                r["speedup_vs_seed"] = seed["s_per_step"] / r["s_per_step"]
            print(f"{side:<24}{'ok':>9}{r['s_per_step']:>9.3f}{r['phases']['generation']:>8.3f}"
                  f"{r['gen_tokens_per_s']:>11.1f}{r['peak_memory_mb'] or float('nan'):>10.0f}{r['mfu']:>8.1%}"
                  f"{r.get('speedup_vs_seed', 1.0):>8.2f}x")  # fmt: skip
            prof = r.get("profile")
            if prof and "error" in prof:
                print(f"  profiled step: failed: {prof['error']}")
            elif prof:
                busy = f"{prof['device_busy']:.0%}" if prof["device_events"] else "n/a"
                print(f"  profiled step: {prof['wall_s']:.3f} s, device busy {busy} ({prof['device_events']} device "
                      f"events), {prof['launches']} kernel launches ({prof['launch_cpu_s']:.3f} s of CPU), "
                      f"{prof['graph_launches']} CUDA graph replays"
                      + ("; TRUNCATED: fewer kernels recorded than launched" if prof["truncated"] else ""))  # fmt: skip
        else:
            print(f"{side:<24}{r['status']:>9}  {r.get('error', r.get('reason', ''))}")
        summary["sides"][side] = r
    return summary


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.role:
        import torch

        if args.device == "cpu":
            torch.set_num_threads(1)
        memory_reset(args.device)
        workdir = Path(args.workdir)
        result = run_seed(args, workdir) if args.role == "seed" else run_ours(args, workdir, args.role.split(":")[1])
        emit(result)
        return 0
    import torch
    from grpo_step import prepare

    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device here: run with --cpu for the tiny CPU form")
    peak = bf16_peak_tflops(args.device)
    name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    print(f"device {name}; GEMM peak {peak['peak_tflops']:.1f} TFLOP/s ({peak['peak_dtype']} {peak['peak_shape']}^3)")
    with tempfile.TemporaryDirectory(prefix="gpu_step_") as tmp:
        workdir = Path(tmp)
        prepare(args, workdir)
        flops = model_flops(args, workdir)
        sides = ([] if args.no_seed else ["seed"]) + [f"ours:{variant}" for variant in args.variants]
        results = {}
        for done, side in enumerate(sides):
            results[side] = child(side, argv, workdir, side_timeout(args.side_timeout, len(sides) - done))
    sheet = next((tflops for key, tflops in DATASHEET_BF16_TFLOPS.items() if key in name), None)
    summary = report(args, results, flops, {"gpu": name, **peak, "datasheet_bf16_tflops": sheet})
    print(json.dumps(summary))
    profile_failed = any("error" in r.get("profile", {}) for r in results.values())  # the figures kept, but loud
    return 0 if all(r["status"] in ("ok", "skipped") for r in results.values()) and not profile_failed else 1


if __name__ == "__main__":
    sys.exit(main())
