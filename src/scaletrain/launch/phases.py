"""Start-up, said as it happens: one console line per phase with the seconds since the command started.

The first line comes as soon as the config is checked (well under 2 s: the heavy imports come after it), so a
run never sits silent while data is prepared, Ray starts and the workers load the model. The same lines go to
main.log (held until the run directory exists). The workers' phases (started, model ready, first step) come from
the run's timeline and metrics, read by the driver's monitor (``observe``).
"""

from __future__ import annotations

import time

from rich.markup import escape

# Rank 0's timeline marks (metrics/goodput.py) and what they mean to a user.
WORKER_PHASES = {"worker_start": "workers started", "model_ready": "model built and restored: training starts"}


def process_start() -> float:
    """When this command started (the process's creation time), not when scaletrain's code began to run."""
    try:
        import psutil

        return psutil.Process().create_time()
    except (ImportError, OSError):
        return time.time()


class Phases:
    def __init__(self, console, started: float | None = None):
        self.console, self.started = console, process_start() if started is None else started
        self.events = None
        self.pending: list[str] = []
        self.seen: set[str] = set()

    def __call__(self, what: str, once: str | None = None) -> None:
        if once is not None:
            if once in self.seen:
                return
            self.seen.add(once)
        elapsed = time.time() - self.started
        self.console.print(f"[dim]{elapsed:5.1f} s[/] {escape(what)}", soft_wrap=True)
        line = f"{what} ({elapsed:.1f} s after the command started)"
        if self.events is not None:
            self.events("phase", line)
        else:
            self.pending.append(line)

    def attach(self, events) -> None:
        """main.log exists: the phases so far, then each as it comes."""
        self.events = events
        for line in self.pending:
            events("phase", line)
        self.pending = []

    def observe(self, kind: str, record: dict) -> None:
        """A record the monitor read: a timeline mark of rank 0, or a metrics record (the first step)."""
        if record.get("time", 0) < self.started:  # an earlier session's, in a resumed run
            return
        if kind == "timeline" and record.get("event") in WORKER_PHASES:
            self(WORKER_PHASES[record["event"]], once=record["event"])
        elif kind == "metrics" and record.get("kind") == "train":
            self(f"training: step {record.get('step')} logged", once="first_step")
