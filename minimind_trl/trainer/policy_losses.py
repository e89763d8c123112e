"""GRPO policy losses: a registry of pure per-token functions, and MiniMind-3's two.

`register_policy_loss(name)` adds a loss: a function of `PolicyLossInputs` returning the per-token policy loss
(B, T). `loss_type: <name>` picks it; the trainer then adds the KL penalty `beta * k3` (as upstream and TRL do
for every loss) and aggregates with `loss_aggregation` (`loss_aggregation.py`). TRL's own loss types
(`TRL_LOSS_TYPES`) are not registered here: those names run TRL's `_compute_loss` untouched, so they cannot be
taken by a registered loss.

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

from collections.abc import Callable
from dataclasses import dataclass

import torch

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
    """

    per_token_logps: torch.Tensor
    old_per_token_logps: torch.Tensor
    advantages: torch.Tensor
    mask: torch.Tensor
    epsilon: float
    epsilon_high: float

    @property
    def ratio(self) -> torch.Tensor:
        """The importance ratio `exp(logp - old_logp)` (carries the gradient of `logp`)."""
        return torch.exp(self.per_token_logps - self.old_per_token_logps)


PolicyLoss = Callable[[PolicyLossInputs], torch.Tensor]
POLICY_LOSSES: dict[str, PolicyLoss] = {}


def register_policy_loss(name: str) -> Callable[[PolicyLoss], PolicyLoss]:
    """Decorator: register `fn(inputs: PolicyLossInputs) -> Tensor (B, T)` as `loss_type: <name>`."""

    def register(fn: PolicyLoss) -> PolicyLoss:
        if name in TRL_LOSS_TYPES:
            raise ValueError(f"loss type {name!r} is TRL's own (TRL computes it); register yours under another name")
        if POLICY_LOSSES.get(name, fn) is not fn:
            raise ValueError(f"policy loss {name!r} is already registered ({POLICY_LOSSES[name]})")
        POLICY_LOSSES[name] = fn
        return fn

    return register


def get_policy_loss(name: str) -> PolicyLoss:
    if name not in POLICY_LOSSES:
        raise ValueError(f"unknown loss_type {name!r}; TRL's: {', '.join(TRL_LOSS_TYPES)}; registered: "
                         f"{', '.join(POLICY_LOSSES) or 'none'}")
    return POLICY_LOSSES[name]


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
def minimind3_cispo(inputs: PolicyLossInputs) -> torch.Tensor:
    """MiniMind-3's CISPO: the ratio capped above at `epsilon_high` (no lower bound) and detached, so the
    gradient flows through the log-prob only."""
    weight = torch.clamp(inputs.ratio, max=inputs.epsilon_high).detach()
    return -(weight * inputs.advantages * inputs.per_token_logps)


@register_policy_loss("minimind3_grpo")
def minimind3_grpo(inputs: PolicyLossInputs) -> torch.Tensor:
    """MiniMind-3's clipped GRPO: PPO's pessimistic minimum with the ratio clipped to [1 - epsilon, 1 + epsilon]."""
    ratio = inputs.ratio
    clipped = torch.clamp(ratio, 1 - inputs.epsilon, 1 + inputs.epsilon)
    return -torch.min(ratio * inputs.advantages, clipped * inputs.advantages)


# TRL options that act inside TRL's `_compute_loss` only: a registered loss would silently drop them.
_TRL_LOSS_ONLY_OPTIONS = (
    ("importance_sampling_level", lambda args: args.importance_sampling_level != "token", "'token'"),
    ("top_entropy_quantile", lambda args: args.top_entropy_quantile < 1.0, "1.0"),
    ("off_policy_mask_threshold", lambda args: args.off_policy_mask_threshold is not None, "None"),
    ("delta", lambda args: args.delta is not None, "None"),
    ("entropy_coef", lambda args: args.entropy_coef != 0.0, "0.0"),
    ("use_adaptive_entropy", lambda args: args.use_adaptive_entropy, "false"),
)


def loss_option_problems(args) -> list[str]:
    """What in `args` (a `MiniMindGRPOConfig`) a registered `loss_type` cannot honour; empty for TRL's types."""
    if args.loss_type in TRL_LOSS_TYPES:
        return []
    problems = [
        f"{name}={getattr(args, name)!r} is implemented by TRL's loss types only; with loss_type "
        f"{args.loss_type!r} keep it at {default}"
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
    "TRL_LOSS_TYPES",
    "PolicyLossInputs",
    "get_policy_loss",
    "k3_kl",
    "loss_option_problems",
    "minimind3_cispo",
    "minimind3_grpo",
    "register_policy_loss",
    "upto_first_eos_mask",
]
