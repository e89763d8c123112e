"""GRPO policy losses: a registry of pure per-token functions, and MiniMind-3's two.

`register_policy_loss(name)` adds a loss: a function of `PolicyLossInputs` returning the per-token policy loss
(B, T), or, as verl's losses do, `(per_token_loss, metrics)`. Beside the log-probs and advantages, a loss receives
the policy's per-token entropies, the reference's log-probs and its own keyword arguments from the recipe
(`loss_kwargs`, declared with `register_policy_loss(name, loss_kwargs={...})` and checked by `check_loss_kwargs`
when the config is built). `loss_type: <name>` picks it (or `loss_type:
package.module:function`, see `seams.py`); the trainer then adds the KL penalty `beta * k3` (as upstream and TRL
do for every loss) and aggregates with `loss_aggregation` (`loss_aggregation.py`). TRL's own loss types
(`TRL_LOSS_TYPES`) are not registered here: those names run TRL's `_compute_loss` untouched, so they cannot be
taken by a registered loss.

`compute_policy_loss` calls the loss and checks what it returns, naming the function: a tensor of shape (B, T)
(a (B,) loss would silently broadcast along the tokens), attached to the graph (a detached one would leave only
the KL to train) and finite. Its `metrics` (name -> tensor) are logged beside TRL's, under TRL's conventions
(`loss_metric_values`): a (B, T) tensor as its mean over the loss tokens of every process (TRL's
`clip_ratio/low_mean`), a (B,) tensor (one value per completion, e.g. `PolicyLossInputs.completion_mean`) as the
min over every process's completions when the name ends in `_min`, the max for `_max`, else the mean (TRL's
`clip_ratio/low_min`), a scalar as the mean over processes. Every process must return the same names.

Registered here, MiniMind-3's (d65ef2c) two `--loss_type` values, named apart from TRL's so a recipe says which
arithmetic it gets:

* `minimind3_cispo`: `-(clamp(ratio, max=epsilon_high).detach() * A * logp)`. The same token term as TRL's
  `cispo`, but TRL's `cispo` aggregates over the tokens of the accumulated batch, MiniMind-3 per completion.
* `minimind3_grpo`: `-min(ratio * A, clamp(ratio, 1 - epsilon, 1 + epsilon) * A)`: clipped at `epsilon` on both
  sides (upstream's `epsilon_high` is CISPO's cap only), where TRL's `grpo` clips above at `1 + epsilon_high`.

`ratio = exp(logp - old_logp)`. The old log-probs are those of whatever produced the rollout: TRL's second
pass (`num_iterations > 1`, or generation misaligned with optimizer steps), a rollout engine's own log-probs, or
the current ones detached (ratio 1 in value) when the batch is on-policy; see
`MiniMindGRPOTrainer._old_per_token_logps`.
"""

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import torch

from ...errors import ExtensionError, RecipeError
from .loss_kwargs import (  # LossKwarg: what a loss declares, imported from here with register_policy_loss
    LOSS_KWARGS_ATTRIBUTE,
    LossKwarg,
    declare_loss_kwargs,
    declared_loss_kwargs,
    declared_value,
)
from .seams import Seam, function_name

# The loss types TRL 1.16's `GRPOTrainer._compute_loss` implements (tests read them back from its source).
TRL_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo")


@dataclass(frozen=True)
class PolicyLossInputs:
    """One micro-batch of completions, tensors (B, T) unless noted.

    per_token_logps: the policy's log-probs of the completion tokens, with gradient.
    old_per_token_logps: the log-probs of the policy that produced the rollout, without gradient.
    advantages: (B, 1).
    mask: the completion tokens the loss counts (1) (see `upto_first_eos_mask`).
    epsilon / epsilon_high: the config's `epsilon` and `epsilon_high` (TRL's `epsilon_low` / `epsilon_high`).
    entropies: the policy's per-token entropies (of the same forward as `per_token_logps`, at the scoring
        temperature), with gradient: the values the trainer logs as `entropy`. The trainer always sets them; None
        only in inputs built without it (e.g. by hand in a test).
    ref_per_token_logps: the frozen reference's log-probs of the completion tokens, without gradient (those of the
        trainer's `beta` x k3 KL); None when `beta == 0` (no reference model exists then).
    loss_kwargs: the loss's own keyword arguments: those it declared (`register_policy_loss(name,
        loss_kwargs=...)`) with the recipe's `loss_kwargs` over their defaults, already checked; read-only.
    """

    per_token_logps: torch.Tensor
    old_per_token_logps: torch.Tensor
    advantages: torch.Tensor
    mask: torch.Tensor
    epsilon: float
    epsilon_high: float
    entropies: torch.Tensor | None = None
    ref_per_token_logps: torch.Tensor | None = None
    loss_kwargs: Mapping = field(default_factory=lambda: MappingProxyType({}))

    @property
    def ratio(self) -> torch.Tensor:
        """The importance ratio `exp(logp - old_logp)` (carries the gradient of `logp`)."""
        return torch.exp(self.per_token_logps - self.old_per_token_logps)

    def completion_mean(self, values: torch.Tensor) -> torch.Tensor:
        """(B,): each completion's mean of `values` (B, T) over its loss tokens; NaN for a completion without any
        (TRL's `masked_seq_mean`, which its `clip_ratio/low_min` and `high_max` take)."""
        return (values * self.mask).sum(dim=-1) / self.mask.sum(dim=-1)


