"""Metric records written as JSON lines. Keys carry their unit: ``time/step_s``, ``memory/rss_gib``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

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
