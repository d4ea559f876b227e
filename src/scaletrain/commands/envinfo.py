"""`scaletrain env`: the facts a bug report needs, in one pasteable block (secrets redacted)."""

from __future__ import annotations

import os
import platform
import sys
from importlib import metadata

from scaletrain.envvars import COMM_PREFIXES, VISIBLE_DEVICE_VARS, snapshot
from scaletrain.redact import Redactor

PACKAGES = ("scaletrain", "torch", "ray", "transformers", "peft", "accelerate", "amdsmi", "nvidia-ml-py")


def _version(pkg: str) -> str:
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return "not installed"


def collect(environ=None) -> dict[str, object]:
    import torch

    environ = snapshot() if environ is None else environ
    info: dict[str, object] = {
        "OS": f"{platform.system()} {platform.release()} ({platform.machine()})",
        "Python": sys.version.split()[0],
        "CPUs": os.cpu_count(),
    }
    info.update({pkg: _version(pkg) for pkg in PACKAGES})
    info["torch build"] = (f"ROCm/HIP {torch.version.hip}" if getattr(torch.version, "hip", None)
                           else f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU only")
    nccl = None
    try:
        if torch.cuda.is_available():
            nccl = ".".join(map(str, torch.cuda.nccl.version()))
    except Exception:  # noqa: BLE001 - torch built without NCCL/RCCL
        nccl = None
    info["NCCL/RCCL"] = nccl or "n/a (no GPU or not built with it)"
    info["torch.distributed backends"] = ", ".join(
        b for b in ("nccl", "gloo", "mpi") if getattr(torch.distributed, f"is_{b}_available", lambda: False)())
    devices = []
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            devices.append(f"{i}: {p.name}, {p.total_memory / 1024**3:.1f} GiB")
    info["devices"] = devices or ["none (torch sees no GPU)"]
    info["visible devices"] = {k: environ.get(k, "(unset)") for k in VISIBLE_DEVICE_VARS}
    info["comm variables"] = {k: v for k, v in sorted(environ.items()) if k.startswith(COMM_PREFIXES)} or "(none set)"
    return info


def render(info: dict[str, object]) -> str:
    lines = ["scaletrain env (paste this into a bug report)"]
    for key, value in info.items():
        if isinstance(value, dict):
            lines.append(f"- {key}:")
            lines += [f"    {k}={v}" for k, v in value.items()]
        elif isinstance(value, list):
            lines.append(f"- {key}:")
            lines += [f"    {v}" for v in value]
        else:
            lines.append(f"- {key}: {value}")
    return Redactor.from_environment()("\n".join(lines))
