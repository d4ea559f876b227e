"""The processes a driver starts for a run end with it, however it dies; the next `train` or `doctor` names any left.

An embedded Ray (launch/ray_launcher.py) fate-shares its GCS and raylet with the driver, but not the processes they
started: after a driver's SIGKILL (an OOM kill, a closed terminal) Ray's agents and the run's actors
(``ray::TrainController``, its workers) were seen alive with parent 1 for 15 minutes, 410 MB each. Ray offers no
option for it (``ray.init`` has none, and its ``fate_share`` covers the processes ray.init starts itself), so:

- before the embedded Ray starts, the driver puts its mark in its environment (``SCALETRAIN_RUN_DRIVER``: its pid
  and start time); every process Ray starts inherits it;
- a reaper, in a session of its own, waits for the driver's end (a pidfd: no polling), then stops every process
  with that mark (SIGTERM, then SIGKILL after a grace period);
- ``leftovers()`` finds marked processes whose driver is gone, and Ray's orphaned worker processes (``ray::...``
  with parent 1: their raylet is gone) that an older driver left, for `train` and `doctor` to name.

Processes of another user cannot be read (their environment is private) and are not judged.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass

from scaletrain import envvars

MARK = envvars.SCALETRAIN_RUN_DRIVER
_REAPER: list[subprocess.Popen] = []  # this process's reaper (one, whatever the number of embedded Ray starts)


def token_of(pid: int) -> str:
    import psutil

    return f"{pid}:{psutil.Process(pid).create_time():.2f}"


def driver_alive(token: str) -> bool:
    import psutil

    pid, _, created = token.partition(":")
    try:
        return f"{psutil.Process(int(pid)).create_time():.2f}" == created
    except (psutil.Error, ValueError):
        return False


def mark_and_watch() -> None:
    """Mark this driver's environment for what it starts next and start its reaper (once a process)."""
    token = token_of(os.getpid())
    envvars.apply({MARK: token})
    if _REAPER and _REAPER[0].poll() is None:
        return
    env = {k: v for k, v in envvars.snapshot().items() if k != MARK}  # the reaper is not its own prey
    _REAPER[:] = [subprocess.Popen([sys.executable, "-m", __name__, token], env=env, start_new_session=True,
                                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                   close_fds=True)]


def marked(token: str | None = None):
    """(process, its mark) of every readable process with a mark (``token``: that mark only)."""
    import psutil

    for p in psutil.process_iter():
        try:
            mark = p.environ().get(MARK)
        except (psutil.Error, OSError):
            continue
        if mark and (token is None or mark == token) and p.pid != os.getpid():
            yield p, mark


def reap(token: str, grace_s: float = 5.0) -> int:
    """Stop every process with ``token``'s mark; how many there were."""
    import psutil

    stopped = 0
    for _ in range(3):  # a process may start another while the first are stopped
        procs = [p for p, _ in marked(token)]
        if not procs:
            break
        stopped += len(procs)
        for p in procs:
            try:
                p.terminate()
            except psutil.Error:
                pass
        _, alive = psutil.wait_procs(procs, timeout=grace_s)
        for p in alive:
            try:
                p.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(alive, timeout=grace_s)
    return stopped


def wait_for_end(token: str) -> None:
    """Until the driver of ``token`` has ended (a pidfd where the kernel has them, else a poll a second)."""
    import select

    pid = int(token.partition(":")[0])
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        fd = None
    if fd is not None and driver_alive(token):  # the pid is still the driver's: its pidfd is
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        poller.poll()
        os.close(fd)
        return
    while driver_alive(token):
        time.sleep(1.0)


@dataclass(frozen=True)
class Leftover:
    pid: int
    name: str
    rss_mb: float
    driver: str  # the dead driver's pid, or "" for an orphaned Ray process without a mark


def leftovers() -> list[Leftover]:
    """Processes of an earlier run whose driver is gone: marked ones, and Ray's orphaned worker processes."""
    import psutil

    out, seen = [], set()
    for p, mark in marked():
        if not driver_alive(mark):
            seen.add(p.pid)
            out.append(_leftover(p, mark.partition(":")[0]))
    orphans = [p for p in psutil.process_iter(["name", "cmdline", "ppid"]) if p.pid not in seen
               and p.info["ppid"] == 1 and " ".join(p.info["cmdline"] or []).startswith("ray::")]
    if orphans:  # a cluster being stopped orphans its workers for a moment before they exit: only those that stay
        _, orphans = psutil.wait_procs(orphans, timeout=ORPHAN_GRACE_S)
    out += [_leftover(p, "") for p in orphans]
    return [x for x in out if x is not None]


# How long an orphaned ray:: process must outlive its raylet to be a leftover: `ray stop` (and a driver's own Ray
# shutting down) ends the raylet first, and its workers, reparented to pid 1 meanwhile, exit within seconds.
ORPHAN_GRACE_S = 5.0


def _leftover(p, driver: str) -> Leftover | None:
    import psutil

    try:
        cmd = p.cmdline()
        name = cmd[0] if cmd and cmd[0].startswith("ray::") else p.name()
        return Leftover(p.pid, name, p.memory_info().rss / 2**20, driver)
    except psutil.Error:
        return None


def describe(left: list[Leftover]) -> str:
    """One line: what is left, and how to stop it."""
    drivers = sorted({x.driver for x in left if x.driver})
    whose = f" (driver pid {', '.join(drivers)}, gone)" if drivers else " (their driver is gone)"
    shown = ", ".join(f"{x.name} (pid {x.pid}, {x.rss_mb:.0f} MB)" for x in left[:6])
    more = f" and {len(left) - 6} more" if len(left) > 6 else ""
    return (f"{len(left)} process(es) of an earlier run are still running{whose}: {shown}{more}; they hold memory "
            f"and CPUs this run needs: stop them with kill {' '.join(str(x.pid) for x in left)}")


def main(argv: list[str]) -> int:
    token = argv[0]
    wait_for_end(token)
    reap(token)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
