"""TRL's fused LM head (`add_fused_lm_head`) with a path that is fast on CPU.

GRPO needs, for every completion token, its log-probability (and, for TRL's metrics, the entropy of the
next-token distribution) — never the `[N, T, V]` logits themselves. TRL 1.16 patches the policy's forward with
`trl.trainer.utils.add_fused_lm_head`, whose Triton kernel does this in one pass per tile on GPUs. Without
Triton (CPU) it falls back to torch operations that score *every* position, prompt included, in tiles of up to
4096 tokens x 32768 vocabulary entries, with about ten full-width passes per tile in the forward and again in
the backward. On CPU that is slower and heavier than even a plain full-vocabulary log-softmax (numbers in
`benchmarks/README.md`).

`add_fused_lm_head` here installs TRL's head and wraps it: on CPU, a call with `fused_lm_head=True` scores only
the positions whose label is not `-100` (the completion), in chunks of tokens that keep each `[chunk, V]`
tile small, with an exact log-sum-exp (`SelectedTokenLogProbs`); the backward recomputes each tile instead of
storing it, except in fp32, where the first `KEEP_FP32_LOGITS_BYTES` of logits are kept from the forward (an
fp32 GEMM costs more than writing and reading its output back). On devices where TRL's kernel runs, and for
features this path does not implement (bias, logit soft-capping, router logits, DTensor weights, extra
outputs), TRL's own head runs unchanged.

The returned `FusedCausalLMOutput` has TRL's fields and semantics (zeros where the label is `-100`).
"""

import functools
import types

import torch
from torch.distributed.tensor import DTensor
from trl.trainer import utils as trl_utils

# Elements per [tokens, vocab] tile (fp32: 4 MiB, ~160 tokens at MiniMind's 6400 words); the token chunk is
# derived from the vocabulary size. 16 MiB tiles were 25 % slower forward + backward on CPU (their elementwise
# passes stream from L3 and each tile allocates fresh memory); 1 MiB tiles make the GEMMs too thin.
TILE_ELEMENTS = 1 << 20
# fp32 logits kept from the forward for the backward, instead of recomputed (64 MiB: the whole head of 16 completions
# x 128 tokens at 6400 words; longer batches keep their first chunks). The recompute GEMM is ~17 % of the head's
# forward + backward in fp32 (AVX2 and AVX-512 measured, benchmarks/README.md); with bf16 GEMMs it is
# cheap, so bf16 tiles are always recomputed. Results are identical either way (the same GEMM call).
KEEP_FP32_LOGITS_BYTES = 64 << 20
SUPPORTED_OUTPUTS = frozenset({"log_probs", "entropy"})


