"""Hang detection: per-rank heartbeats, stack dumps on stalls, and the driver's diagnosis.

Each worker records which phase of which step it is in (cheap attribute writes on the hot path);
a background thread writes that to ``heartbeat/rank-<R>.json (see rundir.py)`` every second and, when the phase
has not changed for ``stall_s``, dumps every thread's Python stack to ``stacks/rank-<R>.txt``.
When a collective times out (the process-group timeout, ``comm.timeout_s``), the driver reads the
heartbeats: the ranks waiting in a collective and the ranks that never arrived at it.
"""

from __future__ import annotations

import faulthandler
import json
import logging
import os
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from scaletrain.rundir import RunDir

log = logging.getLogger("scaletrain.watchdog")

# Phases in which a rank waits for every other rank.
COLLECTIVE_PHASES = {
    "sync": "the gradient sync",
    "forward-gather": "the FSDP parameter all-gather (forward)",
    "eval": "evaluation",
    "checkpoint": "a checkpoint save",
    "metrics": "the metrics all-reduce",
    "step-check": "the per-step NaN/stop check",
    "final": "the final model gather",
}


class Heartbeat:
    """Progress of one rank, published by a daemon thread. ``enter`` is the only hot-path call."""

    def __init__(self, run_dir: str | Path, rank: int, stall_s: float, interval_s: float = 1.0):
        self.run_dir, self.rank, self.stall_s, self.interval_s = Path(run_dir), rank, stall_s, interval_s
        self.phase, self.phase_step, self.since = "start", 0, time.time()
        self.step_done = 0
        self._dumped_since = None
        self._stop = threading.Event()
        RunDir(run_dir).heartbeats.mkdir(parents=True, exist_ok=True)
        self._thread = threading.Thread(target=self._run, name="scaletrain-heartbeat", daemon=True)
        self._thread.start()

    def enter(self, phase: str, step: int) -> None:
        self.phase, self.phase_step, self.since = phase, step, time.time()

    def finished_step(self, step: int) -> None:
        self.step_done = step

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.publish()
            since = self.since
            if time.time() - since > self.stall_s and self._dumped_since != since:
                self._dumped_since = since
                self.dump_stacks(f"no progress for {time.time() - since:.0f} s in phase {self.phase}")

    def publish(self) -> None:
        path = RunDir(self.run_dir).heartbeat(self.rank)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"rank": self.rank, "pid": os.getpid(), "step_done": self.step_done,
                                   "phase": self.phase, "phase_step": self.phase_step, "since": self.since,
                                   "time": time.time()}))
        os.replace(tmp, path)

    def dump_stacks(self, why: str) -> Path:
        path = RunDir(self.run_dir).stacks(self.rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as f:
            f.write(f"--- rank {self.rank} pid {os.getpid()} at {time.strftime('%H:%M:%S')}: {why}\n")
            f.flush()
            faulthandler.dump_traceback(f, all_threads=True)
        log.warning("rank %d: %s; Python stacks saved to %s", self.rank, why, path)
        return path

    def close(self, clean: bool) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        if clean:
            self.enter("exit", self.step_done)
        self.publish()


@dataclass
class HangReport:
    phase: str
    step: int
    waiting: list[int]
    missing: list[int]
    last_steps: dict[int, int | None]
    stacks: list[Path] = field(default_factory=list)

    def message(self, timeout_s: int) -> str:
        where = COLLECTIVE_PHASES.get(self.phase, self.phase)
        missing = ", ".join(map(str, self.missing))
        waiting = ", ".join(map(str, self.waiting))
        last = ", ".join(f"rank {r}: {'-' if s is None else s}" for r, s in sorted(self.last_steps.items()))
        text = (f"hang: rank(s) {missing} did not arrive at {where} of step {self.step}; rank(s) {waiting} waited "
                f"until the collective timeout (comm.timeout_s={timeout_s}); last finished step: {last}")
        if self.stacks:
            text += f"; Python stacks in {self.stacks[0].parent}"
        return text


def read_heartbeats(run_dir: str | Path, world_size: int) -> dict[int, dict]:
    out = {}
    for rank in range(world_size):
        p = RunDir(run_dir).heartbeat(rank)
        try:
            out[rank] = json.loads(p.read_text())
        except (OSError, json.JSONDecodeError):
            continue
    return out


def diagnose(run_dir: str | Path, world_size: int) -> HangReport | None:
    """Which ranks waited in a collective and which never arrived; None if heartbeats show no hang."""
    beats = read_heartbeats(run_dir, world_size)
    at = {r: (b["phase"], b["phase_step"]) for r, b in beats.items() if b["phase"] in COLLECTIVE_PHASES}
    if not at:
        return None
    # The collective the others wait in is the furthest one along; a stuck rank's stale phase is older.
    counts = Counter(at.values())
    phase, step = max(counts, key=lambda ps: (ps[1], counts[ps]))
    waiting = sorted(r for r, p in at.items() if p == (phase, step))
    missing = [r for r in range(world_size) if r not in waiting]
    if not missing:
        return None
    stacks = [p for p in (RunDir(run_dir).stacks(r) for r in range(world_size)) if p.exists()]
    last = {r: beats[r]["step_done"] if r in beats else None for r in range(world_size)}
    return HangReport(phase, step, waiting, missing, last, stacks)


_TIMEOUT_MARKERS = ("timed out", "timeout", "watchdog caught collective", "nccl communicator was aborted")


def looks_like_timeout(messages) -> bool:
    """True if any worker error reads like a collective that hit the process-group timeout."""
    return any(m in text.lower() for text in messages for m in _TIMEOUT_MARKERS)
