"""Preference tuning (``train.stage: dpo``) and reward models (``train.stage: rm``): the loss of a micro-batch of
chosen/rejected pairs, its metrics, and the evaluation of pairs.

A reward model scores each sequence with a scalar head on its last token (model.trained_model_config); its loss
is the pairwise −log σ(r_c − r_r) (InstructGPT's, TRL's RewardTrainer's), its rewards the scores themselves.

A micro-batch of B pairs is one forward of 2B sequences (the chosen sides, then the rejected: data/collate.py).
A sequence's log-probability is the sum of its completion tokens' (prompt tokens never count). The reference's
comes from the same model with its LoRA adapters disabled (no second copy of the weights) or, for full
fine-tuning, from a frozen copy (sharded like the policy under FSDP). Per pair, with
Δ = (log π_c − log π_ref,c) − (log π_r − log π_ref,r) and β = ``pref_beta``:

- ``sigmoid`` (DPO, Rafailov et al. 2023): −log σ(βΔ); ``dpo_label_smoothing`` ε makes it conservative DPO,
  −(1−ε) log σ(βΔ) − ε log σ(−βΔ) (LLaMA-Factory's and TRL's cDPO).
- ``hinge`` (SLiC): max(0, 1 − βΔ).
- ``ipo``: (Δ' − 1/(2β))², Δ' with each side's log-ratio per completion token (TRL's normalisation, which the
  IPO authors confirmed).
- ``simpo`` (Meng et al. 2024): −log σ(β(ā_c − ā_r) − γ) with ā the mean log-probability per completion token
  and γ = ``simpo_gamma``; no reference.
- ``orpo`` (Hong et al. 2024): −ā_c − β log σ(log odds_c − log odds_r), odds = p/(1−p) of the mean per-token
  probability; no reference.

``pref_ftx`` adds ``pref_ftx`` × (−ā_c), an SFT term on the chosen reply (LLaMA-Factory's). The step's loss is
the mean over the pairs of the global batch: every micro-batch of every rank holds the same number of pairs
(whole global batches only), so this rank's mean / accumulation, averaged over ranks by DDP or FSDP, is that
mean, on 1 worker or N. Rewards are TRL's: β × the log-ratio (DPO, hinge, IPO) or β × ā (SimPO, ORPO).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from scaletrain.config.stages import PREFERENCE_STAGES
from scaletrain.data import IGNORE_INDEX, model_inputs
from scaletrain.model import context_parallel
from scaletrain.worker.parallel import all_reduce_sum, unwrap

if TYPE_CHECKING:
    from scaletrain.config.schema import TrainConfig
    from scaletrain.worker.trainer import Trainer

REFERENCE_FREE = ("simpo", "orpo")
# What a step records about its pairs (sums over them, then means over the record's pairs): TRL's names.
STATS = ("rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins", "logps/chosen",
         "logps/rejected")


def needs_reference(train: TrainConfig) -> bool:
    return train.stage == "kto" or (train.stage == "dpo" and train.pref_loss not in REFERENCE_FREE)


def holds_reference(train: TrainConfig, lora: bool) -> bool:
    """Whether training keeps a frozen copy of the model (full fine-tuning, a reference, none precomputed)."""
    return needs_reference(train) and not lora and not train.precompute_ref_logps


@dataclass
class Sides:
    """Per-pair sums of completion log-probabilities (and completion token counts) of the chosen and rejected
    sides."""

    chosen: torch.Tensor
    rejected: torch.Tensor
    chosen_tokens: torch.Tensor
    rejected_tokens: torch.Tensor

    @classmethod
    def of(cls, logits: torch.Tensor, labels: torch.Tensor, shifted: bool = False) -> Sides:
        """From the logits of a [chosen; rejected] batch and its labels (-100 off the completions); ``shifted``:
        a context-parallel shard's targets, whose sums are completed over the group (both sides of a pair are
        rows of the same batch, so on the same group)."""
        logps, tokens = sequence_logps(logits, labels, shifted)
        if shifted:
            logps, tokens = context_parallel.sum_over_group(logps), context_parallel.sum_over_group(tokens)
        (c, r), (nc, nr) = logps.chunk(2), tokens.chunk(2)
        return cls(c, r, nc, nr)

    def mean(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.chosen / self.chosen_tokens.clamp(min=1), self.rejected / self.rejected_tokens.clamp(min=1)


def sequence_logps(logits: torch.Tensor, labels: torch.Tensor, shifted: bool = False
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Each sequence's summed next-token log-probability over its labelled tokens (fp32), and their count
    (``shifted``: the labels are next-token targets already)."""
    if not shifted:
        logits, labels = logits[:, :-1], labels[:, 1:]
    logits = logits.float()
    mask = labels != IGNORE_INDEX
    picked = logits.gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1) - logits.logsumexp(-1)
    return (picked * mask).sum(-1), mask.sum(-1)


