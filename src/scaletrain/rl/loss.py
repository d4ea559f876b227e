"""GRPO's policy loss and its 2026 variants, by TRL 1.13's names (trl/trainer/grpo_trainer.py ``_compute_loss``):
the same per-token terms, and the same normalisation where TRL's is global, so the loss equals TRL's on one process
and one micro-batch (tested), and 1 and N workers optimise the same loss (every normaliser is a count over the
whole step: all ranks, all micro-batches, ``Totals``).

Per completion token, with ratio r = exp(log π − log π_old) (token level; sequence level, GSPO: one r per completion,
the exponentiated mean of its tokens' log-ratios) and advantage A:

- grpo, bnpo, dr_grpo, dapo: −min(r A, clip(r, 1 − ε_low, 1 + ε_high) A) (PPO's clipped surrogate);
- cispo: −sg(min(r, ε_high)) A log π (the clipped ratio as a stop-gradient weight);
- sapo: −σ(τ (r − 1)) 4/τ A, τ by A's sign (a soft gate for the hard clip);

plus β × k3 KL to the reference, exp(ref − log π) − (ref − log π) − 1. The step's loss is then

- grpo, sapo: the mean over completions of each completion's token mean;
- bnpo, dapo, cispo: the token mean over every completion token of the step;
- dr_grpo: the token sum over (completions x max_completion_length).

This module is pure tensor code; it knows no rank or model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

SEQUENCE_MEAN = ("grpo", "sapo")
TOKEN_MEAN = ("bnpo", "dapo", "cispo")


@dataclass(frozen=True)
class Totals:
    """Counts over the whole optimizer step (every rank and micro-batch): the normalisers."""

    sequences: float
    tokens: float


@dataclass(frozen=True)
class Terms:
    """One micro-batch's per-token loss and what its metrics need."""

    per_token: torch.Tensor  # [B, T] (or [B, 1] at sequence level before the KL term broadcasts it)
    ratio: torch.Tensor  # r, [B, T] or [B, 1]
    kl: torch.Tensor | None  # [B, T]


def sampling_correction(old_logps: torch.Tensor, sampling_logps: torch.Tensor, mask: torch.Tensor, rl
                        ) -> torch.Tensor:
    """The importance weight of each completion token (token modes, [B, T]) or completion (sequence modes, [B, 1])
    for a sampler that is not the trainer: trainer / sampler probability of the sampled tokens, truncated or masked
    to [clip_min, clip_max] (TRL 1.13's ``vllm_importance_sampling_mode``; ``old_logps``: the trainer's, detached)."""
    diff = torch.nan_to_num((old_logps - sampling_logps) * mask, nan=0.0)  # an unscored token: no correction
    mode = rl.vllm_importance_sampling_mode
    ratio = torch.exp(diff.sum(dim=-1, keepdim=True) if mode.startswith("sequence") else diff)
    low, high = rl.vllm_importance_sampling_clip_min, rl.vllm_importance_sampling_clip_max
    if mode.endswith("truncate"):
        return torch.clamp(ratio, min=low, max=high)
    outside = (ratio < (low if low is not None else -math.inf)) | (ratio > (high if high is not None else math.inf))
    return ratio.masked_fill(outside, 0.0)


def off_policy_mask(advantages: torch.Tensor, logps: torch.Tensor, sampling_logps: torch.Tensor,
                    mask: torch.Tensor, threshold: float) -> torch.Tensor:
    """DeepSeek-V3.2's off-policy sequence mask (TRL's ``get_off_policy_mask``): [B, 1], 0 for a completion with a
    negative advantage whose mean per-token KL(sampler || policy) passes ``threshold``."""
    a = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages
    kl = torch.nan_to_num(sampling_logps - logps.detach(), nan=0.0)
    mean_kl = (kl * mask).sum(dim=1, keepdim=True) / mask.sum(dim=1, keepdim=True).clamp(min=1.0)
    return ((a >= 0) | (mean_kl <= threshold)).to(mask.dtype)


