"""`scaletrain prune RUNS_DIR`: what old runs hold (checkpoints, the tokenized data copy, final/, logs) and the
tokenized-data caches beside them, and freeing what the user chooses: a dry run unless ``yes``; a run that is still
going (a worker process of it alive, or no summary and a heartbeat within the last minutes) is never touched.

Chosen: runs (and cache entries) older than ``older_than_days`` (by their newest file); a run goes whole, or with
``keep_final`` only its checkpoints and data copy go (final/, the config, metrics, report and logs stay: the model
and its record). Nothing is deleted outside RUNS_DIR's run directories and its cache."""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from scaletrain.errors import ConfigError
from scaletrain.rundir import RunDir

RECENT_HEARTBEAT_S = 300.0  # an unfinished run whose heartbeat moved this recently is taken to be going


@dataclass
class Item:
    path: Path
    kind: str  # "run", "cache"
    status: str  # "finished", "stopped or failed", "running", "cache entry"
    age_days: float
    parts: dict[str, int] = field(default_factory=dict)  # part -> bytes (checkpoints, data, final, logs, other)
    freed: int = 0  # bytes this prune frees (0: kept)
    why_kept: str = ""


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def _newest(path: Path) -> float:
    return max([path.stat().st_mtime, *(p.stat().st_mtime for p in path.rglob("*") if p.is_file())])


def _alive(pid_file: Path) -> bool:
    try:
        pid = int(pid_file.read_text().strip())
        os.kill(pid, 0)  # signal 0: does the process exist (nothing is sent)
        return True
    except (ValueError, OSError):
        return False


def status_of(run: RunDir, now: float) -> str:
    if any(_alive(p) for p in run.pids):
        return "running"
    if run.finished():
        return "finished"
    beats = list(run.heartbeats.glob("*")) if run.heartbeats.is_dir() else []
    if beats and now - max(b.stat().st_mtime for b in beats) < RECENT_HEARTBEAT_S:
        return "running"
    return "stopped or failed"


def survey(root: Path, now: float | None = None) -> list[Item]:
    """Every run directory under ``root`` and every tokenized-data cache entry of its default cache, with sizes."""
    now = time.time() if now is None else now
    if not root.is_dir():
        raise ConfigError(f"prune {root}: no such directory; give the output.output_dir that holds the runs")
    if RunDir(root).is_run():  # one run named: pruned alone, and never while it is going
        if status_of(RunDir(root), now) == "running":
            raise ConfigError(f"prune {root}: the run is still going (a worker of it is alive); prune never touches "
                              f"a running run: stop it first (Ctrl-C, or scaletrain jobs stop)")
        dirs = [root]
    else:
        dirs = sorted(p for p in root.iterdir() if p.is_dir())
    items = []
    for d in dirs:
        run = RunDir(d)
        if not run.is_run():
            continue
        parts = {name: _size(d / name) for name in (RunDir.CHECKPOINTS, RunDir.DATA, RunDir.FINAL, "logs")
                 if (d / name).exists()}
        parts["other"] = _size(d) - sum(parts.values())
        items.append(Item(d, "run", status_of(run, now), (now - _newest(d)) / 86400, parts))
    cache = root / ".cache" / "data"  # data/prepare.py's default cache_root for runs under root
    for entry in sorted(cache.iterdir()) if cache.is_dir() else []:
        items.append(Item(entry, "cache", "cache entry", (now - _newest(entry)) / 86400, {"cache": _size(entry)}))
    if not items:
        raise ConfigError(f"prune {root}: holds no scaletrain run directory (none with {RunDir.RESOLVED_CONFIG}) and "
                          f"no data cache; give the output.output_dir that holds the runs")
    return items


def choose(items: list[Item], older_than_days: float, keep_final: bool) -> list[Item]:
    """What a prune frees of each item (``freed``), and why what stays stays."""
    going = any(i.status == "running" for i in items)
    for i in items:
        if i.status == "running":
            i.why_kept = "still going"
        elif i.age_days < older_than_days:
            i.why_kept = f"newer than {older_than_days:g} days"
        elif i.kind == "cache" and going:
            i.why_kept = "a run is going (it may read this cache)"
        elif i.kind == "run" and keep_final:
            i.freed = i.parts.get(RunDir.CHECKPOINTS, 0) + i.parts.get(RunDir.DATA, 0)
            i.why_kept = "final/ and the records kept (--keep-final)" if i.freed else "nothing but final/ and records"
        else:
            i.freed = sum(i.parts.values())
    return items


def apply(items: list[Item], keep_final: bool) -> int:
    """Delete what ``choose`` chose; returns the bytes freed. A run that started since the survey is left alone."""
    freed, now = 0, time.time()
    for i in items:
        if not i.freed:
            continue
        if i.kind == "run" and status_of(RunDir(i.path), now) == "running":
            continue
        if i.kind == "run" and keep_final:
            for name in (RunDir.CHECKPOINTS, RunDir.DATA):
                shutil.rmtree(i.path / name, ignore_errors=True)
        else:
            shutil.rmtree(i.path, ignore_errors=True)
        freed += i.freed
    return freed
