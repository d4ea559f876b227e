"""Metric records written as JSON lines. Keys carry their unit: ``time/step_s``, ``memory/rss_gib``."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import psutil

GIB = 1024**3


class JsonlSink:
    def __init__(self, path: str | Path):
        self.path = Path(path)

    def write(self, record: dict[str, Any]) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    p = Path(path)
    if not p.exists():
        return []
    out = []
    for line in p.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line being written right now
    return out


class ProcessStats:
    """CPU % and memory of this process; cheap enough to call every logging step."""

    def __init__(self):
        self.proc = psutil.Process()
        self.proc.cpu_percent(None)  # first call primes the counter

    def sample(self, device: str) -> dict[str, float]:
        out = {
            "system/cpu_pct": self.proc.cpu_percent(None),
            "memory/rss_gib": self.proc.memory_info().rss / GIB,
            "memory/host_used_pct": psutil.virtual_memory().percent,
        }
        if device.startswith("cuda"):
            import torch

            out["memory/allocated_gib"] = torch.cuda.memory_allocated() / GIB
            out["memory/peak_gib"] = torch.cuda.max_memory_allocated() / GIB
        return out


def now() -> float:
    return time.time()
