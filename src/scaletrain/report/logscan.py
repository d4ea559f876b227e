"""Scan every worker log for errors, warnings and tracebacks, grouped across ranks: `[rank 0, 3] (x4): ...`."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from scaletrain.rundir import RunDir

_LINE = re.compile(r"^\S+ \S+ \[rank (\d+)\] (ERROR|WARNING|CRITICAL) (\S+): (.*)$")
_NUMBERS = re.compile(r"(?<![A-Za-z_])\d+(?:\.\d+)?")


@dataclass
class Finding:
    level: str
    message: str
    ranks: set[int] = field(default_factory=set)
    count: int = 0

    def line(self) -> str:
        ranks = ", ".join(map(str, sorted(self.ranks)))
        return f"[rank {ranks}] (x{self.count}) {self.level}: {self.message}"


def scan_logs(run_dir: str | Path) -> list[Finding]:
    """Findings from ``logs/worker-*.log``, most frequent first. Tracebacks count as one ERROR each,
    keyed by their last line; messages that differ only in numbers (steps, pids, times) are grouped."""
    groups: dict[tuple[str, str], Finding] = {}

    def add(rank: int, level: str, message: str) -> None:
        key = (level, _NUMBERS.sub("N", message))
        f = groups.setdefault(key, Finding(level, message))
        f.ranks.add(rank)
        f.count += 1

    for path in RunDir(run_dir).worker_logs():
        rank = int(path.stem.split("-")[1])
        in_tb = False
        for raw in path.read_text(errors="replace").splitlines():
            m = _LINE.match(raw)
            if m:
                in_tb = False
                add(int(m.group(1)), m.group(2), m.group(4)[:300])
                continue
            if raw.startswith("Traceback (most recent call last)"):
                in_tb = True
                continue
            if in_tb and raw and not raw.startswith((" ", "\t")):
                add(rank, "TRACEBACK", raw[:300])
                in_tb = False
    return sorted(groups.values(), key=lambda f: (-f.count, f.level, f.message))
