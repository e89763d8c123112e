"""How much does decoding with bf16 GEMM weights change the distribution rollouts are sampled from?

`sampling_weights_dtype: auto` (the default) decodes with bf16 GEMM weights when training with `bf16: true`
(`DecodeKernel`: only the GEMM operands are rounded; norms, RoPE, attention and the KV cache stay fp32). The loss
always scores the real weights, so the question is how far the sampling distribution moves. This script follows
one set of trajectories (sampled from the exact fp32 distribution at temperature 0.8, as upstream samples) and,
at every decoding step, compares the next-token distribution of

  kernel bf16   the decode kernel with bf16 GEMM weights (this package's default under bf16: true)
  autocast      the model's modules under bf16 autocast (what upstream's rollouts do on a GPU with --dtype bfloat16)

against the exact fp32 one: mean KL(fp32 || other) of the tempered distributions, the mean |difference| of the
sampled token's log-probability (the importance ratio that sampling from the rounded model leaves uncorrected),
and how often the most likely token is the same. The model's final norm is scaled until the mean next-token
entropy is that of a trained small LM (`--entropy`), as in `bf16_kl.py`. Ends with one JSON line.
"""

import argparse
import json
import sys
from pathlib import Path

import torch
from transformers import DynamicCache

from minimind_trl import MiniMindForCausalLM
from minimind_trl.trainer.speed.decode_kernel import DecodeKernel

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bf16_kl import add_model_arguments, calibrate_entropy, model_config  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_model_arguments(parser)
    parser.add_argument("--new-tokens", type=int, default=96)
    parser.add_argument("--temperature", type=float, default=0.8)
    return parser.parse_args(argv)


def compare(exact: torch.Tensor, other: torch.Tensor, tokens: torch.Tensor, temperature: float) -> dict:
    """KL(exact || other) of the tempered distributions, |log-p difference| of `tokens`, top-1 agreement."""
    log_p = (exact.double() / temperature).log_softmax(-1)
    log_q = (other.double() / temperature).log_softmax(-1)
    kl = (log_p.exp() * (log_p - log_q)).sum(-1)
    token_diff = (log_p - log_q).gather(1, tokens[:, None]).abs()
    return {"kl": kl.mean().item(), "logp_diff": token_diff.mean().item(), "top1": (exact.argmax(-1) == other.argmax(-1)).float().mean().item()}


def main(argv=None):
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    config = model_config(args)
    model = MiniMindForCausalLM(config).eval()
    prompts = torch.randint(3, args.vocab, (args.rows, args.prompt_tokens))
    scale, entropy = calibrate_entropy(model, prompts[:2], args.entropy)
    print(
        f"model h{args.hidden_size} x {args.layers} layers, vocab {args.vocab}; final-norm scale {scale:.2f}, mean "
        f"next-token entropy {entropy:.2f} nats; {args.rows} rows x {args.new_tokens} new tokens, T={args.temperature}"
    )
    mask = torch.ones_like(prompts)
    positions = torch.arange(args.prompt_tokens).expand(args.rows, -1)
    generator = torch.Generator().manual_seed(args.seed + 1)
    sums = {"kernel_bf16": [], "autocast": []}
    with torch.no_grad():
        exact_cache, autocast_cache = DynamicCache(config=config), DynamicCache(config=config)
        logits = model(input_ids=prompts, position_ids=positions, cache=exact_cache, use_cache=True, logits_to_keep=1).logits[:, -1]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            model(input_ids=prompts, position_ids=positions, cache=autocast_cache, use_cache=True, logits_to_keep=1)
        kernel = DecodeKernel(model, torch.bfloat16)
        kernel.start(exact_cache, mask, args.new_tokens)  # a copy of the prompt's cache as the fp32 prefill left it
        step_mask = torch.ones(args.rows, args.prompt_tokens + args.new_tokens, dtype=torch.long)
        tokens = torch.multinomial((logits.float() / args.temperature).softmax(-1), 1, generator=generator)[:, 0]
        for step in range(args.new_tokens):
            position = torch.full((args.rows,), args.prompt_tokens + step)
            step_inputs = dict(
                input_ids=tokens[:, None], attention_mask=step_mask[:, : args.prompt_tokens + step + 1],
                position_ids=position[:, None], use_cache=True,
            )  # fmt: skip
            exact = model(**step_inputs, cache=exact_cache).logits[:, -1]
            bf16 = kernel.step(tokens, position)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                autocast = model(**step_inputs, cache=autocast_cache).logits[:, -1].float()
            tokens = torch.multinomial((exact / args.temperature).softmax(-1), 1, generator=generator)[:, 0]
            sums["kernel_bf16"].append(compare(exact, bf16, tokens, args.temperature))
            sums["autocast"].append(compare(exact, autocast, tokens, args.temperature))
    results = {
        name: {key: sum(row[key] for row in rows) / len(rows) for key in rows[0]} for name, rows in sums.items()
    }
    for name, row in results.items():
        print(
            f"{name:<12} KL(fp32 || {name}) {row['kl']:.2e} nats/token   |log-p difference| of the sampled token "
            f"{row['logp_diff']:.2e}   top-1 agreement {row['top1']:.1%}"
        )
    print(json.dumps({"entropy": entropy, "args": vars(args), "results": results}))


if __name__ == "__main__":
    main()
