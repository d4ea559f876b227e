"""The process torchrun starts: wait for the JobSpec, join the process group, run the loop.

On a single node torchrun starts before the driver has prepared the data: the imports below (torch and
the worker loop, seconds on a small machine) run while the driver works, and the worker then waits for
the spec at the handoff path the driver writes.
"""

from __future__ import annotations

import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    import torch.distributed as dist

    from scaletrain import envvars
    from scaletrain.comm.context import context_from_torchrun
    from scaletrain.config.schema import Config
    from scaletrain.launch.torchrun_launcher import wait_for_handoff
    from scaletrain.model.build import preload
    from scaletrain.worker.loop import train

    envvars.apply_threads()  # a worker forked from a fork server loaded torch before torchrun set its threads
    preload()
    spec = wait_for_handoff(Path(argv[1]))
    timeout_s = Config.model_validate(spec.config).comm.timeout_s
    ctx = context_from_torchrun(spec.backend, timeout_s, spec.run_dir)
    try:
        train(ctx, spec)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
