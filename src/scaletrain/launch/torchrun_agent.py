"""torchrun's elastic agent, tied to the driver that started it.

``python -m scaletrain.launch.torchrun_agent DRIVER_PID [torchrun arguments]``: on Linux the agent gets
SIGTERM when the driver dies (prctl PR_SET_PDEATHSIG), and torchrun stops its workers on SIGTERM, so a
killed driver leaves no agent or worker behind. The agent runs in its own session (the driver's Ctrl-C
is the driver's to handle), so it cannot rely on the terminal's signals.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def main(argv: list[str]) -> int:
    driver = int(argv[0])
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != driver:  # the driver died before the line above took effect
        return 1
    import logging

    from torch.distributed.run import main as torchrun

    # The agent's restart decisions ("Worker group FAILED. 1/1 attempts left; will restart worker group") are
    # INFO lines: the driver reads them to say each restart in main.log and on the console.
    logging.getLogger("torch.distributed.elastic.agent.server.api").setLevel(logging.INFO)
    torchrun(argv[1:])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
