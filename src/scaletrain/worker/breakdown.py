"""Step-time breakdown, sampled every ``monitor.breakdown_every`` steps (DDP and single-worker runs).

Exposed communication is measured, not modelled: on a probe step the same micro-batches first run
forward+backward with gradient sync off (DDP ``no_sync``), then the real step runs with sync on.
exposed_comm = t(forward+backward, sync) - t(forward+backward, no sync): the part of the gradient
all-reduce that backward did not hide. The probe's gradients are discarded and the RNG state restored,
so training is unchanged; it costs one extra forward+backward every K steps. Under FSDP, forward also
all-gathers parameters, so this subtraction would not isolate communication: the breakdown is skipped.
"""

from __future__ import annotations

import time

import torch

from scaletrain.checkpoint import rng_state, set_rng_state
from scaletrain.data import model_inputs
from scaletrain.worker.parallel import grad_sync


def device_sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def time_without_sync(model, window: list[dict], strategy: str, device: str, precision, optimizer) -> float:
    """Seconds of forward+backward over ``window`` with gradient sync off; leaves no trace in training."""
    saved = rng_state()
    device_sync(device)
    t0 = time.perf_counter()
    for batch in window:
        batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
        with grad_sync(model, strategy, enabled=False), precision.autocast():
            loss = model(**model_inputs(batch)).loss / len(window)
        loss.backward()
    device_sync(device)
    seconds = time.perf_counter() - t0
    optimizer.zero_grad(set_to_none=True)
    set_rng_state(saved)
    return seconds


def shares(data_s: float, compute_s: float, fwd_bwd_sync_s: float, optimizer_s: float) -> dict[str, float]:
    """The breakdown record: seconds and shares of the step (shares sum to 1)."""
    exposed = max(0.0, fwd_bwd_sync_s - compute_s)
    compute = fwd_bwd_sync_s - exposed
    total = data_s + compute + exposed + optimizer_s
    parts = {"data_wait": data_s, "compute": compute, "exposed_comm": exposed, "optimizer": optimizer_s}
    out = {f"time/{k}_s": v for k, v in parts.items()}
    out.update({f"share/{k}": (v / total if total > 0 else 0.0) for k, v in parts.items()})
    out["time/step_s"] = total
    return out
