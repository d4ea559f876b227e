"""torchrun's elastic agent, tied to the driver that started it.

``python -m scaletrain.launch.torchrun_agent DRIVER_PID [--fork-server=SOCK] [torchrun arguments]``: on Linux
the agent gets SIGTERM when the driver dies (prctl PR_SET_PDEATHSIG), and torchrun stops its workers on SIGTERM, so
a killed driver leaves no agent or worker behind. The agent runs in its own session (the driver's Ctrl-C
is the driver's to handle), so it cannot rely on the terminal's signals.

With a fork server on the node (``--fork-server``: the one that forks the workers, launch/warm/forkserver.py), the
agent is forked pre-imported too (torch: ~2.5 CPU-seconds a start here) and this process, the driver's child tied to
it as above, stands for it: it passes on the signals it gets (the driver's SIGTERM, the one its death sends) and
ends as the agent ended; where the server would not fork it (another environment), it execs the agent plainly,
still the driver's child.

The agent also says how the first of its workers to fail ended (``EXIT_LINE``, before torchrun restarts or
gives up): a rank killed by a signal writes no error of its own, and its peers may be stopped before they
report theirs, so the exit status is the one fact the driver always has about the rank that died. Only the
first (a rank killed by a signal before one that exited: _say_exits): the others' exits (SIGTERM) are torchrun
stopping them because of it.
"""

from __future__ import annotations

import ctypes
import os
import re
import signal
import sys

from scaletrain import forked

PR_SET_PDEATHSIG = 1
EXIT_LINE = "scaletrain-agent: rank {rank} exited with code {code}"
_EXIT_LINE = re.compile(r"scaletrain-agent: rank (\d+) exited with code (-?\d+)")


def parse_exit(line: str) -> tuple[int, int] | None:
    """(global rank, exit code) from a line ``EXIT_LINE`` wrote, else None (a negative code: -signal)."""
    m = _EXIT_LINE.search(line)
    return (int(m.group(1)), int(m.group(2))) if m else None


def describe_exit(code: int) -> str:
    """How a worker ended, from its exit code: "killed by SIGKILL (exit code -9)", "exit code 1"."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name} (exit code {code})"
        except ValueError:
            return f"killed by signal {-code} (exit code {code})"
    return f"exit code {code}"


def _say_exits() -> None:
    """Print ``EXIT_LINE`` for the first failed worker torchrun's agent sees.

    The agent's failures are keyed by global rank, in the order it found them: those it saw fail first, then
    those it stopped. The first is torchrun's own choice (its "failed (exitcode ...)" line): the earliest
    timestamp, the first found on a tie (``min`` keeps the first of equals); but a rank killed by a signal torchrun
    does not send (SIGKILL, SIGSEGV, ...; it stops the others with SIGTERM) comes before any that exited: it died
    and its peers' errors follow from it. A forked worker's stand-in (launch/warm/forkserver.py) learns of its
    child's death from the server a moment after a peer may have exited with the broken connection's error, so
    torchrun can find the peer first (seen under make test).
    """
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

    monitor = LocalElasticAgent._monitor_workers

    def monitor_and_say(self, worker_group):
        result = monitor(self, worker_group)
        if result.failures:
            killed = {r: f for r, f in result.failures.items() if f.exitcode < 0 and f.exitcode != -signal.SIGTERM}
            rank, failure = min((killed or result.failures).items(), key=lambda kv: kv[1].timestamp)
            print(EXIT_LINE.format(rank=rank, code=failure.exitcode), file=sys.stderr, flush=True)
        return result

    LocalElasticAgent._monitor_workers = monitor_and_say


MODULE = "scaletrain.launch.torchrun_agent"
FORK_SERVER = forked.FORK_SERVER_ARG
FORKED = "--forked"  # the agent itself, in the fork (or exec'd in its place) of the process tied to the driver


def main(argv: list[str]) -> int:
    if argv[:1] == [FORKED]:
        return _agent(argv[1:])
    driver = int(argv[0])
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != driver:  # the driver died before the line above took effect
        return 1
    if argv[1:2] and argv[1].startswith(FORK_SERVER):
        from scaletrain.launch.warm import forkserver

        return forkserver.call(argv[1][len(FORK_SERVER):], ["-m", MODULE, FORKED, *argv[2:]])
    return _agent(argv[1:])


def _agent(torchrun_args: list[str]) -> int:
    import logging

    from torch.distributed.run import main as torchrun

    # The agent's restart decisions ("Worker group FAILED. 1/1 attempts left; will restart worker group") are
    # INFO lines: the driver reads them to say each restart in main.log and on the console.
    logging.getLogger("torch.distributed.elastic.agent.server.api").setLevel(logging.INFO)
    _say_exits()
    torchrun(torchrun_args)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
