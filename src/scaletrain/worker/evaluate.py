"""Evaluation sharded over ranks and all-reduced, so every rank holds identical numbers.

Sums (loss, correct, count) are reduced rather than per-rank means, so the result does not depend
on the world size beyond float summation order.
"""

from __future__ import annotations

import contextlib
import math
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from scaletrain.comm.context import DistContext
from scaletrain.data import IGNORE_INDEX, Collator, model_inputs
from scaletrain.model import context_parallel
from scaletrain.model.vision import packed_inputs
from scaletrain.worker.loss import chunked_labels, is_installed
from scaletrain.worker.parallel import all_reduce_sum

if TYPE_CHECKING:
    from scaletrain.worker.trainer import Trainer


def evaluate(t: Trainer, data, collate: Collator) -> dict[str, float]:
    """The trainer's model on ``data`` (every rank its shard), in the trainer's precision."""
    cfg = t.cfg
    if t.objective is not None:
        return t.objective.evaluate(t, data, collate)
    return evaluate_model(t.model, data, collate, t.ctx, cfg.train.per_device_eval_batch_size, cfg.model.task,
                          cfg.model.num_labels, t.precision.autocast,
                          shape=lambda batch: packed_inputs(batch, t.rope, t.masks_of))


@torch.no_grad()
def evaluate_model(model, data, collate: Collator, ctx: DistContext, batch_size: int,
                   task: str, num_labels: int, autocast, shape=None) -> dict[str, float]:
    """``shape``: what makes a batch the model's inputs beyond the collator (packed vision-language rows)."""
    if len(data) == 0:
        return {}
    was_training = model.training
    model.eval()
    mine = list(range(ctx.dp_rank, len(data), ctx.dp_size))  # a context-parallel group shares its examples
    # Same number of forward passes on every rank: FSDP gathers parameters collectively.
    per_rank = math.ceil(len(data) / ctx.dp_size)
    n_batches = math.ceil(per_rank / batch_size)
    loss_sum = correct = count = 0.0
    chunked = task == "causal-lm" and is_installed(model)  # the same token-loss sums, never the whole logits
    for b in range(n_batches):
        idx = mine[b * batch_size:(b + 1) * batch_size]
        weight = 1.0 if idx else 0.0
        batch = collate([data[i] for i in (idx or [0])])
        batch = {k: v.to(ctx.device) for k, v in batch.items()}
        batch = shape(batch) if shape is not None else batch
        shifted = ctx.cp_size > 1  # this rank's share of each sequence, targets shifted before the split
        if shifted:
            batch = context_parallel.shard_batch(batch, ctx.cp_size, ctx.cp_rank, collate.pad_token_id)
            context_parallel.set_batch(batch)
        labels = batch["shift_labels"] if shifted else batch["labels"]
        with autocast(), chunked_labels(model, labels, shifted) if chunked else contextlib.nullcontext():
            extra = {"use_cache": False} if task == "causal-lm" else {}  # packed rows: bounds from position_ids
            logits = model(**model_inputs(batch, labels=False), **extra).logits.float()
        if chunked:
            loss = logits  # the token-loss sum
            n = (labels[:, 1:] != IGNORE_INDEX).sum().item() if not shifted else (labels != IGNORE_INDEX).sum().item()
        elif task == "causal-lm":
            shift_logits, shift_labels = (logits, labels) if shifted else (logits[:, :-1], labels[:, 1:])
            loss = F.cross_entropy(shift_logits.reshape(-1, shift_logits.size(-1)), shift_labels.reshape(-1),
                                   ignore_index=IGNORE_INDEX, reduction="sum")
            n = (shift_labels != IGNORE_INDEX).sum().item()
        elif num_labels == 1:
            loss = F.mse_loss(logits.squeeze(-1), labels.float(), reduction="sum")
            n = labels.numel()
        else:
            loss = F.cross_entropy(logits, labels, reduction="sum")
            correct += weight * (logits.argmax(-1) == labels).sum().item()
            n = labels.numel()
        loss_sum += weight * loss.item()
        count += weight * n
    loss_sum, correct, count = all_reduce_sum([loss_sum, correct, count], ctx.device)
    model.train(was_training)
    mean = loss_sum / max(count, 1.0)
    out = {"eval/loss": mean, "eval/samples" if task != "causal-lm" else "eval/tokens": count}
    if task == "causal-lm":
        out["eval/perplexity"] = math.exp(min(mean, 50.0))
    elif num_labels > 1:
        out["eval/accuracy"] = correct / max(count, 1.0)
    return out