class SelectedTokenLogProbs(torch.autograd.Function):
    """`log_softmax(hidden @ weight.T * scale)[i, targets[i]]` and optionally the entropy of each row, in token
    chunks, without keeping the `[N, V]` logits (the backward recomputes them chunk by chunk).

    Under CPU autocast the projections run in the autocast dtype; the softmax arithmetic is always fp32 and
    the weight gradient is accumulated in fp32. In fp32 the forward keeps the logits of its first chunks (up to
    `KEEP_FP32_LOGITS_BYTES`) for the backward.
    """

    @staticmethod
    def forward(ctx, hidden, weight, targets, scale: float, chunk_size: int, with_entropy: bool, keep_bytes: int = 0):
        ctx.set_materialize_grads(False)
        compute_dtype = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else hidden.dtype
        weight_c = weight.to(compute_dtype)
        count = hidden.shape[0]
        log_probs = torch.empty(count, dtype=torch.float32, device=hidden.device)
        log_z = torch.empty_like(log_probs)
        entropy = torch.empty_like(log_probs) if with_entropy else None
        kept_rows = 0
        if compute_dtype == torch.float32:  # whole chunks, up to `keep_bytes` (0 when no backward will run)
            kept_rows = min(count, keep_bytes // (4 * weight.shape[0] * chunk_size) * chunk_size)
        kept = torch.empty(kept_rows, weight.shape[0], dtype=torch.float32, device=hidden.device)
        for start in range(0, count, chunk_size):
            stop = min(start + chunk_size, count)
            if stop <= kept_rows:
                logits = torch.mm(hidden[start:stop], weight_c.t(), out=kept[start:stop])
            else:
                logits = (hidden[start:stop].to(compute_dtype) @ weight_c.t()).float()
            if scale != 1.0:
                logits.mul_(scale)
            chunk_log_z = torch.logsumexp(logits, dim=-1)
            log_z[start:stop] = chunk_log_z
            log_probs[start:stop] = logits.gather(1, targets[start:stop, None]).squeeze(1) - chunk_log_z
            if with_entropy:  # H = log Z - sum_v p_v z_v
                probs = torch.exp(logits - chunk_log_z[:, None])
                entropy[start:stop] = chunk_log_z - (probs * logits).sum(dim=-1)
        ctx.save_for_backward(hidden, weight, targets, log_z, entropy if with_entropy else log_z, kept)
        ctx.scale, ctx.chunk_size, ctx.compute_dtype = scale, chunk_size, compute_dtype
        if not with_entropy:
            return log_probs, None
        return log_probs, entropy

    @staticmethod
    def backward(ctx, grad_log_probs, grad_entropy):
        hidden, weight, targets, log_z, entropy, kept = ctx.saved_tensors
        scale, chunk_size, compute_dtype = ctx.scale, ctx.chunk_size, ctx.compute_dtype
        needs_hidden, needs_weight = ctx.needs_input_grad[:2]
        weight_c = weight.to(compute_dtype)
        grad_hidden = torch.empty(hidden.shape, dtype=torch.float32, device=hidden.device) if needs_hidden else None
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if needs_weight else None
        for start in range(0, hidden.shape[0], chunk_size):
            stop = min(start + chunk_size, hidden.shape[0])
            hidden_c = hidden[start:stop].to(compute_dtype)
            if stop <= kept.shape[0]:  # kept by the forward, already scaled (not changed: a second backward works)
                log_p = kept[start:stop] - log_z[start:stop, None]
            else:
                logits = (hidden_c @ weight_c.t()).float()
                if scale != 1.0:
                    logits.mul_(scale)
                log_p = logits.sub_(log_z[start:stop, None])  # in place: the logits are not needed any more
            probs = torch.exp(log_p)
            # d log p_t / dz_j = 1[j = t] - p_j ;  d H / dz_j = -p_j (log p_j + H)
            if grad_entropy is not None:
                grad = log_p.add_(entropy[start:stop, None]).mul_(probs).mul_(-grad_entropy[start:stop, None])
                if grad_log_probs is not None:
                    grad.sub_(probs.mul_(grad_log_probs[start:stop, None]))
            else:
                grad = probs.mul_(-grad_log_probs[start:stop, None])
            if grad_log_probs is not None:
                grad.scatter_add_(1, targets[start:stop, None], grad_log_probs[start:stop, None].float())
            if scale != 1.0:
                grad.mul_(scale)
            grad = grad.to(compute_dtype)
            if grad_hidden is not None:
                grad_hidden[start:stop] = grad @ weight_c
            if grad_weight is not None:
                grad_weight.add_((grad.t() @ hidden_c).float())
        return (
            grad_hidden.to(hidden.dtype) if grad_hidden is not None else None,
            grad_weight.to(weight.dtype) if grad_weight is not None else None,
            None,
            None,
            None,
            None,
            None,
        )


def selected_token_log_probs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    temperature: float = 1.0,
    with_entropy: bool = False,
    chunk_size: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probabilities of `targets` under `softmax(hidden @ weight.T / temperature)` (and the entropies)."""
    if chunk_size is None:
        chunk_size = max(1, TILE_ELEMENTS // weight.shape[0])
    backward = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    keep_bytes = KEEP_FP32_LOGITS_BYTES if backward else 0
    return SelectedTokenLogProbs.apply(hidden, weight, targets, 1.0 / temperature, chunk_size, with_entropy, keep_bytes)


def _cpu_path_applies(model, text_config, outputs) -> bool:
    """Whether this module's CPU path computes what TRL's head would for `model` (checked at patch time)."""
    head = model.get_output_embeddings()
    return (
        head is not None
        and getattr(head, "bias", None) is None
        and set(outputs) <= SUPPORTED_OUTPUTS
        and getattr(text_config, "final_logit_softcapping", None) is None
        and not getattr(text_config, "output_router_logits", False)
        and all(
            getattr(text_config, key, None) is None
            for key in ("logit_scale", "output_multiplier", "lm_head_multiplier", "logits_scaling")
        )
    )


def add_fused_lm_head(
    model, temperature: float = 1.0, cast_lm_head_to_fp32: bool = False, outputs: tuple[str, ...] = ("log_probs",)
) -> None:
    """`trl.trainer.utils.add_fused_lm_head` (same arguments and output), with the CPU path described above."""
    trl_utils.add_fused_lm_head(
        model, temperature=temperature, cast_lm_head_to_fp32=cast_lm_head_to_fp32, outputs=outputs
    )
    text_config = model.config.get_text_config()
    if not _cpu_path_applies(model, text_config, outputs):
        return
    trl_forward = model.forward  # TRL's patched forward, bound to `model`
    with_entropy = "entropy" in outputs

    @functools.wraps(type(model).forward)
    def _fused_forward(
        self, *args, fused_lm_head=False, labels=None, shift_labels=None, num_items_in_batch=None, **kwargs
    ):
        weight = self.get_output_embeddings().weight
        # ZeRO-3 partitions the head outside its module's own forward: TRL's head gathers it
        partitioned = hasattr(weight, "ds_id")
        if not fused_lm_head or weight.device.type != "cpu" or isinstance(weight, DTensor) or partitioned:
            return trl_forward(
                *args,
                fused_lm_head=fused_lm_head,
                labels=labels,
                shift_labels=shift_labels,
                num_items_in_batch=num_items_in_batch,
                **kwargs,
            )
        kwargs["use_cache"] = False
        backbone_outputs = self.base_model(*args, **kwargs)
        if shift_labels is None:
            hidden_states, labels = backbone_outputs.last_hidden_state[:, :-1], labels[:, 1:]
        else:
            hidden_states, labels = backbone_outputs.last_hidden_state, shift_labels
        mask = labels != -100
        if cast_lm_head_to_fp32:
            with torch.autocast("cpu", enabled=False):
                log_probs, entropy = selected_token_log_probs(
                    hidden_states[mask].float(), weight.float(), labels[mask], temperature, with_entropy
                )
        else:
            log_probs, entropy = selected_token_log_probs(
                hidden_states[mask], weight, labels[mask], temperature, with_entropy
            )
        log_probs = log_probs.new_zeros(mask.shape).masked_scatter(mask, log_probs)
        if entropy is not None:
            entropy = entropy.new_zeros(mask.shape).masked_scatter(mask, entropy)
        loss = -log_probs.sum() / (mask.sum().clamp(min=1) if num_items_in_batch is None else num_items_in_batch)
        return trl_utils.FusedCausalLMOutput(loss=loss, log_probs=log_probs, entropy=entropy, label_mask=mask)

    model.forward = types.MethodType(_fused_forward, model)


__all__ = ["SelectedTokenLogProbs", "add_fused_lm_head", "selected_token_log_probs"]
