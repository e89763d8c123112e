"""How much does computing the reference log-probs under bf16 autocast change the KL term?

Under `bf16: true` TRL runs every log-prob forward, the reference's included, under `accelerator.autocast()`.
Upstream's `train_grpo.py` computed the policy's log-probs under autocast but the reference's in fp32 (its
`torch.no_grad()` block sits outside the autocast context). This script takes the trainer's own log-prob path
(`MiniMindGRPOTrainer._get_per_token_logps_and_entropies`, bf16 autocast on CPU as `use_cpu` + `bf16` gives)
for the policy and the reference, and a plain fp32 forward for upstream's reference, and prints the mean k3 KL:

  fp32   both models in fp32 (the exact value)
  ours   policy and reference under bf16 autocast (this package)
  upstr. policy under bf16 autocast, reference in fp32 (upstream on a GPU)

at a few distances between policy and reference (the policy = reference + Gaussian noise on every weight).
Random weights give near-uniform next-token distributions, so the final norm is scaled until the mean next-token
entropy is that of a trained small LM (`--entropy`, nats). Ends with one JSON line.
"""

import argparse
import json
import tempfile

import torch
from datasets import Dataset

from minimind_trl import MiniMindConfig, MiniMindForCausalLM
from minimind_trl.models.minimind.tokenization_minimind import build_minimind_tokenizer
from minimind_trl.trainer import MiniMindGRPOConfig, MiniMindGRPOTrainer


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """The model shape, batch and target entropy (shared with `bf16_sampling.py`)."""
    parser.add_argument("--hidden-size", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--entropy", type=float, default=2.5, help="target mean next-token entropy (nats)")
    parser.add_argument("--vocab", type=int, default=6400)
    parser.add_argument("--seed", type=int, default=0)


def model_config(args) -> MiniMindConfig:
    return MiniMindConfig(
        hidden_size=args.hidden_size,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        vocab_size=args.vocab,
    )


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_model_arguments(parser)
    parser.add_argument("--completion-tokens", type=int, default=96)
    parser.add_argument("--noise", type=float, nargs="+", default=[0.0, 1e-4, 3e-4, 1e-3])
    return parser.parse_args(argv)


def k3(reference_logps: torch.Tensor, policy_logps: torch.Tensor) -> float:
    """Mean over tokens of upstream's per-token KL, exp(d) - d - 1 with d = ref - policy (in float64)."""
    d = reference_logps.double() - policy_logps.double()
    return (torch.exp(d) - d - 1).mean().item()


def fp32_logps(model, input_ids, n_keep):
    with torch.no_grad():
        logits = model(input_ids, logits_to_keep=n_keep + 1).logits[:, :-1].float()
    return torch.gather(logits.log_softmax(-1), 2, input_ids[:, -n_keep:, None]).squeeze(-1)


def calibrate_entropy(model, input_ids, target):
    """Scale the final norm weight until the mean next-token entropy is `target` (bisection on the scale)."""
    low, high = 0.1, 200.0
    for _ in range(16):
        scale = (low * high) ** 0.5
        with torch.no_grad():
            model.model.norm.weight.fill_(scale)
            logits = model(input_ids).logits.float()
        entropy = -(logits.log_softmax(-1).exp() * logits.log_softmax(-1)).sum(-1).mean().item()
        low, high = (scale, high) if entropy > target else (low, scale)
    return scale, entropy


def main(argv=None):
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    tokenizer = build_minimind_tokenizer()
    config = model_config(args)
    reference = MiniMindForCausalLM(config).eval()
    length = args.prompt_tokens + args.completion_tokens
    input_ids = torch.randint(3, args.vocab, (args.rows, length))
    scale, entropy = calibrate_entropy(reference, input_ids[:2], args.entropy)
    n_keep = args.completion_tokens
    mask = torch.ones_like(input_ids)
    print(f"model h{args.hidden_size} x {args.layers} layers, vocab {args.vocab}; final-norm scale {scale:.2f}, "
          f"mean next-token entropy {entropy:.2f} nats; {args.rows} rows x {n_keep} completion tokens")

    reference_fp32 = fp32_logps(reference, input_ids, n_keep)
    results = []
    with tempfile.TemporaryDirectory() as folder:
        for noise in args.noise:
            policy = MiniMindForCausalLM(config).eval()
            policy.load_state_dict(reference.state_dict())
            with torch.no_grad():
                generator = torch.Generator().manual_seed(args.seed + 1)
                for parameter in policy.parameters():
                    parameter.add_(torch.randn(parameter.shape, generator=generator) * noise)
            trainer_args = MiniMindGRPOConfig(
                output_dir=folder, use_cpu=True, bf16=True, report_to="none", num_generations=2,
                per_device_train_batch_size=2, disable_tqdm=True,
            )  # fmt: skip
            trainer = MiniMindGRPOTrainer(
                policy, lambda completions, **kw: [0.0] * len(completions), trainer_args,
                train_dataset=Dataset.from_list([{"prompt": "x"}] * 2), processing_class=tokenizer,
            )  # fmt: skip
            trainer.ref_model.load_state_dict(reference.state_dict())
            trainer.model.eval()
            with torch.no_grad():
                ours_policy, _, _ = trainer._get_per_token_logps_and_entropies(
                    trainer.model, input_ids, mask, n_keep
                )
                ours_reference, _, _ = trainer._get_per_token_logps_and_entropies(
                    trainer.ref_model, input_ids, mask, n_keep
                )
            exact = k3(reference_fp32, fp32_logps(policy, input_ids, n_keep))
            row = {
                "noise": noise,
                "kl_fp32": exact,
                "kl_ours": k3(ours_reference, ours_policy),
                "kl_upstream": k3(reference_fp32, ours_policy),
                "ref_logp_abs_diff_mean": (ours_reference - reference_fp32).abs().mean().item(),
            }
            results.append(row)
            print(
                f"noise {noise:<6} KL fp32 {row['kl_fp32']:.3e}   ours {row['kl_ours']:.3e}   "
                f"upstream {row['kl_upstream']:.3e}   |ref log-p bf16 - fp32| mean {row['ref_logp_abs_diff_mean']:.3e}"
            )
    print(json.dumps({"entropy": entropy, "results": results}))


if __name__ == "__main__":
    main()
