"""How a per-token loss becomes the micro-batch's loss: a registry of aggregation modes (verl's names).

`register_loss_aggregation(name)` adds a mode: a function of the per-token loss (B, T), its mask and a `LossScale`
returning the scalar to back-propagate, already divided for gradient accumulation. `loss_aggregation: <name>`
(or `package.module:function`, see `seams.py`) picks it for a registered `loss_type`; TRL's own loss types
aggregate inside TRL, as `TRL_LOSS_AGGREGATION` names. `aggregate` calls a mode and checks that it returned a
scalar tensor, naming the function.

* `seq-mean-token-mean`: each completion's masked token mean, then the mean over completions: both upstream
  generations, TRL's `grpo` and `sapo`. The default for registered losses.
* `seq-mean-token-mean-nonempty`: the same mean over the completions with at least one loss token only (0 when
  none has one): MiniMind-3's agent RL (`train_agent.py`), where a rollout can train nothing.
* `token-mean`: the token sum over the number of loss tokens of the whole accumulated batch (all processes, all
  micro-batches of the optimizer step): TRL's `dapo`, `cispo` and `vespo`.
* `local-token-mean`: the token mean of this micro-batch: TRL's `bnpo`.
* `seq-mean-token-sum-norm`: the token sum over (completions x `max_completion_length`): TRL's `dr_grpo`.
* `seq-mean-token-sum`: each completion's token sum, then the mean over completions: TRL's `luspo`.
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ...errors import ExtensionError
from .seams import Seam, function_name

DEFAULT_LOSS_AGGREGATION = "seq-mean-token-mean"


@dataclass(frozen=True)
class LossScale:
    """The normalisers a mode may need.

    accumulation_steps: micro-batches accumulated into one optimizer step (1 in evaluation).
    window_tokens: loss tokens in this process's share of one accumulation window (`token-mean`'s divisor).
    max_completion_length: the config's `max_completion_length` (`seq-mean-token-sum-norm`).
    """

    accumulation_steps: float
    window_tokens: torch.Tensor | float
    max_completion_length: int | None


LossAggregation = Callable[[torch.Tensor, torch.Tensor, LossScale], torch.Tensor]
LOSS_AGGREGATIONS: dict[str, LossAggregation] = {}
LOSS_AGGREGATION_SEAM = Seam(
    "loss_aggregation", "loss aggregation", ("per_token_loss", "mask", "scale"), LOSS_AGGREGATIONS
)


def register_loss_aggregation(name: str) -> Callable[[LossAggregation], LossAggregation]:
    """Decorator: register `fn(per_token_loss, mask, scale: LossScale) -> scalar` as `loss_aggregation: <name>`."""
    return LOSS_AGGREGATION_SEAM.register(name)


def get_loss_aggregation(name: str) -> LossAggregation:
    return LOSS_AGGREGATION_SEAM.get(name)


def aggregate(name: str, per_token_loss: torch.Tensor, mask: torch.Tensor, scale: LossScale) -> torch.Tensor:
    """The mode `name` on one micro-batch, checked where it returns: one finite scalar tensor, attached to the
    per-token loss's graph when that has one (a detached loss would end in torch's traceback at `backward`, a NaN or
    an infinity would train NaN weights with exit 0)."""
    fn = get_loss_aggregation(name)
    loss = fn(per_token_loss, mask, scale)
    who = f"loss aggregation {name!r} ({function_name(fn)}; recipe key loss_aggregation)"
    if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
        shape = tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
        raise ExtensionError(f"{who} returned {shape}; expected one scalar tensor (shape ()), the loss to "
                             "back-propagate")
    if per_token_loss.requires_grad and not loss.requires_grad:
        raise ExtensionError(f"{who} returned a tensor detached from the per-token loss: it would train nothing, "
                             "and backward() would fail (compute it from per_token_loss with torch operations)")
    if not torch.isfinite(loss.detach()).all():
        raise ExtensionError(f"{who} returned {loss.item()}: a NaN or infinite loss makes the weights NaN")
    return loss


@register_loss_aggregation("seq-mean-token-mean")
def seq_mean_token_mean(per_token_loss, mask, scale: LossScale) -> torch.Tensor:
    per_completion = (per_token_loss * mask).sum(dim=-1) / mask.sum(dim=-1).clamp(min=1.0)
    return per_completion.mean() / scale.accumulation_steps


@register_loss_aggregation("seq-mean-token-mean-nonempty")
def seq_mean_token_mean_nonempty(per_token_loss, mask, scale: LossScale) -> torch.Tensor:
    counts = mask.sum(dim=-1)
    nonempty = counts > 0
    if not nonempty.any():  # nothing to learn from: a zero that keeps the graph (every rank must back-propagate)
        return (per_token_loss * mask).sum() * 0.0
    per_completion = (per_token_loss * mask).sum(dim=-1)[nonempty] / counts[nonempty]
    return per_completion.mean() / scale.accumulation_steps


@register_loss_aggregation("token-mean")
def token_mean(per_token_loss, mask, scale: LossScale) -> torch.Tensor:
    return (per_token_loss * mask).sum() / scale.window_tokens


@register_loss_aggregation("local-token-mean")
def local_token_mean(per_token_loss, mask, scale: LossScale) -> torch.Tensor:
    return (per_token_loss * mask).sum() / mask.sum().clamp(min=1.0) / scale.accumulation_steps


@register_loss_aggregation("seq-mean-token-sum-norm")
def seq_mean_token_sum_norm(per_token_loss, mask, scale: LossScale) -> torch.Tensor:
    if scale.max_completion_length is None:
        raise ValueError("loss_aggregation 'seq-mean-token-sum-norm' divides by max_completion_length, which is None")
    total = (per_token_loss * mask).sum() / (per_token_loss.size(0) * scale.max_completion_length)
    return total / scale.accumulation_steps


@register_loss_aggregation("seq-mean-token-sum")
def seq_mean_token_sum(per_token_loss, mask, scale: LossScale) -> torch.Tensor:
    return (per_token_loss * mask).sum(dim=-1).mean() / scale.accumulation_steps


# How TRL 1.16's `_compute_loss` aggregates each of its loss types, in the modes' names above.
TRL_LOSS_AGGREGATION = {
    "grpo": "seq-mean-token-mean",
    "sapo": "seq-mean-token-mean",
    "bnpo": "local-token-mean",
    "dr_grpo": "seq-mean-token-sum-norm",
    "dapo": "token-mean",
    "cispo": "token-mean",
    "vespo": "token-mean",
    "luspo": "seq-mean-token-sum",
}


def effective_loss_aggregation(loss_type: str, loss_aggregation: str | None) -> str:
    """The mode a run aggregates with: TRL's for its loss types, else the configured one (default upstream's)."""
    if loss_type in TRL_LOSS_AGGREGATION:
        return TRL_LOSS_AGGREGATION[loss_type]
    return loss_aggregation or DEFAULT_LOSS_AGGREGATION


__all__ = [
    "DEFAULT_LOSS_AGGREGATION",
    "LOSS_AGGREGATIONS",
    "LOSS_AGGREGATION_SEAM",
    "LossScale",
    "TRL_LOSS_AGGREGATION",
    "aggregate",
    "effective_loss_aggregation",
    "get_loss_aggregation",
    "register_loss_aggregation",
]
