"""Run the worker loop in this process as a 1-worker job, without Ray.

For tests and quick debugging: the same loop, run directory and files as a Ray run of 1 worker.
"""

from __future__ import annotations

from scaletrain.comm.context import DistContext
from scaletrain.worker.spec import JobSpec


def run_in_process(spec: JobSpec) -> dict:
    from scaletrain.worker.loop import train

    ctx = DistContext(world_rank=0, local_rank=0, world_size=1, local_world_size=1, node_rank=0,
                      device="cpu", backend=spec.backend)
    return train(ctx, spec)
