"""One optimizer step over an accumulation window of micro-batches."""

from __future__ import annotations

import time

import torch

from scaletrain.worker.breakdown import device_sync, time_without_sync
from scaletrain.worker.parallel import grad_sync
from scaletrain.worker.trainer import Trainer


def train_step(t: Trainer, window: list[dict], step: int, poison: bool = False, timing: dict | None = None) -> float:
    """One optimizer step over ``window`` micro-batches; gradients sync on the last one only.

    With ``timing`` (a breakdown probe step) the phases are timed with device syncs in between."""
    strategy, device = t.cfg.train.strategy, t.ctx.device
    loss_sum = 0.0
    if timing is not None:
        if t.ctx.world_size > 1:  # one worker has no gradient sync to expose
            timing["compute_s"] = time_without_sync(t.model, window, strategy, device, t.precision, t.optimizer)
            timing["probe_s"] = timing["compute_s"]  # extra work of this probe: kept out of throughput
        t0 = time.perf_counter()
    for i, batch in enumerate(window):
        last = i == len(window) - 1
        batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
        # FSDP all-gathers parameters in forward, so there forward is a collective phase.
        t.beat.enter("forward-gather" if strategy == "fsdp" else "forward", step)
        with grad_sync(t.model, strategy, enabled=last), t.precision.autocast():
            loss = t.model(**batch).loss / len(window)
        if poison:  # fault injection: a NaN loss, as a diverging run produces
            loss = loss * float("nan")
        if last:
            t.beat.enter("sync", step)  # backward of the last micro-batch all-reduces gradients
        t.precision.backward(loss)
        loss_sum += loss.item()
    if timing is not None:
        device_sync(device)
        timing["fwd_bwd_sync_s"] = time.perf_counter() - t0
        timing.setdefault("compute_s", timing["fwd_bwd_sync_s"])
        t0 = time.perf_counter()
    t.beat.enter("optimizer", step)
    t.precision.unscale(t.optimizer)
    if t.cfg.train.max_grad_norm > 0:
        torch.nn.utils.clip_grad_norm_([p for p in t.model.parameters() if p.grad is not None],
                                       t.cfg.train.max_grad_norm)
    t.precision.step(t.optimizer)
    t.scheduler.step()
    t.optimizer.zero_grad(set_to_none=True)
    if timing is not None:
        device_sync(device)
        timing["optimizer_s"] = time.perf_counter() - t0
    return loss_sum