def pair_losses(train: TrainConfig, policy: Sides, reference: Sides | None
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(the loss of each pair, the chosen rewards, the rejected rewards) for ``train.pref_loss``."""
    kind, beta, eps = train.pref_loss, train.pref_beta, train.dpo_label_smoothing
    avg_c, avg_r = policy.mean()
    if kind in REFERENCE_FREE:
        if kind == "simpo":
            logits = beta * (avg_c - avg_r) - train.simpo_gamma
            losses = -(1 - eps) * F.logsigmoid(logits) - eps * F.logsigmoid(-logits)
        else:
            log_odds = (avg_c - avg_r) - (_log1mexp(avg_c) - _log1mexp(avg_r))
            losses = -avg_c - beta * F.logsigmoid(log_odds)
        chosen_rewards, rejected_rewards = beta * avg_c.detach(), beta * avg_r.detach()
    else:
        ratio_c, ratio_r = policy.chosen - reference.chosen, policy.rejected - reference.rejected
        delta = ratio_c - ratio_r
        if kind == "sigmoid":
            losses = -(1 - eps) * F.logsigmoid(beta * delta) - eps * F.logsigmoid(-beta * delta)
        elif kind == "hinge":
            losses = torch.relu(1 - beta * delta)
        else:  # ipo
            per_token = ratio_c / policy.chosen_tokens.clamp(min=1) - ratio_r / policy.rejected_tokens.clamp(min=1)
            losses = (per_token - 1 / (2 * beta)) ** 2
        chosen_rewards, rejected_rewards = beta * ratio_c.detach(), beta * ratio_r.detach()
    if train.pref_ftx > 0:
        losses = losses + train.pref_ftx * -avg_c
    return losses, chosen_rewards, rejected_rewards


def kto_losses(train: TrainConfig, policy: torch.Tensor, reference: torch.Tensor, kl: float | torch.Tensor,
               desirable: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """KTO (Ethayarajh et al. 2024, Eq. 7; TRL's KTOTrainer): per example, with r = log π − log π_ref and z the
    batch's KL estimate, a desirable reply's loss is w_d (1 − σ(β(r − z))), an undesirable one's w_u (1 − σ(β(z −
    r))). Returns (the losses, the rewards β r)."""
    beta, ratio = train.pref_beta, policy - reference
    losses = torch.where(desirable.bool(), train.kto_chosen_weight * (1 - torch.sigmoid(beta * (ratio - kl))),
                         train.kto_rejected_weight * (1 - torch.sigmoid(beta * (kl - ratio))))
    return losses, beta * ratio.detach()


def _kto(t: Trainer, batch: dict) -> tuple[torch.Tensor, list[float]]:
    """KTO on a batch of [examples; mismatched prompt-reply pairs]: the examples' losses, and the KL estimate from
    the mismatched ones (no gradient, the mean over every rank's batch, at least 0)."""
    n = len(batch["kto_tag"])
    own, mismatched = ({k: v[part] for k, v in batch.items() if k in ("input_ids", "labels", "attention_mask")}
                       for part in (slice(0, n), slice(n, 2 * n)))
    policy, _ = sequence_logps(_forward(t.model, own), own["labels"])
    with torch.no_grad():
        policy_kl, _ = sequence_logps(_forward(t.model, mismatched), mismatched["labels"])
        reference, _ = sequence_logps(_reference_logits(t, own), own["labels"])
        reference_kl, _ = sequence_logps(_reference_logits(t, mismatched), mismatched["labels"])
    kl = max(0.0, all_reduce_sum([float((policy_kl - reference_kl).mean())], t.ctx.device)[0] / t.ctx.world_size)
    desirable = batch["kto_tag"].bool()
    losses, rewards = kto_losses(t.cfg.train, policy, reference, kl, desirable)
    sums = [float(rewards[desirable].sum()), float(rewards[~desirable].sum()), float(desirable.sum()),
            float((~desirable).sum()), kl, 1.0, float(n)]
    return losses, sums


def _log1mexp(x: torch.Tensor) -> torch.Tensor:
    """log(1 − exp(x)) for x < 0, stable on both sides of −log 2 (Mächler 2012)."""
    return torch.where(x > -math.log(2), torch.log(-torch.expm1(x)), torch.log1p(-torch.exp(x)))


def stat_sums(policy: Sides, chosen_rewards: torch.Tensor, rejected_rewards: torch.Tensor) -> list[float]:
    """Sums over the pairs of STATS (and the number of pairs last)."""
    margins = chosen_rewards - rejected_rewards
    return [float(chosen_rewards.sum()), float(rejected_rewards.sum()), float((margins > 0).float().sum()),
            float(margins.sum()), float(policy.chosen.detach().sum()), float(policy.rejected.detach().sum()),
            float(len(margins))]


def stat_means(sums: list[float], prefix: str = "", stage: str = "dpo") -> dict[str, float]:
    if stage == "kto":  # [desirable rewards, undesirable rewards, their counts, KL estimates, micro-batches, n]
        chosen, rejected = sums[0] / max(sums[2], 1.0), sums[1] / max(sums[3], 1.0)
        return {f"{prefix}rewards/chosen": chosen, f"{prefix}rewards/rejected": rejected,
                f"{prefix}rewards/margins": chosen - rejected, f"{prefix}kl": sums[4] / max(sums[5], 1.0)}
    n = max(sums[-1], 1.0)
    names = STATS if stage == "dpo" else STATS[:4]  # a reward model has rewards, no log-probabilities
    return {f"{prefix}{name}": value / n for name, value in zip(names, sums)}


def reward_losses(model, batch: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A reward model's (pair losses, chosen scores, rejected scores) on a [chosen; rejected] batch."""
    scores = model(**model_inputs(batch, labels=False)).logits.squeeze(-1).float()
    chosen, rejected = scores.chunk(2)
    return -F.logsigmoid(chosen - rejected), chosen.detach(), rejected.detach()


def _losses(t: Trainer, batch: dict) -> tuple[torch.Tensor, list[float]]:
    """The pair losses of a batch and their STATS sums, for the trainer's stage."""
    if t.cfg.train.stage == "kto":
        return _kto(t, batch)
    if t.cfg.train.stage == "rm":
        losses, chosen, rejected = reward_losses(t.model, batch)
        zeros = Sides(torch.zeros_like(chosen), torch.zeros_like(rejected), chosen, rejected)  # no log-probs
        return losses, stat_sums(zeros, chosen, rejected)
    reference = reference_sides(t, batch)
    policy = Sides.of(_forward(t.model, batch), *_labels(batch))
    losses, chosen_rewards, rejected_rewards = pair_losses(t.cfg.train, policy, reference)
    return losses, stat_sums(policy, chosen_rewards, rejected_rewards)


def _labels(batch: dict) -> tuple[torch.Tensor, bool]:
    return (batch["shift_labels"], True) if "shift_labels" in batch else (batch["labels"], False)


def _shard(t: Trainer, batch: dict) -> dict:
    """A context-parallel rank's share of a pair batch (context_parallel.py); the batch itself without CP."""
    if t.ctx.cp_size == 1:
        return batch
    batch = context_parallel.shard_batch(batch, t.ctx.cp_size, t.ctx.cp_rank, t.spec.pad_token_id)
    context_parallel.set_batch(batch)
    return batch


def _forward(model, batch: dict) -> torch.Tensor:
    return model(**model_inputs(batch, labels=False), use_cache=False).logits


@torch.no_grad()
def reference_sides(t: Trainer, batch: dict) -> Sides | None:
    """The reference model's sides: the adapters disabled (LoRA), or the frozen copy (full fine-tuning)."""
    if not needs_reference(t.cfg.train):
        return None
    if "ref_logps" in batch:  # precomputed before training (with_reference_logps)
        ref = batch["ref_logps"]
        return Sides(ref[:, 0], ref[:, 1], torch.zeros_like(ref[:, 0]), torch.zeros_like(ref[:, 1]))
    return Sides.of(_reference_logits(t, batch), *_labels(batch))


@torch.no_grad()
def _reference_logits(t: Trainer, batch: dict) -> torch.Tensor:
    """The reference model's logits: the adapters disabled (LoRA), the frozen copy (full fine-tuning), or the model
    itself before any step (the precompute pass of full fine-tuning, which holds no copy)."""
    model = unwrap(t.model)
    context = model.disable_adapter() if t.lora else contextlib.nullcontext()
    with context:
        return _forward(model if t.lora or t.reference is None else t.reference, batch)


def micro_loss(t: Trainer, batch: dict, n_micro: int) -> torch.Tensor:
    """This micro-batch's share of the step's loss (the pairs' mean / the accumulation); its STATS sums are added
    to ``t.objective_sums`` for the step's record."""
    losses, sums = _losses(t, batch)
    if t.ctx.cp_rank == 0:  # a context-parallel group's ranks hold the same pairs: counted once
        for i, v in enumerate(sums):
            t.objective_sums[i] += v
    return losses.mean() / n_micro


@torch.no_grad()
def evaluate_pairs(t: Trainer, data, collate) -> dict[str, float]:
    """The preference loss and STATS over the eval pairs (every rank its shard, the same number of forwards on
    every rank, sums all-reduced)."""
    if len(data) == 0:
        return {}
    was_training = t.model.training
    t.model.eval()
    ctx, size = t.ctx, t.cfg.train.per_device_eval_batch_size
    mine = list(range(ctx.dp_rank, len(data), ctx.dp_size))
    n_batches = math.ceil(math.ceil(len(data) / ctx.dp_size) / size)
    sums, loss_sum = [0.0] * (len(STATS) + 1), 0.0
    for b in range(n_batches):
        idx = mine[b * size:(b + 1) * size]
        batch = collate([data[i] for i in (idx or [0])])
        batch = _shard(t, {k: v.to(ctx.device) for k, v in batch.items()})
        with t.precision.autocast():
            losses, batch_sums = _losses(t, batch)
        # a rank out of examples still runs the forward (FSDP gathers collectively), counts nothing; a
        # context-parallel group counts its pairs once
        if idx and ctx.cp_rank == 0:
            loss_sum += float(losses.sum())
            sums = [a + v for a, v in zip(sums, batch_sums)]
    *sums, loss_sum = all_reduce_sum([*sums, loss_sum], ctx.device)
    t.model.train(was_training)
    return {"eval/loss": loss_sum / max(sums[-1], 1.0), "eval/pairs": sums[-1],
            **stat_means(sums, "eval/", t.cfg.train.stage)}


def reference_key(cfg) -> str:
    """What the reference log-probabilities depend on besides the data (whose cache entry holds them): the initial
    model (a built-in's random weights come from the seed) and the precision it runs in."""
    import hashlib
    import json

    model = cfg.model.model_dump(mode="json", exclude={"lora_rank", "lora_alpha", "lora_dropout", "lora_target"})
    what = {"model": model, "seed": cfg.train.seed, "bf16": cfg.train.bf16, "fp16": cfg.train.fp16}
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16]


def with_reference_logps(t: Trainer, splits: dict, collate) -> dict:
    """Each split with a ``ref_logps`` column: the reference's [chosen, rejected] log-probabilities of every pair,
    computed once by the initial model (every rank a share, summed over ranks) and kept beside the tokenized data
    in its cache entry, so a resumed run reads the same numbers and training never holds a reference model."""
    from pathlib import Path

    from scaletrain.errors import TrainingError
    from scaletrain.worker.parallel import barrier

    path = Path(t.spec.train_path).parent / f"reference_logps-{reference_key(t.cfg)}.pt"
    have = all_reduce_sum([0.0 if path.is_file() else 1.0], t.ctx.device)[0] == 0  # every rank sees it
    if not have and t.progress.step > 0:
        raise TrainingError(f"train.precompute_ref_logps: {path} is gone; a resumed run needs the reference "
                            f"log-probabilities of its initial model: restore the file or start a new run")
    if have:
        table = torch.load(path)
    else:
        table = {name: _reference_table(t, ds, collate) for name, ds in splits.items()}
        if t.ctx.is_main:
            partial = path.with_suffix(".partial")
            torch.save(table, partial)
            partial.replace(path)  # whole or absent: never a half-written table
        barrier()
    return {name: ds.add_column("ref_logps", table[name].tolist()) for name, ds in splits.items()}


@torch.no_grad()
def _reference_table(t: Trainer, data, collate) -> torch.Tensor:
    """[pairs, 2] reference log-probabilities of ``data`` (every rank its shard, the same number of forwards)."""
    was_training = t.model.training
    t.model.eval()
    ctx, size = t.ctx, t.cfg.train.per_device_eval_batch_size
    mine = list(range(ctx.dp_rank, len(data), ctx.dp_size))
    n_batches = math.ceil(math.ceil(len(data) / ctx.dp_size) / size) if len(data) else 0
    table = torch.zeros(len(data), 2, dtype=torch.float64)
    for b in range(n_batches):
        idx = mine[b * size:(b + 1) * size]
        batch = collate([data[i] for i in (idx or [0])])
        batch = _shard(t, {k: v.to(ctx.device) for k, v in batch.items() if k != "ref_logps"})
        with t.precision.autocast():
            sides = reference_sides(t, batch)
        if idx and ctx.cp_rank == 0:  # summed over ranks below: a context-parallel group writes once
            table[idx] = torch.stack([sides.chosen, sides.rejected], dim=1).double().cpu()
    t.model.train(was_training)
    flat = all_reduce_sum(table.flatten().tolist(), ctx.device) if len(data) else []
    return torch.tensor(flat, dtype=torch.float32).reshape(len(data), 2)


class PreferenceObjective:
    """worker/objective.py's ``Objective`` for ``train.stage`` dpo, kto and rm."""

    stats = STATS

    def __init__(self, train: TrainConfig):
        self.train = train

    def holds_reference(self, train: TrainConfig, lora: bool) -> bool:
        return holds_reference(train, lora)

    def prepare(self, t: Trainer, splits: dict, collate) -> dict:
        return with_reference_logps(t, splits, collate) if self.train.precompute_ref_logps else splits

    def begin_step(self, t: Trainer, window: list[dict], step: int) -> list[dict]:
        return window

    def micro_loss(self, t: Trainer, batch: dict, n_micro: int) -> torch.Tensor:
        return micro_loss(t, batch, n_micro)

    def evaluate(self, t: Trainer, data, collate) -> dict[str, float]:
        return evaluate_pairs(t, data, collate)

    def record(self, sums: list[float]) -> dict[str, float]:
        return stat_means(sums, stage=self.train.stage)  # TRL's names: rewards/chosen, rewards/accuracies, ...


def objective_for(cfg) -> PreferenceObjective | None:
    """The objective of ``train.stage``: None for sft (the trainer's token or classification loss)."""
    if cfg.train.stage == "grpo":
        from scaletrain.worker.grpo import GRPOObjective

        return GRPOObjective(cfg)
    if cfg.train.stage == "distill":
        from scaletrain.worker.distill import DistillObjective

        return DistillObjective(cfg)
    return PreferenceObjective(cfg.train) if cfg.train.stage in PREFERENCE_STAGES else None
