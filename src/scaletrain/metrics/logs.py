"""Where logs go: ``logs/main.log`` (key events of the run, driver and rank 0) and one
``logs/worker-<rank>.log`` per rank (everything that rank logs, warnings included)."""

from __future__ import annotations

import logging
import time
from pathlib import Path

MAIN_LOG = "logs/main.log"


def worker_log_path(run_dir: str | Path, rank: int) -> Path:
    return Path(run_dir) / "logs" / f"worker-{rank}.log"


def setup_worker_logging(run_dir: str | Path, rank: int, redactor=None) -> logging.Logger:
    """Send this process's logging and warnings to its per-rank file (appending across restarts)."""
    path = worker_log_path(run_dir, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    root = logging.getLogger()
    for h in list(root.handlers):
        if getattr(h, "_scaletrain", False):
            root.removeHandler(h)
    handler = logging.FileHandler(path)
    handler._scaletrain = True  # type: ignore[attr-defined]
    handler.setFormatter(logging.Formatter(f"%(asctime)s [rank {rank}] %(levelname)s %(name)s: %(message)s"))
    if redactor is not None:
        from scaletrain.redact import RedactingFilter

        handler.addFilter(RedactingFilter(redactor))
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    logging.captureWarnings(True)
    return logging.getLogger("scaletrain.worker")


class EventLog:
    """Appends one timestamped line per key event to ``logs/main.log``.

    Lines are short single writes in append mode, so the driver and rank 0 can share the file.
    """

    def __init__(self, run_dir: str | Path, who: str, redactor=None):
        self.path = Path(run_dir) / MAIN_LOG
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.who = who
        self.redact = redactor or (lambda text: text)

    def __call__(self, event: str, message: str = "") -> None:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        line = self.redact(f"{stamp} [{self.who}] {event}" + (f": {message}" if message else "")) + "\n"
        with open(self.path, "a") as f:
            f.write(line)
