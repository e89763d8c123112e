"""GRPO advantage estimators: a registry of pure functions, and MiniMind's two generations of them.

`register_adv_est(name)` adds an estimator (a function of `AdvantageInputs` returning one advantage per row);
`advantage_estimator: <name>` picks it (or `advantage_estimator: package.module:function`, see `seams.py`).
`"trl"` is not in the registry: it keeps TRL's own advantages (`scale_rewards`, `multi_objective_aggregation`).
`estimate_advantages` is how the trainer calls one: an estimator never sees a NaN reward (a naive group mean would
turn a whole group into NaN), what it returns is checked, naming it, and unscorable rows get 0. Registered here:

* `"minimind"`: the seed's (MiniMind2, fea69cf) double normalisation, below;
* `"group_zscore"`: MiniMind-3's (d65ef2c), `(r - mean) / (std(unbiased=False) + 1e-4)` per group, no clamp, no
  batch step (`group_zscore(..., unbiased=False, clamp=None)`).

For N = B * G rewards (B prompts, G completions each, a prompt's completions adjacent) the seed computes

    a_i = clamp((r_i - mean_g) / (std_g + 1e-4), -10, 10)        # per group g, unbiased std
    A_i = (a_i - mean(a)) / (std(a) + 1e-8)                       # over the batch, unbiased std

TRL scores the batch gathered from every process while upstream normalised the second stage on each rank, so
`minimind_estimator` runs `group_zscore` on the gathered rewards and `batch_renormalize` on each process's
slice. `minimind_advantages` is both stages on one process's batch.

Beyond upstream (both generations):
* A group without spread (its scorable rewards all equal, max == min) gets advantage exactly 0 from both
  stages. Upstream means that too, but in float32 the mean of G copies of a non-representable value (0.1,
  2.1) is often one rounding step off, so its z-score is ~1e-4 instead of 0, and when every group of the batch
  is constant stage two scales that noise to unit size (`[0.1] * 8 + [0.3] * 8` -> +-0.968 upstream). The
  group's zeros still count in stage two's mean and std, as upstream's exact zeros (e.g. of 0.5 rewards) do,
  so the advantages of the groups with spread stay upstream's bit for bit whenever upstream's were exact.
* NaN rewards mark completions no reward function could score (TRL turns `None` into NaN). They are left
  out of every mean and std and get advantage 0, so they neither move the policy nor shift the baselines.
* A group or batch with fewer than two scorable rewards has no spread: its rows get 0.
A batch of equal stage-one values gives 0 (0 / 1e-8). On NaN-free input whose groups all have spread the
operations are upstream's, in upstream's order.
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ...errors import ExtensionError
from .seams import Seam, function_name

GROUP_STD_EPS = 1e-4
BATCH_STD_EPS = 1e-8
CLAMP = 10.0


def _as_float(rewards: torch.Tensor) -> torch.Tensor:
    if not isinstance(rewards, torch.Tensor):
        raise TypeError(f"rewards must be a torch.Tensor, got {type(rewards).__name__}")
    rewards = rewards if rewards.is_floating_point() else rewards.float()
    if torch.isinf(rewards).any():
        raise ValueError("rewards contain +-inf; a reward function returned an infinite score")
    return rewards.reshape(-1)


def _grouped(rewards: torch.Tensor, num_generations: int) -> torch.Tensor:
    if num_generations < 1 or rewards.numel() % num_generations != 0:
        raise ValueError(f"{rewards.numel()} rewards cannot be split into groups of num_generations={num_generations}")
    return rewards.view(-1, num_generations)


def zero_spread_rows(rewards: torch.Tensor, num_generations: int) -> torch.Tensor:
    """True for every row of a group whose scorable (non-NaN) rewards are all equal, or that has fewer than
    two of them: the groups with nothing to compare, whose advantages are exactly 0."""
    grouped = _grouped(_as_float(rewards), num_generations)
    scorable = ~torch.isnan(grouped)
    highest = torch.where(scorable, grouped, -torch.inf).amax(dim=1, keepdim=True)
    lowest = torch.where(scorable, grouped, torch.inf).amin(dim=1, keepdim=True)
    no_spread = (highest == lowest) | (scorable.sum(dim=1, keepdim=True) < 2)
    return no_spread.expand_as(grouped).reshape(-1)


def group_zscore(
    rewards: torch.Tensor, num_generations: int, *, unbiased: bool = True, clamp: float | None = CLAMP
) -> torch.Tensor:
    """Stage one: per group of `num_generations` adjacent rewards, (r - mean) / (std + 1e-4) clamped to +-clamp;
    exactly 0 for the rows of groups without spread (`zero_spread_rows`). The defaults are the seed's (unbiased
    std, clamp 10); MiniMind-3 takes the population std (`unbiased=False`) and no clamp (`clamp=None`).

    Returns a flat tensor; rows whose reward is NaN stay NaN so the next stage can leave them out.
    """
    rewards = _as_float(rewards)
    grouped = _grouped(rewards, num_generations)
    no_spread = zero_spread_rows(rewards, num_generations).view_as(grouped)
    if num_generations == 1:  # one completion per prompt: no spread, nothing to compare against
        return torch.where(torch.isnan(rewards), rewards, torch.zeros_like(rewards))
    scorable = ~torch.isnan(grouped)
    count = scorable.sum(dim=1, keepdim=True)
    # Groups without NaN take upstream's operations (bit for bit); the others their scorable rows' statistics.
    complete = count == num_generations
    masked_mean = torch.where(scorable, grouped, 0.0).sum(dim=1, keepdim=True) / count.clamp(min=1)
    mean = torch.where(complete, grouped.mean(dim=1, keepdim=True), masked_mean)
    squared = torch.where(scorable, (grouped - masked_mean) ** 2, 0.0).sum(dim=1, keepdim=True)
    divisor = (count - 1).clamp(min=1) if unbiased else count.clamp(min=1)
    masked_std = torch.where(count > 1, (squared / divisor).sqrt(), 0.0)
    std = torch.where(complete, grouped.std(dim=1, keepdim=True, correction=1 if unbiased else 0), masked_std)
    advantages = (grouped - mean) / (std + GROUP_STD_EPS)
    if clamp is not None:
        advantages = torch.clamp(advantages, -clamp, clamp)
    # no spread: exactly 0, whatever rounding did to the mean; NaN rows stay NaN (NaN - mean) for the next stage
    advantages = torch.where(no_spread & scorable, 0.0, advantages)
    return advantages.reshape(-1)


def batch_renormalize(advantages: torch.Tensor, zero_rows: torch.Tensor | None = None) -> torch.Tensor:
    """Stage two: (a - mean(a)) / (std(a) + 1e-8) over the scorable rows (unbiased std); NaN rows get 0.

    `zero_rows` (bool, same length) marks rows that come out exactly 0 although they count in the statistics:
    the rows of groups without spread, whose 0 - mean(a) would otherwise be rounding noise.
    """
    advantages = _as_float(advantages)
    nan = torch.isnan(advantages)
    if not nan.any():
        if advantages.numel() < 2:  # a single row has no spread (upstream's std would be NaN)
            return torch.zeros_like(advantages)
        normalized = (advantages - advantages.mean()) / (advantages.std() + BATCH_STD_EPS)
    else:
        scorable = advantages[~nan]
        if scorable.numel() == 0:
            return torch.zeros_like(advantages)
        if scorable.numel() > 1:
            std = scorable.std()
        else:
            std = torch.zeros((), dtype=advantages.dtype, device=advantages.device)
        normalized = (advantages - scorable.mean()) / (std + BATCH_STD_EPS)
        normalized = torch.where(nan, torch.zeros_like(normalized), normalized)
    if zero_rows is not None:
        zero_rows = zero_rows.reshape(-1).to(normalized.device)
        if zero_rows.shape != normalized.shape:
            raise ValueError(f"zero_rows has {zero_rows.numel()} rows for {normalized.numel()} advantages")
        normalized = torch.where(zero_rows, torch.zeros_like(normalized), normalized)
    return normalized


def minimind_advantages(rewards: torch.Tensor, num_generations: int) -> torch.Tensor:
    """Upstream's advantages for one process's batch of rewards, grouped by `num_generations` adjacent rows.

    Pure: returns a new tensor with the shape (and floating dtype) of `rewards`; integer rewards become float32.
    NaN rewards (unscorable completions) and groups without spread get advantage 0; NaN rows are left out of
    every statistic.
    """
    shape = rewards.shape
    stage_one = group_zscore(rewards, num_generations)
    return batch_renormalize(stage_one, zero_spread_rows(rewards, num_generations)).view(shape)


# --------------------------------------------------------------------------- the registry

TRL_ADVANTAGES = "trl"  # TRL's own advantages: not a registered function, TRL computes them


@dataclass(frozen=True)
class AdvantageInputs:
    """What an estimator sees: the generation batch gathered from every process.

    `rewards` (N,): the weighted sum of the reward functions per completion; a prompt's `num_generations`
    completions are adjacent. `scorable` (N,, bool): False where no reward function could score the completion
    (TRL's None). Built by `from_rewards`, `rewards` holds no NaN: an unscorable row stands at the mean of its
    group's scorable rewards (0 in a group without any), so a baseline taken over the group is the scorable rows'
    own and the row itself sits at it; the trainer gives those rows advantage 0 whatever the estimator returns.
    `process_rows`: how many rows each process holds (the batch is the processes' slices in order), for
    estimators that normalise per process as the seed did; others ignore it.
    """

    rewards: torch.Tensor
    num_generations: int
    process_rows: int
    scorable: torch.Tensor | None = None  # None: every row whose reward is not NaN

    @classmethod
    def from_rewards(cls, rewards: torch.Tensor, num_generations: int, process_rows: int) -> "AdvantageInputs":
        """The inputs for `rewards` with NaN where unscorable: NaN rows filled as the class says."""
        rewards = _as_float(rewards)
        grouped = _grouped(rewards, num_generations)
        scorable = ~torch.isnan(grouped)
        count = scorable.sum(dim=1, keepdim=True)
        mean = torch.where(scorable, grouped, 0.0).sum(dim=1, keepdim=True) / count.clamp(min=1)
        filled = torch.where(scorable, grouped, mean.expand_as(grouped))
        return cls(filled.reshape(-1), num_generations, process_rows, scorable.reshape(-1))

    def rewards_with_nan(self) -> torch.Tensor:
        """`rewards` with NaN in the unscorable rows: what the NaN-aware statistics below leave out."""
        if self.scorable is None:
            return self.rewards
        return torch.where(self.scorable, self.rewards, torch.nan)


AdvantageEstimator = Callable[[AdvantageInputs], torch.Tensor]
ADVANTAGE_ESTIMATORS: dict[str, AdvantageEstimator] = {}
ADVANTAGE_SEAM = Seam(
    "advantage_estimator",
    "advantage estimator",
    ("inputs",),
    ADVANTAGE_ESTIMATORS,
    reserved={TRL_ADVANTAGES: f"advantage estimator name {TRL_ADVANTAGES!r} is reserved for TRL's own advantages"},
)


def register_adv_est(name: str) -> Callable[[AdvantageEstimator], AdvantageEstimator]:
    """Decorator: register `fn(inputs: AdvantageInputs) -> Tensor (N,)` as `advantage_estimator: <name>`."""
    return ADVANTAGE_SEAM.register(name)


def get_adv_estimator(name: str) -> AdvantageEstimator:
    return ADVANTAGE_SEAM.get(name)


def estimate_advantages(name: str, rewards: torch.Tensor, num_generations: int, process_rows: int) -> torch.Tensor:
    """The registered estimator `name` on the gathered `rewards` (NaN: unscorable), checked where it returns: a
    tensor of one finite advantage per scorable row. Unscorable rows get 0."""
    fn = get_adv_estimator(name)
    inputs = AdvantageInputs.from_rewards(rewards, num_generations, process_rows)
    advantages = fn(inputs)
    who = f"advantage estimator {name!r} ({function_name(fn)}; recipe key advantage_estimator)"
    if not isinstance(advantages, torch.Tensor):
        raise ExtensionError(f"{who} returned a {type(advantages).__name__}; expected a tensor of one advantage per "
                             f"completion, shape {tuple(rewards.shape)}")
    if advantages.shape != rewards.shape:
        raise ExtensionError(f"{who} returned shape {tuple(advantages.shape)} for {tuple(rewards.shape)} rewards")
    if not torch.isfinite(advantages[inputs.scorable]).all():
        raise ExtensionError(f"{who} returned a non-finite advantage for a scored row")
    return torch.where(inputs.scorable, advantages, 0.0).to(rewards.dtype)


@register_adv_est("minimind")
def minimind_estimator(inputs: AdvantageInputs) -> torch.Tensor:
    """The seed's advantages: group z-scores over the gathered batch (a group may span processes), then the batch
    re-normalisation over each process's own rows, as upstream normalised per rank. Unscorable rows stay out of
    every statistic."""
    rewards = inputs.rewards_with_nan()
    stage_one = group_zscore(rewards, inputs.num_generations)
    no_spread = zero_spread_rows(rewards, inputs.num_generations)
    pieces = zip(stage_one.split(inputs.process_rows), no_spread.split(inputs.process_rows), strict=True)
    return torch.cat([batch_renormalize(advantages, zero_rows) for advantages, zero_rows in pieces])


@register_adv_est("group_zscore")
def group_zscore_estimator(inputs: AdvantageInputs) -> torch.Tensor:
    """MiniMind-3's advantages: `(r - mean) / (std(unbiased=False) + 1e-4)` per group; no clamp, no batch step.
    Groups without spread get exactly 0 (upstream's arithmetic may leave ~1e-5 of rounding there); unscorable rows
    stay out of the group statistics."""
    advantages = group_zscore(inputs.rewards_with_nan(), inputs.num_generations, unbiased=False, clamp=None)
    return torch.nan_to_num(advantages, nan=0.0)


__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "ADVANTAGE_SEAM",
    "TRL_ADVANTAGES",
    "AdvantageInputs",
    "batch_renormalize",
    "estimate_advantages",
    "get_adv_estimator",
    "group_zscore",
    "group_zscore_estimator",
    "minimind_advantages",
    "minimind_estimator",
    "register_adv_est",
    "zero_spread_rows",
]