def generalized_jsd(student: torch.Tensor, teacher: torch.Tensor, beta: float) -> torch.Tensor:
    """The generalized Jensen-Shannon divergence of each position ([..., V] log-probabilities in; [...] out; TRL's
    GKD ``generalized_jsd_loss`` before its reduction): beta 0 is KL(teacher || student), 1 is KL(student ||
    teacher), between them the KLs of each to their beta-mixture."""
    import torch.nn.functional as F

    if beta == 0:
        return F.kl_div(student, teacher, reduction="none", log_target=True).sum(-1)
    if beta == 1:
        return F.kl_div(teacher, student, reduction="none", log_target=True).sum(-1)
    b = torch.tensor(beta, dtype=student.dtype, device=student.device)
    mixture = torch.logsumexp(torch.stack([student + torch.log1p(-b), teacher + torch.log(b)]), dim=0)
    return (b * F.kl_div(mixture, teacher, reduction="none", log_target=True)
            + (1 - b) * F.kl_div(mixture, student, reduction="none", log_target=True)).sum(-1)


def per_token_loss(logps: torch.Tensor, old_logps: torch.Tensor | None, ref_logps: torch.Tensor | None,
                   advantages: torch.Tensor, mask: torch.Tensor, rl, is_weights: torch.Tensor | None = None,
                   keep: torch.Tensor | None = None) -> Terms:
    """TRL's per-token terms for ``rl.loss_type`` (``rl``: the config's rl section). ``logps`` [B, T] carries the
    gradient; ``old_logps`` None: the policy that sampled is this one (num_iterations 1), its log-probs detached.
    ``keep``: the off-policy sequence mask; ``is_weights``: the sampler's correction (``sampling_correction``),
    applied as TRL applies them, to the policy term before the KL term is added."""
    old = logps.detach() if old_logps is None else old_logps
    a = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages
    log_ratio = logps - old
    if rl.importance_sampling_level == "sequence":
        log_ratio = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)
    ratio = torch.exp(log_ratio)
    eps_low, eps_high = rl.epsilon, rl.epsilon_high if rl.epsilon_high is not None else rl.epsilon
    if rl.loss_type == "cispo":
        loss = -torch.clamp(ratio, max=eps_high).detach() * a * logps
    elif rl.loss_type == "sapo":
        tau = torch.where(a > 0, rl.sapo_temperature_pos, rl.sapo_temperature_neg)
        loss = -torch.sigmoid(tau * (ratio - 1)) * 4 / tau * a
    else:
        clipped = torch.clamp(ratio, 1 - eps_low, 1 + eps_high)
        loss = -torch.min(ratio * a, clipped * a)
    if keep is not None:
        loss = loss * keep
    if is_weights is not None:
        loss = loss * is_weights
    kl = None
    if rl.beta != 0.0:
        delta = ref_logps - logps
        kl = torch.exp(delta) - delta - 1
        loss = loss + rl.beta * kl
    return Terms(loss, ratio, kl)


def reduce(per_token: torch.Tensor, mask: torch.Tensor, rl, totals: Totals) -> torch.Tensor:
    """This micro-batch's share of the step's loss (summed over the step's micro-batches and ranks it is the
    step's loss; see the module's docstring)."""
    masked = per_token * mask
    if rl.loss_type in SEQUENCE_MEAN:
        return (masked.sum(-1) / mask.sum(-1).clamp(min=1.0)).sum() / max(totals.sequences, 1.0)
    if rl.loss_type in TOKEN_MEAN:
        return masked.sum() / max(totals.tokens, 1.0)
    if rl.loss_type == "dr_grpo":
        return masked.sum() / max(totals.sequences * rl.max_completion_length, 1.0)
    raise ValueError(f"unknown loss_type {rl.loss_type}")


def clip_counts(terms: Terms, advantages: torch.Tensor, mask: torch.Tensor, rl) -> tuple[float, float, float]:
    """(low-clipped, high-clipped, counted) token counts, TRL's clip_ratio/low_mean and high_mean numerators."""
    a = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages
    r = terms.ratio
    eps_low, eps_high = rl.epsilon, rl.epsilon_high if rl.epsilon_high is not None else rl.epsilon
    if rl.loss_type == "cispo":
        low, high = torch.zeros_like(r, dtype=torch.bool), (r > eps_high) & (a > 0)
    else:
        low, high = (r < 1 - eps_low) & (a < 0), (r > 1 + eps_high) & (a > 0)
    if r.shape[1] == 1:  # sequence level: one ratio per completion
        return float(low.sum()), float(high.sum()), float(r.shape[0])
    return float((low * mask).sum()), float((high * mask).sum()), float(mask.sum())
