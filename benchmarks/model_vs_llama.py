"""MiniMind2 (dense) against transformers' own LlamaForCausalLM holding the same weights.

Dense MiniMind2 is Llama-shaped, so transformers' Llama is the natural speed reference: if our class is
slower, it is overhead we added. The Llama copy comes from `minimind-trl export ... --format llama`
(`--llama-source state-dict` loads the same state dict into `LlamaForCausalLM` strictly instead).
Both models must produce the same logits (checked) before anything is timed.

Times (median over `--reps`, models interleaved so load drifts hit both alike, one process, same threads):
forward (no grad, full logits), forward+backward (mean-logit loss), cached decode (greedy `generate`
of `--new-tokens` tokens). The ratios MiniMind/Llama are judged on the process's CPU time, which other
tenants of a shared machine disturb far less than wall time (printed too); the target is <= 1.05.
The last line is one JSON object.

    python benchmarks/model_vs_llama.py --threads 2
"""

import argparse
import functools
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from minimind_trl import MiniMindConfig, MiniMindForCausalLM

TARGET_RATIO = 1.05
PHASES = ("forward", "forward_backward", "decode")


def build_minimind(args) -> MiniMindForCausalLM:
    torch.manual_seed(0)
    config = MiniMindConfig(
        hidden_size=args.hidden_size,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        vocab_size=args.vocab_size,
    )
    config._attn_implementation = args.attn_implementation
    return MiniMindForCausalLM(config).eval()


def llama_twin(model: MiniMindForCausalLM, workdir: Path, args) -> tuple[LlamaForCausalLM, str]:
    """The Llama twin: `minimind-trl export --format llama` (default), or the same tensors loaded strictly."""
    if args.llama_source == "export":
        src, out = workdir / "minimind", workdir / "llama"
        model.save_pretrained(src)
        subprocess.run(
            [sys.executable, "-m", "minimind_trl.cli", "export", str(src), str(out), "--format", "llama"], check=True
        )
        llama = LlamaForCausalLM.from_pretrained(out, attn_implementation=args.attn_implementation)
        return llama.eval(), "minimind-trl export --format llama"
    cfg = model.config
    llama_config = LlamaConfig(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads,
        hidden_act=cfg.hidden_act,
        max_position_embeddings=cfg.max_position_embeddings,
        rms_norm_eps=cfg.rms_norm_eps,
        rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_parameters["rope_theta"]},
        tie_word_embeddings=True,
        bos_token_id=cfg.bos_token_id,
        eos_token_id=cfg.eos_token_id,
        pad_token_id=cfg.pad_token_id,
    )
    llama_config._attn_implementation = args.attn_implementation
    llama = LlamaForCausalLM(llama_config)
    llama.load_state_dict(model.state_dict(), strict=True)
    return llama.eval(), "state dict loaded strictly into LlamaForCausalLM"


def timed(fn) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process) for one call."""
    start, cpu_start = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - start, time.process_time() - cpu_start


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden-size", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--vocab-size", type=int, default=6400)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=168, help="forward/backward sequence length")
    parser.add_argument("--prompt-len", type=int, default=40, help="decode prompt length")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--attn-implementation", default="sdpa", choices=["sdpa", "eager"])
    parser.add_argument(
        "--llama-source",
        default="export",
        choices=["export", "state-dict"],
        help="build Llama through `minimind-trl export --format llama` or by loading the state dict",
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    minimind = build_minimind(args)
    with tempfile.TemporaryDirectory() as tmp:
        llama, llama_source = llama_twin(minimind, Path(tmp), args)

    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(3, args.vocab_size, (args.batch, args.seq_len), generator=generator)
    prompt = ids[:, : args.prompt_len]
    with torch.no_grad():
        max_diff = (minimind(ids).logits - llama(ids).logits).abs().max().item()
    if max_diff > 1e-4:
        raise SystemExit(f"MiniMind and Llama logits differ by {max_diff:.3g}; the comparison would be meaningless")

    def forward(model):
        with torch.no_grad():
            model(ids)

    def forward_backward(model):
        model.zero_grad(set_to_none=True)
        model(ids).logits.float().mean().backward()

    def decode(model):
        with torch.no_grad():
            model.generate(
                prompt,
                max_new_tokens=args.new_tokens,
                min_new_tokens=args.new_tokens,
                do_sample=False,
                pad_token_id=0,
            )

    # decode outputs must agree too (greedy, same weights)
    with torch.no_grad():
        kw = dict(max_new_tokens=8, min_new_tokens=8, do_sample=False, pad_token_id=0)
        same_tokens = torch.equal(minimind.generate(prompt, **kw), llama.generate(prompt, **kw))

    models = {"minimind": minimind, "llama": llama}
    results = {name: {phase: [] for phase in PHASES} for name in models}
    for model in models.values():  # warm-up
        forward(model), forward_backward(model), decode(model)
    for rep in range(args.reps):
        for phase, fn in (("forward", forward), ("forward_backward", forward_backward), ("decode", decode)):
            for name in ("minimind", "llama") if rep % 2 == 0 else ("llama", "minimind"):
                results[name][phase].append(timed(functools.partial(fn, models[name])))

    summary = {
        "hidden_size": args.hidden_size,
        "layers": args.layers,
        "threads": args.threads,
        "batch": args.batch,
        "seq_len": args.seq_len,
        "new_tokens": args.new_tokens,
        "reps": args.reps,
        "llama_source": llama_source,
        "max_logit_diff": max_diff,
        "same_greedy_tokens": same_tokens,
    }
    print(f"MiniMind2 dense h{args.hidden_size} x{args.layers} vs LlamaForCausalLM ({llama_source})")
    print(f"max |logit diff| {max_diff:.2e}; greedy decode tokens equal: {same_tokens}")
    print(
        f"{'phase':<18}{'minimind cpu s':>16}{'llama cpu s':>13}{'ratio':>8}"
        f"{'minimind wall':>15}{'llama wall':>12}{'ratio':>8}"
    )
    worst = 0.0
    for phase in PHASES:
        (ours_wall, ours), (theirs_wall, theirs) = (
            (statistics.median(w for w, _ in results[n][phase]), statistics.median(c for _, c in results[n][phase]))
            for n in ("minimind", "llama")
        )
        ratio, wall_ratio = ours / theirs, ours_wall / theirs_wall
        worst = max(worst, ratio)
        summary[f"minimind_{phase}_cpu_s"], summary[f"llama_{phase}_cpu_s"], summary[f"{phase}_ratio"] = (
            ours,
            theirs,
            ratio,
        )
        summary[f"minimind_{phase}_wall_s"], summary[f"llama_{phase}_wall_s"] = ours_wall, theirs_wall
        summary[f"{phase}_wall_ratio"] = wall_ratio
        print(
            f"{phase:<18}{ours:>16.4f}{theirs:>13.4f}{ratio:>8.3f}{ours_wall:>15.4f}{theirs_wall:>12.4f}{wall_ratio:>8.3f}"
        )
    summary["worst_ratio"] = worst
    summary["target_met"] = worst <= TARGET_RATIO
    print(
        f"worst MiniMind/Llama CPU-time ratio {worst:.3f} (target <= {TARGET_RATIO}): "
        f"{'met' if worst <= TARGET_RATIO else 'NOT met'}"
    )
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
