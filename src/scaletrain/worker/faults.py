"""Fault injection for tests and failure drills: ``SCALETRAIN_FAULTS=KIND:RANK:STEP[:TIMES],...``.

KIND is ``raise`` (an exception), ``exit`` (the process dies with SIGKILL, like an OOM kill), ``hang`` (the rank
sleeps forever before its next collective), ``nan`` (that step's loss becomes NaN), ``ioerror`` (the rank's
next checkpoint write fails midway with an I/O error), ``slow`` (a straggler: from STEP on, the rank's every step
takes TIMES milliseconds longer, as a slow device's would: ``slow:1:5:300``), ``pause`` (from STEP on, the rank
sleeps TIMES milliseconds before each step: a run made longer at no CPU cost, for drills that need time, as the
elastic test's shrink and grow-back) or ``ecc`` (an exception as a GPU whose uncorrectable ECC errors rose would
raise it: the failure is reported as a likely hardware fault).
A fault fires at the start of optimizer step STEP on rank RANK, at most TIMES times per run (counted in
``faults/`` of the run directory, so a restarted worker group does not fire it again unless TIMES allows).
"""

from __future__ import annotations

import logging
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from scaletrain.errors import ConfigError

log = logging.getLogger("scaletrain.faults")
KINDS = ("raise", "exit", "hang", "nan", "ioerror", "slow", "pause", "ecc")
ARMED = ("nan", "ioerror")  # kinds that change what the step does rather than end it: maybe_fire(only=KIND)
DELAYS = ("slow", "pause")  # kinds that lengthen every step from theirs on (delay_s), never fired


class InjectedFault(RuntimeError):
    pass


class InjectedGpuFault(InjectedFault):
    """What a CPU run cannot produce: a failure on a GPU whose health counters say hardware (``ecc``)."""

    hardware_fault = "uncorrectable ECC errors rose by 1 (injected)"


@dataclass(frozen=True)
class Fault:
    kind: str
    rank: int
    step: int
    times: int = 1


def parse_faults(text: str) -> tuple[Fault, ...]:
    faults = []
    for item in filter(None, (t.strip() for t in (text or "").split(","))):
        parts = item.split(":")
        try:
            kind, rank, step, *rest = parts
            fault = Fault(kind, int(rank), int(step), int(rest[0]) if rest else 1)
        except ValueError:
            fault = None
        if fault is None or fault.kind not in KINDS or len(parts) > 4:
            raise ConfigError(f"SCALETRAIN_FAULTS: '{item}' must be KIND:RANK:STEP[:TIMES] with KIND in "
                              f"{', '.join(KINDS)}")
        faults.append(fault)
    return tuple(faults)


def delay_s(faults: tuple[Fault, ...], rank: int, step: int, kind: str = "slow") -> float:
    """The extra seconds a ``slow`` (busy) or ``pause`` (asleep) fault adds to this rank's step (0: none)."""
    return sum(f.times / 1000 for f in faults if f.kind == kind and f.rank == rank and step >= f.step)


def chaos_faults(kills: int, mtbf_steps: float, seed: int, target: str, total_steps: int, world_size: int,
                 ranks_per_node: int) -> tuple[Fault, ...]:
    """``kills`` SIGKILLs at random steps (exponential gaps of mean ``mtbf_steps``, a Poisson process of failures,
    the usual model of hardware faults) of a random worker, or of every worker of a random node; seeded, so a run
    and its benchmark repeat the same failures. Steps stay inside the run (2 .. total_steps) and distinct."""
    import random

    rng = random.Random(seed)
    steps, at = [], 1.0
    while len(steps) < kills:
        at += max(1.0, rng.expovariate(1.0 / mtbf_steps))
        step = 2 + (int(at) - 2) % max(1, total_steps - 1)  # wrap around: every kill lands inside the run
        while step in steps:
            step = 2 + (step - 1) % max(1, total_steps - 1)
        steps.append(step)
    faults = []
    for step in sorted(steps):
        if target == "node":
            node = rng.randrange(max(1, world_size // ranks_per_node))
            faults += [Fault("exit", r, step) for r in range(node * ranks_per_node, (node + 1) * ranks_per_node)]
        else:
            faults.append(Fault("exit", rng.randrange(world_size), step))
    return tuple(faults)


def maybe_fire(faults: tuple[Fault, ...], run_dir: str, rank: int, step: int, only: str | None = None) -> bool:
    """Fire the faults due now. ``only="nan"`` / ``"ioerror"`` handles that kind (returns True: poison this step's
    loss, fail the next checkpoint write); otherwise the other kinds, which raise, die or hang."""
    for f in faults:
        if f.kind in DELAYS or f.rank != rank or f.step != step or (f.kind in ARMED and f.kind != only) or (
                f.kind not in ARMED and only is not None):
            continue
        marker = Path(run_dir) / "faults" / f"{f.kind}-rank{rank}-step{step}"
        fired = int(marker.read_text()) if marker.exists() else 0
        if fired >= f.times:
            continue
        marker.parent.mkdir(exist_ok=True)
        marker.write_text(str(fired + 1))
        log.warning("injected fault '%s' at step %d on rank %d (%d of %d)", f.kind, step, rank, fired + 1, f.times)
        if f.kind in ARMED:
            return True
        if f.kind == "raise":
            raise InjectedFault(f"injected fault at step {step} on rank {rank}")
        if f.kind == "ecc":
            raise InjectedGpuFault(f"injected GPU fault at step {step} on rank {rank}")
        if f.kind == "exit":
            os.kill(os.getpid(), signal.SIGKILL)
        while True:  # hang
            time.sleep(3600)
    return False
