"""Group-relative advantages (TRL 1.13's ``sum_then_normalize``): the weighted sum of the reward functions per
completion, minus its group's mean, divided by the group's std (``group``), the whole batch's (``batch``) or not at
all (``none``); a completion every function returned None for is unscorable: left out of its group's mean and std,
its advantage 0. Computed on the step's whole batch (gathered from every rank), so every rank and every world size
computes the same numbers."""

from __future__ import annotations

import torch

EPS = 1e-4  # TRL's


def nanstd(x: torch.Tensor, dim: int | None = None, keepdim: bool = False) -> torch.Tensor:
    """The sample std ignoring NaNs (TRL's ``nanstd``: Bessel's correction over the values present, NaN for one)."""
    mean = torch.nanmean(x, dim=dim, keepdim=True)
    var = torch.nanmean((x - mean) ** 2, dim=dim, keepdim=keepdim)
    count = (~torch.isnan(x)).sum(dim=dim, keepdim=keepdim) if dim is not None else (~torch.isnan(x)).sum()
    correction = torch.where(count > 1, count / (count - 1).clamp(min=1), torch.full_like(var, float("nan")))
    return torch.sqrt(var * correction)


def advantages(per_func: torch.Tensor, weights: torch.Tensor, num_generations: int,
               scale: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages [N], rewards [N]) from ``per_func`` [N, F] (NaN where a function returned None); the rows are
    groups of ``num_generations`` consecutive completions of one prompt."""
    unscorable = torch.isnan(per_func).all(dim=1)
    rewards = (per_func * weights.unsqueeze(0)).nansum(dim=1)
    rewards[unscorable] = torch.nan
    grouped = rewards.view(-1, num_generations)
    mean = torch.nanmean(grouped, dim=1).repeat_interleave(num_generations)
    if scale == "batch":
        std = nanstd(rewards).expand_as(rewards)
    else:
        std = nanstd(grouped, dim=1).repeat_interleave(num_generations)
    adv = rewards - mean
    if scale != "none":
        adv = adv / (std + EPS)
    return torch.nan_to_num(adv, nan=0.0), rewards  # unscorable (and lone) completions: no signal
