"""Which process a fork server forked for a caller (launch/warm/forkserver.py). The server forks a child for each
caller, so the child is the server's, not the caller's: what follows a process tree (the driver's memory,
metrics/sampler.py) would stop at the caller and miss the process that does the work. The server notes each child
under ``<socket>.forked/<caller pid>`` while it runs; a caller names its server's socket on its command line."""

from __future__ import annotations

import os
from pathlib import Path

CALLER_MODULE = "scaletrain.launch.warm.forkserver"  # ``python -m CALLER_MODULE SOCK ...``: a caller
FORK_SERVER_ARG = "--fork-server="  # torchrun's agent, a caller in its own process (launch/torchrun_agent.py)


def _notes(sock_path: str) -> Path:
    return Path(f"{sock_path}.forked")


def note(sock_path: str, caller: int, child: int) -> None:
    """The server forked ``child`` for ``caller``."""
    notes = _notes(sock_path)
    notes.mkdir(mode=0o700, exist_ok=True)
    (notes / str(caller)).write_text(f"{child} {os.getpid()}")


def forget(sock_path: str, caller: int) -> None:
    try:
        (_notes(sock_path) / str(caller)).unlink()
    except OSError:
        pass


def socket_of(cmdline: list[str]) -> str | None:
    """The fork server's socket a caller's command line names, or None (not a caller)."""
    for i, arg in enumerate(cmdline):
        if arg.startswith(FORK_SERVER_ARG):
            return arg[len(FORK_SERVER_ARG):]
        if arg == CALLER_MODULE and i > 0 and cmdline[i - 1] == "-m" and i + 1 < len(cmdline):
            return None if cmdline[i + 1] == "--serve" else cmdline[i + 1]
    return None


def child_of(proc):
    """The psutil.Process a fork server forked for ``proc``, or None: not a caller, or its child has ended (the
    note is checked against the server, the child's parent, so a pid used again is not taken for it)."""
    import psutil

    try:
        sock = socket_of(proc.cmdline())
        if sock is None:
            return None
        child, server = map(int, (_notes(sock) / str(proc.pid)).read_text().split())
        found = psutil.Process(child)
        return found if found.ppid() == server else None
    except (OSError, ValueError, psutil.Error):
        return None
