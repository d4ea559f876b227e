"""Backend choice and per-worker device mapping, as pure functions of the platform and environment.

The device mapping fixes the AMD "invalid device ordinal" class of bug (ray-project/ray#49260):
under Ray Train V2 a ROCm worker's HIP_VISIBLE_DEVICES holds only its own GPU while the shared
CUDA_VISIBLE_DEVICES lists every GPU of the node, so indexing by local rank is wrong. We index
into whichever visible list matches what the runtime reports.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Mapping, Sequence

from scaletrain.envvars import (
    CUDA_VISIBLE_DEVICES,
    HIP_VISIBLE_DEVICES,
    ROCR_VISIBLE_DEVICES,
)
from scaletrain.errors import LaunchError

Vendor = Literal["rocm", "cuda", "cpu"]


@dataclass(frozen=True)
class Platform:
    """What torch on this machine can drive."""

    vendor: Vendor
    device_count: int
    torch_version: str = ""

    @classmethod
    def detect(cls) -> "Platform":
        import torch

        if getattr(torch.version, "hip", None):
            vendor: Vendor = "rocm"
        elif getattr(torch.version, "cuda", None):
            vendor = "cuda"
        else:
            vendor = "cpu"
        count = torch.cuda.device_count() if vendor != "cpu" and torch.cuda.is_available() else 0
        return cls(vendor=vendor, device_count=count, torch_version=torch.__version__)

    @property
    def has_gpu(self) -> bool:
        return self.vendor != "cpu" and self.device_count > 0


@dataclass(frozen=True)
class BackendChoice:
    backend: Literal["nccl", "gloo"]
    note: str | None = None


def select_backend(requested: str, platform: Platform) -> BackendChoice:
    """Map ``comm.backend`` to a torch.distributed backend, or raise with the fix."""
    if requested == "gloo":
        return BackendChoice("gloo")
    if requested == "auto":
        return BackendChoice("nccl" if platform.has_gpu else "gloo")
    if requested == "rccl":
        if platform.vendor == "cuda":
            raise LaunchError("comm.backend=rccl is ROCm's NCCL, but this torch is a CUDA build; "
                              "set comm.backend=nccl or auto")
        if platform.vendor == "rocm" and platform.has_gpu:
            return BackendChoice("nccl", "comm.backend=rccl: using torch's 'nccl' backend, which is RCCL on ROCm")
    if not platform.has_gpu:
        build = {"cpu": "a CPU-only build", "rocm": "a ROCm build", "cuda": "a CUDA build"}[platform.vendor]
        raise LaunchError(
            f"comm.backend={requested} needs a GPU, but torch {platform.torch_version} ({build}) sees none; "
            f"set comm.backend=gloo or auto"
        )
    return BackendChoice("nccl")


def parse_visible(value: str | None) -> list[str] | None:
    if value is None:
        return None
    return [v.strip() for v in value.split(",") if v.strip()]


def local_device_index(
    vendor: Vendor,
    environ: Mapping[str, str],
    local_rank: int,
    device_count: int,
    assigned_ids: Sequence[str] = (),
) -> int:
    """Index of this worker's GPU among the devices torch sees.

    ``assigned_ids`` are the GPU ids the scheduler gave this process (``ray.get_gpu_ids()``),
    in the numbering of the visible-device variables. Without them we fall back to the local rank.
    """
    if device_count <= 0:
        raise LaunchError(f"local rank {local_rank}: torch sees no GPU; check the visible-device variables")
    names = [HIP_VISIBLE_DEVICES, CUDA_VISIBLE_DEVICES] if vendor == "rocm" else [CUDA_VISIBLE_DEVICES]
    lists = [parse_visible(environ.get(n)) for n in names]
    # The list the runtime applied is the one whose length equals what torch reports.
    visible = next((lst for lst in lists if lst is not None and len(lst) == device_count), None)
    if assigned_ids and visible is not None:
        wanted = str(assigned_ids[0])
        if wanted in visible:
            return visible.index(wanted)
    if device_count == 1:
        return 0
    if local_rank < device_count:
        return local_rank
    shown = ", ".join(f"{n}={environ[n]}" for n in (*names, ROCR_VISIBLE_DEVICES) if n in environ) or "none set"
    raise LaunchError(
        f"local rank {local_rank} has no GPU: torch sees {device_count} device(s) ({shown}); "
        f"run at most {device_count} workers per node or fix the visible-device variables"
    )


def reconcile_rocr(environ: Mapping[str, str]) -> tuple[dict[str, str], str | None]:
    """Make a shell's ROCR_VISIBLE_DEVICES usable by Ray, which only accepts HIP_VISIBLE_DEVICES.

    ROCR filters first and renumbers the remaining devices 0..k-1, so HIP_VISIBLE_DEVICES=0..k-1
    names the same GPUs. A HIP_VISIBLE_DEVICES the user set is left alone.
    """
    rocr = parse_visible(environ.get(ROCR_VISIBLE_DEVICES))
    if rocr is None or HIP_VISIBLE_DEVICES in environ:
        return {}, None
    hip = ",".join(str(i) for i in range(len(rocr)))
    note = (f"ROCR_VISIBLE_DEVICES={environ[ROCR_VISIBLE_DEVICES]} is set and Ray reads only "
            f"HIP_VISIBLE_DEVICES: setting HIP_VISIBLE_DEVICES={hip} (the same {len(rocr)} GPU(s), "
            f"numbered after ROCR's filter)")
    return {HIP_VISIBLE_DEVICES: hip}, note
