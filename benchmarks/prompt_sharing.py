"""The log-prob passes alone, each prompt computed once per group against once per completion (`share_prompts`).

One GRPO micro-batch (`--prompts` groups of `--generations` completions; the second prompt 3/4 as long as the first,
so it is left-padded, as in a real batch): the policy pass (forward over the completions' log-probs, backward) and
the no-grad reference pass, through `MiniMindModel`'s plain forward and its `shared_prefix_length` path, on CPU or
a GPU. It prints the agreement (largest log-prob difference, largest relative gradient difference over the
parameters; in fp32 the trainer's tests hold these to 1e-5 and 1e-4) and the median seconds of each pass. The LM
head scores the completion positions only, as the trainer's log-prob heads do. The last line is one JSON object.

    python benchmarks/prompt_sharing.py --threads 1                                 # the benchmark's model, CPU
    python benchmarks/prompt_sharing.py --device cuda --hidden-size 768 --layers 16 --prompt-tokens 512 \\
        --new-tokens 1024 --dtype bf16                                              # MiniMind2's size on a GPU
"""

import argparse
import json
import statistics
import time

import torch


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--generation", choices=["minimind2", "minimind3"], default="minimind2")
    parser.add_argument("--hidden-size", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--vocab-size", type=int, default=6400)
    parser.add_argument("--moe", action="store_true", help="MoE (4 experts, top-2)")
    parser.add_argument("--prompts", type=int, default=2, help="groups in the micro-batch")
    parser.add_argument("--generations", type=int, default=8, help="completions per prompt")
    parser.add_argument("--prompt-tokens", type=int, default=62, help="the longer prompt's tokens")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32", help="fp32, or bf16 autocast")
    parser.add_argument("--reps", type=int, default=5, help="timed repetitions (median), after one warm-up")
    parser.add_argument("--threads", type=int, default=None)
    return parser.parse_args(argv)


def build(args):
    from minimind_trl import MiniMindConfig, MiniMindForCausalLM

    torch.manual_seed(0)
    config = MiniMindConfig(
        minimind_generation=args.generation, hidden_size=args.hidden_size, num_hidden_layers=args.layers,
        num_attention_heads=args.heads, num_key_value_heads=args.kv_heads, vocab_size=args.vocab_size,
        use_moe=args.moe, num_experts=4, num_experts_per_tok=2,
        max_position_embeddings=max(32768, args.prompt_tokens + args.new_tokens),
    )  # fmt: skip
    model = MiniMindForCausalLM(config).to(args.device).train()
    with torch.no_grad():  # weights large enough that fp32 gradients are well conditioned
        for param in model.parameters():
            param.normal_(0.0, 0.3 / max(1.0, (args.hidden_size / 64) ** 0.5)) if param.ndim == 2 else param.fill_(1)
    generator = torch.Generator().manual_seed(1)
    rows, prompt, new = args.prompts * args.generations, args.prompt_tokens, args.new_tokens
    prompt_ids = torch.zeros(rows, prompt, dtype=torch.long)
    prompt_mask = torch.zeros(rows, prompt, dtype=torch.long)
    for group in range(args.prompts):
        length = prompt if group % 2 == 0 else max(1, 3 * prompt // 4)
        rows_of_group = slice(group * args.generations, (group + 1) * args.generations)
        prompt_ids[rows_of_group, prompt - length :] = torch.randint(3, args.vocab_size, (length,), generator=generator)
        prompt_mask[rows_of_group, prompt - length :] = 1
    completions = torch.randint(3, args.vocab_size, (rows, new), generator=generator)
    input_ids = torch.cat([prompt_ids, completions], dim=1).to(args.device)
    attention_mask = torch.cat([prompt_mask, torch.ones_like(completions)], dim=1).to(args.device)
    return model, input_ids, attention_mask


def completion_log_probs(model, input_ids, attention_mask, new_tokens, shared_length):
    """Per-token log-probs of the completion tokens (the LM head at completion positions only) and the MoE loss."""
    output = model.model(input_ids, attention_mask=attention_mask, use_cache=False, shared_prefix_length=shared_length)
    hidden = output.last_hidden_state[:, -new_tokens - 1 : -1]
    logits = model.lm_head(hidden).float()
    return logits.log_softmax(-1).gather(-1, input_ids[:, -new_tokens:, None]).squeeze(-1), output.aux_loss


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(args, function) -> float:
    synchronize(args.device)
    start = time.perf_counter()
    function()
    synchronize(args.device)
    return time.perf_counter() - start


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    model, input_ids, attention_mask = build(args)
    prompt = args.prompt_tokens
    from minimind_trl.models.minimind.shared_prefix_minimind import SharedPrefix

    groups = SharedPrefix.find(input_ids, attention_mask, prompt)  # what the shared path will find
    if groups is None:
        raise SystemExit("no two rows share their prompt: nothing to share (--generations must be 2 or more)")
    autocast = torch.autocast(torch.device(args.device).type, dtype=torch.bfloat16, enabled=args.dtype == "bf16")
    weights = torch.linspace(-1.0, 1.0, input_ids.shape[0] * args.new_tokens, device=args.device)

    def policy_pass(shared_length):
        model.zero_grad(set_to_none=True)
        with autocast:
            log_probs, aux_loss = completion_log_probs(model, input_ids, attention_mask, args.new_tokens, shared_length)
        loss = (log_probs.flatten() * weights).sum() + (aux_loss if aux_loss is not None else 0.0)
        loss.backward()
        return log_probs.detach(), {name: p.grad.float().clone() for name, p in model.named_parameters()}

    def reference_pass(shared_length):
        with torch.no_grad(), autocast:
            return completion_log_probs(model, input_ids, attention_mask, args.new_tokens, shared_length)[0]

    results, outputs = {}, {}
    for side, shared_length in (("plain", None), ("shared", prompt)):
        outputs[side] = policy_pass(shared_length)
        policy = [timed(args, lambda s=shared_length: policy_pass(s)) for _ in range(args.reps)]
        reference_pass(shared_length)
        reference = [timed(args, lambda s=shared_length: reference_pass(s)) for _ in range(args.reps)]
        results[side] = {"policy_s": statistics.median(policy), "reference_s": statistics.median(reference)}
    (plain_lp, plain_grads), (shared_lp, shared_grads) = outputs["plain"], outputs["shared"]
    grad_error = max(
        ((shared_grads[name] - grad).norm() / grad.norm().clamp(min=1e-30)).item() for name, grad in plain_grads.items()
    )
    summary = {
        "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
        "dtype": args.dtype, "generation": args.generation, "moe": args.moe, "hidden_size": args.hidden_size,
        "layers": args.layers, "rows": input_ids.shape[0], "distinct_prompts": len(groups.rows),
        "prompt_tokens": prompt, "new_tokens": args.new_tokens,
        "max_log_prob_diff": (shared_lp - plain_lp).abs().max().item(), "max_relative_grad_diff": grad_error,
        **{f"{side}_{key}": value for side, r in results.items() for key, value in r.items()},
    }  # fmt: skip
    summary["policy_speedup"] = summary["plain_policy_s"] / summary["shared_policy_s"]
    summary["reference_speedup"] = summary["plain_reference_s"] / summary["shared_reference_s"]
    print(
        f"{summary['device']}, {args.dtype}, {args.generation}{' MoE' if args.moe else ''} h{args.hidden_size} x "
        f"{args.layers}; {summary['rows']} rows = {args.prompts} prompts ({prompt} tokens) x {args.generations}, "
        f"{args.new_tokens} new tokens; median of {args.reps}"
    )
    print(
        f"agreement: log-probs {summary['max_log_prob_diff']:.2e} (max abs), gradients "
        f"{summary['max_relative_grad_diff']:.2e} (max relative)"
    )
    for name in ("policy", "reference"):
        print(
            f"{name:<10} plain {summary[f'plain_{name}_s']:.4f} s, shared {summary[f'shared_{name}_s']:.4f} s: "
            f"{summary[f'{name}_speedup']:.2f}x"
        )
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