PolicyLoss = Callable[[PolicyLossInputs], torch.Tensor | tuple[torch.Tensor, dict]]
POLICY_LOSSES: dict[str, PolicyLoss] = {}
POLICY_LOSS_SEAM = Seam(
    "loss_type",
    "policy loss",
    ("inputs",),
    POLICY_LOSSES,
    reserved={
        name: f"loss type {name!r} is TRL's own (TRL computes it); register yours under another name"
        for name in TRL_LOSS_TYPES
    },
)


def register_policy_loss(
    name: str, loss_kwargs: Mapping[str, object] | None = None
) -> Callable[[PolicyLoss], PolicyLoss]:
    """Decorator: register `fn(inputs: PolicyLossInputs) -> Tensor (B, T)` (or `(Tensor (B, T), metrics)`) as
    `loss_type: <name>`. `loss_kwargs` declares the keyword arguments a recipe may give it (`loss_kwargs:` in the
    config): name -> default, or name -> `LossKwarg(default, range)` (`loss_kwargs.py`, checked now); the loss reads
    them in `inputs.loss_kwargs`. The declaration stays on the function, so a recipe naming it as
    `package.module:function` finds it too."""
    register = POLICY_LOSS_SEAM.register(name)
    declared = declare_loss_kwargs(f"policy loss {name!r}", loss_kwargs)

    def declare_and_register(fn: PolicyLoss) -> PolicyLoss:
        setattr(fn, LOSS_KWARGS_ATTRIBUTE, declared)
        return register(fn)

    return declare_and_register


def check_loss_kwargs(args) -> dict:
    """The loss's keyword arguments in effect for `args` (a `MiniMindGRPOConfig`: its `loss_type` and
    `loss_kwargs`): the declared defaults with the recipe's values over them, read by `loss_kwargs.declared_value`.
    A key the loss does not declare, a value of another type or outside its range is one `RecipeError` naming the
    key."""
    given = args.loss_kwargs or {}
    if not isinstance(given, Mapping):
        raise RecipeError(f"loss_kwargs must be a mapping of keyword -> value (JSON on the command line), got "
                          f"{given!r}")
    if args.loss_type in TRL_LOSS_TYPES:
        if given:
            raise RecipeError(f"loss_kwargs {sorted(map(str, given))} given, but TRL's loss_type {args.loss_type!r} "
                              "takes no keyword arguments (they are for a registered loss); use TRL's own options")
        return {}
    declared = declared_loss_kwargs(get_policy_loss(args.loss_type))
    resolved = {key: kwarg.default for key, kwarg in declared.items()}
    for key, value in given.items():
        if key not in declared:
            known = ", ".join(declared) or "none"
            raise RecipeError(f"loss_kwargs key {key!r} is not a keyword argument of loss_type {args.loss_type!r} "
                              f"(it declares: {known})")
        resolved[key], problem = declared_value(declared[key], value)
        if problem:
            raise RecipeError(f"loss_kwargs key {key!r} of loss_type {args.loss_type!r} {problem}")
    return resolved


def get_policy_loss(name: str) -> PolicyLoss:
    return POLICY_LOSS_SEAM.get(name)


