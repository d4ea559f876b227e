"""The frozen distributed context handed to the worker loop; built once per worker process.

The worker loop, model and data code never read ranks from the environment: they get this object.
"""

from __future__ import annotations

from dataclasses import dataclass

from scaletrain import envvars
from scaletrain.comm.device import Platform, local_device_index
from scaletrain.envvars import (
    MASTER_ADDR,
    MASTER_PORT,
    TORCHELASTIC_RESTART_COUNT,
    TORCHELASTIC_USE_AGENT_STORE,
    TORCHRUN_LOCAL_RANK,
    TORCHRUN_LOCAL_WORLD_SIZE,
    TORCHRUN_NODE_RANK,
    TORCHRUN_RANK,
    TORCHRUN_WORLD_SIZE,
    apply_defaults,
    nccl_watchdog_env,
)
from scaletrain.rundir import RunDir


@dataclass(frozen=True)
class DistContext:
    world_rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: int
    device: str  # "cpu", "cuda:0" (ROCm GPUs are "cuda" devices in torch too)
    backend: str  # "nccl" (RCCL on ROCm) or "gloo"
    node_id: str = ""
    # A 2-D mesh of data x context parallel ranks: the ranks of one context-parallel group are consecutive, see
    # the same batch and hold 1/cp_size of each sequence (context_parallel.py).
    cp_size: int = 1

    @property
    def is_main(self) -> bool:
        return self.world_rank == 0

    @property
    def dp_size(self) -> int:
        """Ranks that see different data."""
        return self.world_size // self.cp_size

    @property
    def dp_rank(self) -> int:
        return self.world_rank // self.cp_size

    @property
    def cp_rank(self) -> int:
        return self.world_rank % self.cp_size


def context_from_ray(backend: str) -> DistContext:
    """Read Ray Train's worker context and pick this worker's device."""
    import ray
    import ray.train

    rc = ray.train.get_context()
    local_rank = rc.get_local_rank()
    device = "cpu"
    if backend == "nccl":
        platform = Platform.detect()
        index = local_device_index(
            platform.vendor, envvars.snapshot(), local_rank, platform.device_count,
            [str(i) for i in ray.get_gpu_ids()],
        )
        import torch

        torch.cuda.set_device(index)
        device = f"cuda:{index}"
    return DistContext(
        world_rank=rc.get_world_rank(),
        local_rank=local_rank,
        world_size=rc.get_world_size(),
        local_world_size=rc.get_local_world_size(),
        node_rank=rc.get_node_rank(),
        device=device,
        backend=backend,
        node_id=ray.get_runtime_context().get_node_id(),
    )


def context_from_torchrun(backend: str, timeout_s: int, run_dir: str) -> DistContext:
    """Read torchrun's rank variables, pick the device, and join the process group."""
    import socket
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    env = envvars.snapshot()
    local_rank = int(env[TORCHRUN_LOCAL_RANK])
    device = "cpu"
    if backend == "nccl":
        # Set here, not in torchrun's environment: the agent starts before the driver has chosen the backend.
        apply_defaults(nccl_watchdog_env(str(RunDir(run_dir).flight)))
        platform = Platform.detect()
        index = local_device_index(platform.vendor, env, local_rank, platform.device_count)
        torch.cuda.set_device(index)
        device = f"cuda:{index}"
    if not dist.is_initialized():
        # Key the rendezvous by torchrun's restart count: after a restart, gloo would otherwise read the
        # dead workers' addresses left in the agent's store and fail to connect.
        rank, world = int(env[TORCHRUN_RANK]), int(env[TORCHRUN_WORLD_SIZE])
        timeout = timedelta(seconds=timeout_s)
        agent_store = env.get(TORCHELASTIC_USE_AGENT_STORE, "").lower() == "true"
        store = dist.TCPStore(env[MASTER_ADDR], int(env[MASTER_PORT]), world, is_master=rank == 0 and not agent_store,
                              timeout=timeout)
        prefix = f"scaletrain/attempt-{env.get(TORCHELASTIC_RESTART_COUNT, '0')}"
        dist.init_process_group(backend, store=dist.PrefixStore(prefix, store), rank=rank, world_size=world,
                                timeout=timeout)
    return DistContext(
        world_rank=int(env[TORCHRUN_RANK]), local_rank=local_rank, world_size=int(env[TORCHRUN_WORLD_SIZE]),
        local_world_size=int(env[TORCHRUN_LOCAL_WORLD_SIZE]), node_rank=int(env.get(TORCHRUN_NODE_RANK, 0)),
        device=device, backend=backend, node_id=socket.gethostname(),
    )
