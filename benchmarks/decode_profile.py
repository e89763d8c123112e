"""Where a rollout's decoding time goes: the lean sampler's loop (`FastSampler` through `DecodeKernel`) split into
its parts, beside the decode GEMMs' roofline.

`grpo_step.py` measures the generation phase whole (23-28 % of its roofline on Zen 4). This script runs the same
rollouts (the benchmark's model, 16 rows = 2 prompts x 8 completions, temperature 0.8, top-k 50, exactly
`--new-tokens` tokens) with every part of the loop timed (exclusive time, the process's CPU time with one thread):

    prefill          the model's forward over the prompts (module path, one call per round)
    cache copy-in    `DecodeKernel.start`: the prompt's keys/values into the preallocated cache, the RoPE table
    gemm:<name>      each decode GEMM (`PackedGemm`): qkv, o, gate_up, down, shared experts, the LM head
    attention        `DecodeKernel._attention` (scores `baddbmm`, softmax, `bmm`)
    norms            `DecodeKernel._norm` (RMSNorm, also the q/k norms of MiniMind-3)
    moe routing+experts   `DecodeKernel._moe` without its shared experts' GEMMs (router, top-k, batched experts)
    step other       the rest of `DecodeKernel._step`: embedding, RoPE, cache writes, residual adds, casts
    top-k sampling   `fast_sampling._sample_top_k`
    loop other       the sampler's loop outside the step and the draw (EOS bookkeeping, scores cast, `isin`)
    generate setup   `FastSampler.generate` around the loop (generation config, repeated prompts)

A second, untimed round gives the loop's real time; the difference is what the timers themselves cost, and the
parts are scaled to the real time in the "scaled" column. The GEMM rows also show their speed against this
machine's peak for the decode shape at its working set (`roofline.gemm_gflops`, the figure `grpo_step.py` uses).

    python benchmarks/decode_profile.py --threads 1                       # the 128-token benchmark's rollouts
    python benchmarks/decode_profile.py --threads 1 --new-tokens 512
    python benchmarks/decode_profile.py --threads 1 --moe

The last line printed is one JSON object (`parts` in seconds per round, `real_s`, `timed_s`, `gemm_gflops`, ...).
"""

import argparse
import functools
import json
import sys
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden-size", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--vocab-size", type=int, default=6400)
    parser.add_argument("--moe", action="store_true", help="MiniMind2 MoE (4 experts, top-2, 1 shared expert)")
    parser.add_argument("--rows", type=int, default=16, help="completions decoded together")
    parser.add_argument("--prompt-tokens", type=int, default=62)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument(
        "--weights", choices=["auto", "fp32", "bf16"], default="auto",
        help="decode GEMM weights: auto (bf16 where this CPU computes it natively, as the trainer chooses), fp32, bf16",
    )  # fmt: skip
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds (medians reported), after one warm-up")
    return parser.parse_args(argv)


class PartTimer:
    """Exclusive time per part: a part's time excludes the parts timed inside it."""

    def __init__(self, clock):
        self.clock, self.seconds, self.calls, self.stack = clock, defaultdict(float), defaultdict(int), []

    def wrap(self, name, function):
        @functools.wraps(function)
        def timed(*args, **kwargs):
            part = name(*args) if callable(name) else name
            self.stack.append(0.0)
            start = self.clock()
            try:
                return function(*args, **kwargs)
            finally:
                elapsed = self.clock() - start
                inner = self.stack.pop()
                self.seconds[part] += elapsed - inner
                self.calls[part] += 1
                if self.stack:
                    self.stack[-1] += elapsed

        return timed


def gemm_name(config, gemm) -> str:
    """Which decode GEMM a packed weight `[out, in]` is, from its shape."""
    out_width, in_width = gemm.weight.shape
    if out_width == config.vocab_size:
        return "gemm:lm_head"
    if out_width == (config.num_attention_heads + 2 * config.num_key_value_heads) * config.head_dim:
        return "gemm:qkv"
    if out_width == config.hidden_size:
        return "gemm:o" if in_width == config.num_attention_heads * config.head_dim else "gemm:down"
    return "gemm:gate_up"


