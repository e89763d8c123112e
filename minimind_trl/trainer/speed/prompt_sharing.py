"""Each prompt computed once per group in the log-prob passes the trainer owns (`share_prompts`).

The G completions of a prompt share its tokens, and every training pass (the policy forward with gradient, the
reference forward, TRL's old-log-prob pass when it runs) would recompute them G times. For MiniMind policies the
trainer passes the prompt length to the model (`MiniMindModel`'s `shared_prefix_length`), which computes each
distinct prompt once and lets its completions attend to its keys and values; the backward flows into each prompt
once. Groups are found by content (the rows' prompt ids and mask equal), so rows whose prompts differ (other
padding, an agent rollout's own prefix or left cut) are computed row by row, unshared; the model says so in the
log, once. The log-probs and gradients equal the unshared passes' up to summation order (docs/deviations.md).

Left unset, it is used where the policy trains on the CPU, whose passes are bound by their FLOPs, and not on GPUs:
two passes per layer double the kernel launches, and at MiniMind's sizes in bf16 the launches, not the FLOPs, set
the time (measured on an H200: the shared passes used less GPU time but took 0.44-0.80x as long; in fp32 1.04-1.34x
faster; benchmarks/README.md). `share_prompts: true` uses it anywhere it applies. Where the trainer cannot use it at
all it says why once at start-up: a policy that is not MiniMind, DeepSpeed ZeRO-3 and FSDP (which gather each
layer's weights per call; not verified with sharing here).
"""

import functools
import logging

from ..checks.weight_partitioning import weight_partitioning

logger = logging.getLogger(__name__)


def sharing_off_reason(trainer) -> str | None:
    """Why the trainer's passes cannot share prompts (None: they can)."""
    if trainer.args.share_prompts is False:
        return "share_prompts: false"
    config = trainer.accelerator.unwrap_model(trainer.model).config
    if getattr(config, "model_type", None) != "minimind":
        return f"the policy is {type(config).__name__}'s model, not MiniMind"
    partitioning = weight_partitioning(trainer)
    if partitioning is not None:
        return f"{partitioning} gathers every layer's weights per call; running each layer twice is not verified"
    if trainer.args.share_prompts is None and trainer.accelerator.device.type != "cpu":
        return (
            f"share_prompts unset on {trainer.accelerator.device.type}: two passes per layer double the kernel "
            "launches, which set the time at MiniMind's sizes (set share_prompts: true to share anyway)"
        )
    return None


def shares_prompts(trainer) -> bool:
    """Whether the trainer's log-prob passes share prompts; the reason once in the log when not."""
    reason = sharing_off_reason(trainer)
    if reason is not None and trainer.args.share_prompts is not False:
        logger.info("prompts are computed once per completion, not once per group: %s", reason)
    return reason is None


def with_shared_prompt(model, input_ids, logits_to_keep: int):
    """`model` called with the prompt length as its shared prefix (TRL's log-prob loop only calls the model)."""
    prompt_length = input_ids.size(1) - logits_to_keep
    return functools.partial(model, shared_prefix_length=prompt_length) if prompt_length > 0 else model


__all__ = ["shares_prompts", "sharing_off_reason", "with_shared_prompt"]
