"""MiniMind's GRPO advantages: a per-group z-score, clamped, then re-normalised over the batch.

For N = B * G rewards (B prompts, G completions each, a prompt's completions adjacent) the seed computes

    a_i = clamp((r_i - mean_g) / (std_g + 1e-4), -10, 10)        # per group g, unbiased std
    A_i = (a_i - mean(a)) / (std(a) + 1e-8)                       # over the batch, unbiased std

Two stages are exposed because TRL scores the batch gathered from every process while the seed
normalised the second stage on each rank: the trainer runs `group_zscore` on the gathered rewards and
`batch_renormalize` on its own slice. `minimind_advantages` is both stages on one process's batch.

Beyond the seed (which would produce NaN):
* NaN rewards mark completions no reward function could score (TRL turns `None` into NaN). They are left
  out of every mean and std and get advantage 0, so they neither move the policy nor shift the baselines.
* A group or batch with fewer than two scorable rewards has no spread: its std counts as 0 (the seed's
  unbiased std would be NaN), so its rows get 0 from that stage.
Groups whose rewards are all equal give 0 as in the seed (0 / 1e-4), and a batch of equal stage-one
values gives 0 (0 / 1e-8). On NaN-free input the operations are the seed's, in the seed's order.
"""

import torch

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


def group_zscore(rewards: torch.Tensor, num_generations: int) -> torch.Tensor:
    """Stage one: per group of `num_generations` adjacent rewards, (r - mean) / (std + 1e-4) clamped to +-10.

    Returns a flat tensor; rows whose reward is NaN stay NaN so the next stage can leave them out.
    """
    rewards = _as_float(rewards)
    if num_generations < 1 or rewards.numel() % num_generations != 0:
        raise ValueError(f"{rewards.numel()} rewards cannot be split into groups of num_generations={num_generations}")
    if num_generations == 1:  # one completion per prompt: no spread, nothing to compare against
        return torch.where(torch.isnan(rewards), rewards, torch.zeros_like(rewards))
    grouped = rewards.view(-1, num_generations)
    scorable = ~torch.isnan(grouped)
    count = scorable.sum(dim=1, keepdim=True)
    # Groups without NaN take the seed's operations (bit for bit); the others their scorable rows' statistics.
    complete = count == num_generations
    masked_mean = torch.where(scorable, grouped, 0.0).sum(dim=1, keepdim=True) / count.clamp(min=1)
    mean = torch.where(complete, grouped.mean(dim=1, keepdim=True), masked_mean)
    squared = torch.where(scorable, (grouped - masked_mean) ** 2, 0.0).sum(dim=1, keepdim=True)
    masked_std = torch.where(count > 1, (squared / (count - 1).clamp(min=1)).sqrt(), 0.0)
    std = torch.where(complete, grouped.std(dim=1, keepdim=True), masked_std)
    advantages = torch.clamp((grouped - mean) / (std + GROUP_STD_EPS), -CLAMP, CLAMP)
    return advantages.reshape(-1)  # NaN rows stay NaN (NaN - mean), for the next stage to leave out


def batch_renormalize(advantages: torch.Tensor) -> torch.Tensor:
    """Stage two: (a - mean(a)) / (std(a) + 1e-8) over the scorable rows (unbiased std); NaN rows get 0."""
    advantages = _as_float(advantages)
    nan = torch.isnan(advantages)
    if not nan.any():
        if advantages.numel() < 2:  # a single row has no spread (the seed's std would be NaN)
            return torch.zeros_like(advantages)
        return (advantages - advantages.mean()) / (advantages.std() + BATCH_STD_EPS)
    scorable = advantages[~nan]
    if scorable.numel() == 0:
        return torch.zeros_like(advantages)
    std = scorable.std() if scorable.numel() > 1 else torch.zeros((), dtype=advantages.dtype, device=advantages.device)
    normalized = (advantages - scorable.mean()) / (std + BATCH_STD_EPS)
    return torch.where(nan, torch.zeros_like(normalized), normalized)


def minimind_advantages(rewards: torch.Tensor, num_generations: int) -> torch.Tensor:
    """The seed's advantages for one process's batch of rewards, grouped by `num_generations` adjacent rows.

    Pure: returns a new tensor with the shape (and floating dtype) of `rewards`; integer rewards become float32.
    NaN rewards (unscorable completions) get advantage 0 and are left out of every statistic.
    """
    shape = rewards.shape
    return batch_renormalize(group_zscore(rewards, num_generations)).view(shape)


__all__ = ["minimind_advantages", "group_zscore", "batch_renormalize"]