def build(args):
    from transformers import GenerationConfig

    from minimind_trl import MiniMindConfig, MiniMindForCausalLM
    from minimind_trl.trainer.speed.cpu_precision import machine_choice

    torch.manual_seed(0)
    config = MiniMindConfig(
        hidden_size=args.hidden_size, num_hidden_layers=args.layers, num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads, vocab_size=args.vocab_size, use_moe=args.moe,
        max_position_embeddings=max(32768, args.prompt_tokens + args.new_tokens),
    )  # fmt: skip
    model = MiniMindForCausalLM(config).eval()
    bf16 = args.weights == "bf16" or (args.weights == "auto" and machine_choice().bf16)
    generation = GenerationConfig(
        do_sample=True, temperature=0.8, top_k=50, max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens,
        eos_token_id=2, pad_token_id=0,
    )  # fmt: skip
    prompts = torch.randint(3, args.vocab_size, (2, args.prompt_tokens)).repeat_interleave(args.rows // 2, dim=0)
    return model, generation, prompts, torch.bfloat16 if bf16 else None


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from roofline import StepShapes, clock, decode_weight_bytes, gemm_gflops

    from minimind_trl.trainer.speed import fast_sampling
    from minimind_trl.trainer.speed.decode_kernel import DecodeKernel, PackedGemm
    from minimind_trl.trainer.speed.fast_sampling import FastSampler

    model, generation, prompts, weights_dtype = build(args)
    sampler = FastSampler(weights_dtype=weights_dtype)
    if not sampler.kernel_applies(model):
        raise SystemExit("the decode kernel does not apply to this model")

    def one_round():
        start = clock()
        out = sampler.generate(model, prompts, generation_config=generation)
        assert out.shape == (args.rows, args.prompt_tokens + args.new_tokens)
        return clock() - start

    one_round()  # warm-up: packing, allocation, kernel choice
    real = sorted(one_round() for _ in range(args.rounds))[args.rounds // 2]

    timer = PartTimer(clock)
    config = model.config
    patches = [
        (PackedGemm, "__call__", timer.wrap(lambda gemm, *rest: gemm_name(config, gemm), PackedGemm.__call__)),
        (DecodeKernel, "_attention", timer.wrap("attention", DecodeKernel._attention)),
        (DecodeKernel, "_norm", timer.wrap("norms", DecodeKernel._norm)),
        (DecodeKernel, "_moe", timer.wrap("moe routing+experts", DecodeKernel._moe)),
        (DecodeKernel, "_step", timer.wrap("step other", DecodeKernel._step)),
        (DecodeKernel, "start", timer.wrap("cache copy-in", DecodeKernel.start)),
        (fast_sampling, "_sample_top_k", timer.wrap("top-k sampling", fast_sampling._sample_top_k)),
        (type(model), "forward", timer.wrap("prefill", type(model).forward)),
        (FastSampler, "_sample", timer.wrap("loop other", FastSampler._sample)),
        (FastSampler, "generate", timer.wrap("generate setup", FastSampler.generate)),
    ]
    originals = [(owner, name, getattr(owner, name)) for owner, name, _ in patches]
    for owner, name, wrapped in patches:
        setattr(owner, name, wrapped)
    try:
        timed = []
        per_round = []
        for _ in range(args.rounds):
            timer.seconds.clear()
            timer.calls.clear()
            timed.append(one_round())
            per_round.append(dict(timer.seconds))
    finally:
        for owner, name, original in originals:
            setattr(owner, name, original)
    order = sorted(range(args.rounds), key=lambda i: timed[i])
    middle = order[args.rounds // 2]
    parts, timed_s = per_round[middle], timed[middle]

    shapes = StepShapes.from_config(
        config, completions=args.rows, prompt_tokens=args.prompt_tokens, new_tokens=args.new_tokens, rm_hidden=8,
        rm_layers=1,
    )  # fmt: skip
    dtype = weights_dtype or torch.float32
    peak = gemm_gflops(args.rows, config.hidden_size, config.intermediate_size if not args.moe else
                       config.moe_intermediate_size, dtype, working_set=decode_weight_bytes(shapes, dtype))  # fmt: skip
    gemm_flops = {  # per round: one call per decoding step (new_tokens - 1 steps) and layer
        "gemm:qkv": 2 * args.rows * config.hidden_size * (config.num_attention_heads + 2 * config.num_key_value_heads)
        * config.head_dim * config.num_hidden_layers,
        "gemm:o": 2 * args.rows * config.num_attention_heads * config.head_dim * config.hidden_size
        * config.num_hidden_layers,
        "gemm:lm_head": 2 * args.rows * config.hidden_size * config.vocab_size,
    }  # fmt: skip
    if not args.moe:
        mlp = 2 * args.rows * config.hidden_size * config.intermediate_size * config.num_hidden_layers
        gemm_flops["gemm:gate_up"], gemm_flops["gemm:down"] = 2 * mlp, mlp
    steps = args.new_tokens - 1
    print(
        f"hidden {config.hidden_size}, {config.num_hidden_layers} layers{', MoE' if args.moe else ''}, vocab "
        f"{config.vocab_size}; {args.rows} rows x {args.prompt_tokens} prompt + {args.new_tokens} new tokens; decode "
        f"weights {str(dtype).removeprefix('torch.')}; {torch.get_num_threads()} threads; median of {args.rounds} "
        "rounds"
    )
    print(f"round: {real:.3f} s untimed, {timed_s:.3f} s with the part timers ({timed_s / real - 1:+.1%})")
    print(f"decode GEMM peak here at the decode shape and working set: {peak:.1f} GF/s ({str(dtype)[6:]})")
    print(f"{'part':<22}{'s/round':>9}{'ms/step':>9}{'share':>8}{'scaled s':>10}{'GF/s':>8}{'of decode peak':>15}")
    scale = real / timed_s
    total = sum(parts.values())
    for name, seconds in sorted(parts.items(), key=lambda item: -item[1]):
        line = (
            f"{name:<22}{seconds:>9.3f}{1e3 * seconds / steps:>9.3f}{seconds / total:>8.1%}{seconds * scale:>10.3f}"
        )
        if name in gemm_flops:
            rate = gemm_flops[name] * steps / seconds / 1e9
            line += f"{rate:>8.1f}{rate / peak:>15.1%}"
        print(line)
    summary = {
        "rows": args.rows, "prompt_tokens": args.prompt_tokens, "new_tokens": args.new_tokens, "moe": args.moe,
        "weights": str(dtype).removeprefix("torch."), "threads": torch.get_num_threads(), "real_s": real,
        "timed_s": timed_s, "parts": parts, "decode_peak_gflops": peak,
        "gemm_gflops": {name: gemm_flops[name] * steps / parts[name] / 1e9 for name in gemm_flops if parts.get(name)},
    }  # fmt: skip
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