def compute_policy_loss(name: str, inputs: PolicyLossInputs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The registered loss `name` on `inputs`: `(per_token_loss (B, T), metrics)`, checked where it returns."""
    fn = get_policy_loss(name)
    result = fn(inputs)
    who = f"policy loss {name!r} ({function_name(fn)}; recipe key loss_type)"
    per_token_loss, metrics = result if isinstance(result, tuple) and len(result) == 2 else (result, {})
    expected = tuple(inputs.per_token_logps.shape)
    if not isinstance(per_token_loss, torch.Tensor):
        raise ExtensionError(f"{who} returned a {type(per_token_loss).__name__}, not a tensor of shape (B, T) = "
                             f"{expected} (or a (tensor, metrics) pair)")
    if tuple(per_token_loss.shape) != expected:
        raise ExtensionError(f"{who} returned shape {tuple(per_token_loss.shape)}; a per-token loss has the shape "
                             f"of per_token_logps, (B, T) = {expected}")
    if inputs.per_token_logps.requires_grad and not per_token_loss.requires_grad:
        raise ExtensionError(f"{who} returned a loss detached from the policy's log-probs: it would train nothing "
                             "(only the KL term would move the weights)")
    if not torch.isfinite(per_token_loss).all():
        raise ExtensionError(f"{who} returned NaN or infinite values: the weights would become NaN")
    if not isinstance(metrics, dict):
        raise ExtensionError(f"{who} returned metrics of type {type(metrics).__name__}; expected a dict name -> value")
    return per_token_loss, {key: _metric_tensor(who, key, value, expected) for key, value in metrics.items()}


def _metric_tensor(who: str, key, value, shape: tuple[int, int]) -> torch.Tensor:
    value = value if isinstance(value, torch.Tensor) else torch.as_tensor(value, dtype=torch.float32)
    if not isinstance(key, str) or tuple(value.shape) not in ((), shape[:1], shape):
        raise ExtensionError(f"{who} returned metric {key!r} of shape {tuple(value.shape)}; a metric is a scalar, "
                             f"one value per completion {shape[:1]} or one per token {shape}")
    return value.detach().float()


def loss_metric_values(metrics: dict[str, torch.Tensor], mask: torch.Tensor, accelerator) -> dict[str, float]:
    """A loss's metrics reduced over every process, as TRL reduces its own (see the module docstring)."""
    values = {}
    mask = mask.float()
    for key, value in metrics.items():
        if value.dim() == 2:  # per token: TRL's global_masked_mean
            totals = accelerator.reduce(torch.stack([(value * mask).sum(), mask.sum()]), reduction="sum")
            values[key] = (totals[0] / totals[1].clamp(min=1.0)).item()
            continue
        gathered = accelerator.gather(value.reshape(-1).to(mask.device))
        finite = gathered[~torch.isnan(gathered)]
        if finite.numel() == 0:
            values[key] = float("nan")
        elif key.endswith("_min"):
            values[key] = finite.min().item()
        elif key.endswith("_max"):
            values[key] = finite.max().item()
        else:
            values[key] = finite.mean().item()
    return values


def k3_kl(ref_per_token_logps: torch.Tensor, per_token_logps: torch.Tensor) -> torch.Tensor:
    """The k3 estimate of KL(policy || reference) per token: `exp(d) - d - 1` with `d = ref - logp` (both
    generations of upstream, and TRL)."""
    delta = ref_per_token_logps - per_token_logps
    return torch.exp(delta) - delta - 1


def upto_first_eos_mask(completion_ids: torch.Tensor, rollout_mask: torch.Tensor, eos_token_ids) -> torch.Tensor:
    """MiniMind-3's completion mask, per turn: inside each turn (a run of positions where the rollout's own mask is
    1), the positions up to and including the turn's first EOS (all of them when it has none); nothing where the
    rollout's mask is 0. A single-turn completion is one turn: upstream's cut after the first EOS. In a multi-turn
    rollout (TRL's tool loop) each turn ends with its EOS and the tool output (mask 0) starts the next turn, which
    is trained too. Keeps `rollout_mask`'s dtype."""
    inside = rollout_mask.bool()
    eos = torch.as_tensor(list(eos_token_ids), device=completion_ids.device)
    is_eos = (torch.isin(completion_ids, eos) & inside).long()
    eos_before = is_eos.cumsum(dim=1) - is_eos  # EOS strictly before each position, over the whole row
    previous_inside = torch.nn.functional.pad(inside[:, :-1], (1, 0), value=False)
    turn_start = inside & ~previous_inside
    # `eos_before` never decreases along a row, so its running maximum over turn starts is its value at the start
    # of the current turn: what came before that turn
    before_turn = torch.where(turn_start, eos_before, torch.zeros_like(eos_before)).cummax(dim=1).values
    return (inside & (eos_before == before_turn)).to(rollout_mask.dtype)


@register_policy_loss("minimind3_cispo")
def minimind3_cispo(inputs: PolicyLossInputs) -> tuple[torch.Tensor, dict]:
    """MiniMind-3's CISPO: the ratio capped above at `epsilon_high` (no lower bound) and detached, so the
    gradient flows through the log-prob only. Reports TRL's `cispo` metric: the share of loss tokens whose cap
    binds (a positive advantage and a ratio above `epsilon_high`)."""
    ratio = inputs.ratio
    weight = torch.clamp(ratio, max=inputs.epsilon_high).detach()
    capped = (ratio > inputs.epsilon_high) & (inputs.advantages > 0)
    return -(weight * inputs.advantages * inputs.per_token_logps), {"cispo_clip_ratio": capped.float()}


@register_policy_loss("minimind3_grpo")
def minimind3_grpo(inputs: PolicyLossInputs) -> tuple[torch.Tensor, dict]:
    """MiniMind-3's clipped GRPO: PPO's pessimistic minimum with the ratio clipped to [1 - epsilon, 1 + epsilon].
    Reports TRL's `grpo` clip metrics: the shares of loss tokens clipped below (negative advantage), above
    (positive) and either, and the lowest and highest per-completion shares."""
    ratio = inputs.ratio
    clipped = torch.clamp(ratio, 1 - inputs.epsilon, 1 + inputs.epsilon)
    loss = -torch.min(ratio * inputs.advantages, clipped * inputs.advantages)
    low = ((ratio < 1 - inputs.epsilon) & (inputs.advantages < 0)).float()
    high = ((ratio > 1 + inputs.epsilon) & (inputs.advantages > 0)).float()
    return loss, {
        "clip_ratio/low_mean": low,
        "clip_ratio/high_mean": high,
        "clip_ratio/region_mean": torch.maximum(low, high),
        "clip_ratio/low_min": inputs.completion_mean(low),
        "clip_ratio/high_max": inputs.completion_mean(high),
    }


# TRL options that act inside TRL's `_compute_loss` only: a registered loss would silently drop them.
_TRL_LOSS_ONLY_OPTIONS = (
    ("importance_sampling_level", lambda args: args.importance_sampling_level != "token", "'token'"),
    ("top_entropy_quantile", lambda args: args.top_entropy_quantile < 1.0, "1.0"),
    ("off_policy_mask_threshold", lambda args: args.off_policy_mask_threshold is not None, "None"),
    ("delta", lambda args: args.delta is not None, "None"),
    ("entropy_coef", lambda args: args.entropy_coef != 0.0, "0.0"),
    ("use_adaptive_entropy", lambda args: args.use_adaptive_entropy, "false"),
)
# Why the entropy options are among them: TRL adds its bonus (and runs its adaptive controller, whose state it saves
# in checkpoints) inside its `_compute_loss`, which a registered loss replaces. A registered loss receives the
# entropies instead (`PolicyLossInputs.entropies`) and takes its coefficient from `loss_kwargs`.
_ENTROPY_OPTIONS = ("entropy_coef", "use_adaptive_entropy")


def loss_option_problems(args) -> list[str]:
    """What in `args` (a `MiniMindGRPOConfig`) a registered `loss_type` cannot honour; empty for TRL's types."""
    if args.loss_type in TRL_LOSS_TYPES:
        return []
    problems = [
        f"{name}={getattr(args, name)!r} is implemented by TRL's loss types only; with loss_type "
        f"{args.loss_type!r} keep it at {default}"
        + (" (a registered loss adds its own entropy bonus from inputs.entropies, its coefficient from loss_kwargs: "
           "docs/generations.md)" if name in _ENTROPY_OPTIONS else "")
        for name, applies, default in _TRL_LOSS_ONLY_OPTIONS
        if applies(args)
    ]
    if args.loss_type == "minimind3_cispo" and args.epsilon_high is None:
        problems.append(
            "loss_type 'minimind3_cispo' caps the ratio at epsilon_high, which is not set (TRL would fall back to "
            "epsilon, a cap below 1); set epsilon_high (MiniMind-3: --epsilon_high 5.0)"
        )
    return problems


__all__ = [
    "POLICY_LOSSES",
    "POLICY_LOSS_SEAM",
    "TRL_LOSS_TYPES",
    "LossKwarg",
    "PolicyLossInputs",
    "check_loss_kwargs",
    "compute_policy_loss",
    "declared_loss_kwargs",
    "get_policy_loss",
    "k3_kl",
    "loss_metric_values",
    "loss_option_problems",
    "minimind3_cispo",
    "minimind3_grpo",
    "register_policy_loss",
    "upto_first_eos_mask",
]
