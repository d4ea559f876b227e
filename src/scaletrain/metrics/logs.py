"""Where logs go: ``logs/main.log`` (key events of the run, driver and rank 0) and one
``logs/worker-<rank>.log`` per rank (everything that rank logs, warnings included)."""

from __future__ import annotations

import logging
import re
import sys
import time
from pathlib import Path

from scaletrain.rundir import RunDir

WORKER_LOGGER = "scaletrain.worker"
_LINE_FORMAT = "%(asctime)s [rank {rank}] %(levelname)s %(name)s: %(message)s"
# A rank's failure, as the worker logs it and as the torchrun launcher reads it back from the log files.
_FAILURE = "rank %d failed at step %d (phase %s): %s: %s%s"
_FAILURE_LINE = re.compile(r"\[rank (\d+)\] ERROR " + re.escape(WORKER_LOGGER)
                           + r": rank \d+ failed at step \d+ \(phase [\w-]+\): (.*)$")

class WorkerLogHandler(logging.FileHandler):
    """A rank's log file that a full disk cannot turn into console noise: logging's own handleError prints
    "--- Logging error ---" and a traceback for every record that fails to write (the in-process launcher's console
    is the user's); here the first failure is one warning line, and the lines are lost until there is space (as
    main.log's ``EventLog`` does)."""

    _scaletrain = True
    unwritable = False

    def handleError(self, record: logging.LogRecord) -> None:
        self._lost(sys.exc_info()[1])

    def flush(self) -> None:
        try:
            super().flush()
        except OSError as e:
            self._lost(e)

    def close(self) -> None:
        try:
            super().close()
        except OSError as e:  # the buffered lines could not be written either
            self._lost(e)

    def _lost(self, error) -> None:
        if not self.unwritable:
            self.unwritable = True
            reason = getattr(error, "strerror", None) or error
            sys.stderr.write(f"warning: {self.baseFilename} cannot be written ({reason}); its lines are lost until "
                             f"there is space\n")


def setup_worker_logging(run_dir: str | Path, rank: int, redactor=None) -> logging.Logger:
    """Send this process's logging and warnings to its per-rank file (appending across restarts)."""
    path = RunDir(run_dir).worker_log(rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    root = logging.getLogger()
    for h in list(root.handlers):
        if getattr(h, "_scaletrain", False):
            root.removeHandler(h)
    handler = WorkerLogHandler(path)
    handler.setFormatter(logging.Formatter(_LINE_FORMAT.format(rank=rank)))
    if redactor is not None:
        from scaletrain.redact import RedactingFilter

        handler.addFilter(RedactingFilter(redactor))
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    logging.captureWarnings(True)
    return logging.getLogger(WORKER_LOGGER)


def log_failure(rank: int, step: int, phase: str, exc: BaseException, note: str = "") -> None:
    """The line (with its traceback) that says this rank failed; ``parse_failure`` reads it back. ``note``: what
    else the failure report should say (a likely hardware fault)."""
    logging.getLogger(WORKER_LOGGER).error(_FAILURE, rank, step, phase, type(exc).__name__, exc,
                                           f" [{note}]" if note else "", exc_info=True)


def parse_failure(line: str) -> tuple[int, str] | None:
    """(rank, "Type: message") from a line ``log_failure`` wrote, else None."""
    m = _FAILURE_LINE.search(line)
    return (int(m.group(1)), m.group(2)) if m else None


class EventLog:
    """Appends one timestamped line per key event to ``logs/main.log``.

    Lines are short single writes in append mode, so the driver and rank 0 can share the file.
    """

    def __init__(self, run_dir: str | Path, who: str, redactor=None):
        self.path = RunDir(run_dir).events
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.who = who
        self.redact = redactor or (lambda text: text)
        self.unwritable = False

    def __call__(self, event: str, message: str = "") -> None:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        line = self.redact(f"{stamp} [{self.who}] {event}" + (f": {message}" if message else "")) + "\n"
        try:
            with open(self.path, "a") as f:
                f.write(line)
        except OSError as e:  # a full disk must not turn a log line into the run's failure; said once
            if not self.unwritable:
                self.unwritable = True
                sys.stderr.write(f"warning: {self.path} cannot be written ({e.strerror or e}); its lines are lost "
                                 f"until there is space\n")
