"""The process torchrun starts: read the JobSpec, join the process group, run the loop."""

from __future__ import annotations

import sys


def main(argv: list[str]) -> int:
    import torch.distributed as dist

    from scaletrain.comm.context import context_from_torchrun
    from scaletrain.config.schema import Config
    from scaletrain.launch.torchrun_launcher import read_spec
    from scaletrain.worker.loop import train

    spec = read_spec(argv[1])
    timeout_s = Config.model_validate(spec.config).comm.timeout_s
    ctx = context_from_torchrun(spec.backend, timeout_s)
    try:
        train(ctx, spec)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
