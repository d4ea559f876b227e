"""What a worker's training used at its peak: torch's allocator on a GPU; on a CPU the growth of the process's
peak resident set over its size when training started: the kernel's own high-water mark (VmHWM), reset at the
start (``/proc/self/clear_refs``), so no sampling can miss a short peak and nothing before it counts; where it
cannot be reset, ``ru_maxrss`` of the (fresh) worker process. File-backed and shared pages that joined the
resident set meanwhile (library code a first backward or a first save touches, memory-mapped data, Ray's
object store) are not training memory: their growth, as still resident when the peak is read, is taken off
(tens of MiB; it varies by machine)."""

from __future__ import annotations

import resource

import psutil
import torch


class PeakMemory:
    def __init__(self, device: str):
        self.device = device
        self.gpu = device != "cpu" and torch.cuda.is_available()
        if self.gpu:
            torch.cuda.reset_peak_memory_stats(torch.device(device))
            self.baseline = 0
        else:
            self.reset = _reset_high_water_mark()
            self.baseline = psutil.Process().memory_info().rss
            self.mapped = _mapped_resident()

    def peak_bytes(self) -> int:
        if self.gpu:
            return int(torch.cuda.max_memory_allocated(torch.device(self.device)))
        hwm = _high_water_mark() if self.reset else None
        peak = hwm if hwm is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        mapped_growth = max(0, _mapped_resident() - self.mapped) if self.mapped is not None else 0
        return max(0, peak - self.baseline - mapped_growth)


def _reset_high_water_mark() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # Linux: reset the peak resident set size to the current one
        return _high_water_mark() is not None
    except OSError:
        return False


def _mapped_resident() -> int | None:
    """Resident bytes backed by files or shared memory (RssFile + RssShmem), where the kernel reports them."""
    found = {}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(("RssFile:", "RssShmem:")):
                    found[line.split(":")[0]] = int(line.split()[1]) * 1024
    except OSError:
        return None
    return sum(found.values()) if len(found) == 2 else None


def _high_water_mark() -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def memory_summary(cfg, shape: dict | None, world_size: int, device: str, measured: list[float]) -> dict:
    """summary.json's memory record: the peak measured on each rank (the largest one), and the plan's
    prediction for this job at this world size beside it. ``shape``: the model's memory shape, which the driver
    measured once (JobSpec.memory_shape; None when the meta-device pass could not run the model)."""
    from scaletrain.memory.estimate import Shape, estimate

    peak = max(measured)
    if shape is None:  # the measurement stands alone
        return {"memory/peak_bytes": int(peak), "memory/peak_bytes_per_rank": [int(m) for m in measured],
                "memory/predicted_error": "the driver could not estimate this model (see main.log's memory note)"}
    predicted = estimate(cfg, Shape(**shape), world_size, "cpu" if device == "cpu" else "gpu")
    # the allocator does not see the runtime's own share (context, workspaces): compare without the overhead
    comparable = predicted.peak - predicted.overhead
    return {"memory/peak_bytes": int(peak), "memory/peak_bytes_per_rank": [int(m) for m in measured],
            "memory/predicted_peak_bytes": predicted.peak,
            "memory/predicted_over_measured": comparable / peak if peak else None,
            "memory/predicted": predicted.as_dict(),
            "memory/measured_as": "torch allocator peak" if device != "cpu" else _cpu_measure(cfg)}


def _cpu_measure(cfg) -> str:
    from scaletrain.envvars import MALLOC_MMAP_THRESHOLD

    what = "peak resident set growth over the worker's start, file-backed pages excluded"
    if MALLOC_MMAP_THRESHOLD in cfg.comm.env:
        return what + f" ({MALLOC_MMAP_THRESHOLD}={cfg.comm.env[MALLOC_MMAP_THRESHOLD]}: freed tensors leave it)"
    return what + (f"; freed memory glibc keeps counts too (an upper bound): comm.env.{MALLOC_MMAP_THRESHOLD}=65536 "
                   f"measures the live peak, at a cost in speed")


def held_bytes(model, optimizer) -> tuple[int, int]:
    """The bytes of parameters and of optimizer state this rank holds (its shards under FSDP), as they are:
    what the plan's parameter and optimizer figures predict."""
    params = sum(stored_bytes(p) for p in model.parameters())
    optim = sum(stored_bytes(v) for state in optimizer.state.values()
                for v in state.values() if torch.is_tensor(v) and v.dim() > 0)  # not the scalar step counts
    return params, optim


def stored_bytes(t) -> int:
    """The bytes a tensor holds: this rank's shard of a DTensor; a tensor subclass (a QLoRA base's NF4 weight) by
    the inner tensors it stores, not by the dtype it reports."""
    t = t.to_local() if hasattr(t, "to_local") else t
    if hasattr(t, "__tensor_flatten__"):
        inner, _ = t.__tensor_flatten__()
        return sum(stored_bytes(getattr(t, name)) for name in inner)
    return t.numel() * t.element_size()
