"""What happens when workers fail: the record in main.log, the error the user sees, and whether to retry.

Crashes (exceptions, killed processes) are retried by Ray Train itself, up to
``fault_tolerance.max_failures`` (FailureConfig), each time from the newest valid checkpoint.
A hang (a collective that hit ``comm.timeout_s``) is retried by our own policy,
``fault_tolerance.hang_retries`` times (default 1: restarting often clears a transient fault).
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from pathlib import Path

from scaletrain.comm.watchdog import HangReport, diagnose, looks_like_timeout
from scaletrain.errors import ScaletrainError, TrainingError
from scaletrain.rundir import RunDir


class RankFailures(Exception):
    """Per-rank causes gathered without Ray (torchrun: from the worker logs); ``training_error`` words them."""

    def __init__(self, groups: list[tuple[list[int], str]], none_reported: str):
        super().__init__(format_groups(groups) or none_reported)
        self.groups = groups


class Decision(enum.Enum):
    RETRY = "retry"
    RAISE = "raise"


@dataclass(frozen=True)
class HangRetryPolicy:
    hang_retries: int

    def decide(self, is_hang: bool, retries_used: int) -> Decision:
        if is_hang and (self.hang_retries < 0 or retries_used < self.hang_retries):
            return Decision.RETRY
        return Decision.RAISE


def _root_cause(exc: BaseException) -> BaseException:
    seen = set()
    while id(exc) not in seen:
        seen.add(id(exc))
        inner = getattr(exc, "cause", None) or exc.__cause__
        if not isinstance(inner, BaseException):
            break
        exc = inner
    return exc


_EXIT_TYPE = re.compile(r"Worker exit type: (\w+)")
_EXIT_DETAIL = re.compile(r"Worker exit detail: ([^.]*)")
MAX_CAUSE_CHARS = 240
DEAD_PROCESS = "worker process died"


def describe(exc: BaseException) -> str:
    """One line for a worker failure: a dead process, or ``Type: message`` of the innermost cause."""
    cause = _root_cause(exc)
    text = str(cause).strip()
    kind = _EXIT_TYPE.search(text)
    if kind:  # Ray reports a dead worker process; the signal itself is not passed on
        detail = _EXIT_DETAIL.search(text)
        return (f"{DEAD_PROCESS} ({kind.group(1)}: {detail.group(1).strip() if detail else 'no detail'}); "
                f"killed by a signal (SIGKILL, the OOM killer) or crashed")
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    line = lines[-1] if lines else ""
    return f"{type(cause).__name__}: {line[:MAX_CAUSE_CHARS]}"


def failures_by_rank(messages: dict[int, str]) -> list[tuple[list[int], str]]:
    """Ranks grouped by message, [([0, 3], "ValueError: ..."), ...], in rank order within a group."""
    groups: dict[str, list[int]] = {}
    # A dead process is the cause; errors of its peers ("connection reset") follow from it: list it first.
    for rank, text in sorted(messages.items(), key=lambda kv: (not kv[1].startswith(DEAD_PROCESS), kv[0])):
        groups.setdefault(text[:MAX_CAUSE_CHARS], []).append(rank)
    return [(ranks, text) for text, ranks in groups.items()]


def group_failures(failures: dict[int, BaseException]) -> tuple[list[tuple[list[int], str]], BaseException | None]:
    """Per-rank exceptions grouped by message (``failures_by_rank``); plus the user error all ranks share."""
    groups = failures_by_rank({rank: describe(exc) for rank, exc in failures.items()})
    user = None
    if len(groups) == 1:
        only = _root_cause(next(iter(failures.values())))
        user = only if isinstance(only, ScaletrainError) else None
    return groups, user


def format_groups(groups: list[tuple[list[int], str]]) -> str:
    return "; ".join(f"[rank {', '.join(map(str, ranks))}]: {msg}" for ranks, msg in groups)


def training_error(e: Exception, run_dir: Path, world_size: int,
                   timeout_s: int) -> tuple[ScaletrainError, HangReport | None]:
    """The one-line error for a failed fit(), and the hang diagnosis if the heartbeats show one."""
    failures = getattr(e, "worker_failures", None)
    ranks: list[int] = []
    if isinstance(e, RankFailures):
        text = str(e)
        ranks = sorted({r for group, _ in e.groups for r in group})
    elif failures:
        groups, user = group_failures(failures)
        if user is not None:
            return user, None
        text = format_groups(groups)
        ranks = sorted(failures)
    else:
        cause = _root_cause(e)
        if isinstance(cause, ScaletrainError):
            return cause, None
        text = describe(e)
    hang = diagnose(run_dir, world_size) if looks_like_timeout([text]) else None
    if hang is not None:
        text = f"{hang.message(timeout_s)}; worker errors: {text}"
    return TrainingError(f"training failed: {text}; see {logs_to_read(run_dir, ranks)}"), hang


def logs_to_read(run_dir: Path, ranks: list[int]) -> str:
    """The log files that say more about a failure: those of the failed ranks, else every worker log the run has,
    else main.log (named as they are on disk, never a pattern to fill in)."""
    rd = RunDir(run_dir)
    files = [rd.worker_log(r) for r in ranks] or rd.worker_logs() or [rd.events]
    return ", ".join(str(f) for f in files[:4]) + (f" (and {len(files) - 4} more)" if len(files) > 4 else "")
