"""One worker in the command's own process: ``scaling.launcher: local`` (auto's choice for a single local worker
with nothing of Ray's asked), and ``run_in_process`` for tests.

Nothing is started: torch, transformers and the model code are imported once (by the driver's checks), and one
process holds them (benchmarks/RESULTS.md "vs LLaMA-Factory": a torchrun agent and a worker process of their own
cost a second torch image and ~1.5 s of start-up on a 2-core machine). The loop is the other launchers': the same
run directory, metrics, checkpoints, resume, Ctrl-C (the driver's STOP file, read at the next step) and failure
messages (the rank's failure record in its log, worded by launch/failures.py). What a process of its own adds, and
this does not: a crash of the loop (a segfault, the OOM killer) ends the command instead of being reported, so
restarts are never run here (``fault_tolerance.max_failures`` makes auto choose Ray).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from datetime import timedelta
from pathlib import Path

from scaletrain import envvars
from scaletrain.comm.context import DistContext
from scaletrain.comm.device import Platform
from scaletrain.comm.profiles import effective_env
from scaletrain.config.schema import Config
from scaletrain.errors import ScaletrainError
from scaletrain.launch.failures import RankFailures, describe
from scaletrain.launch.plan import ClusterPlan, plan_node
from scaletrain.redact import Redactor
from scaletrain.rundir import RunDir
from scaletrain.worker.spec import JobSpec


class LocalLauncher:
    """``plan`` checks this machine (as torchrun's does, for one process); ``run`` runs the loop here."""

    name = "local"

    def __init__(self, cfg: Config, redact: Redactor):
        self.cfg, self.redact = cfg, redact
        self._plan = plan_node(cfg, Platform.detect(), os.cpu_count() or 1)

    def plan(self, platform: Platform) -> ClusterPlan:
        return self._plan

    def run(self, spec: JobSpec, plan: ClusterPlan) -> None:
        from scaletrain.launch.torchrun_launcher import last_failures

        # The spec as the other launchers hand it over: secrets masked (this process's environment has them).
        spec = dataclasses.replace(spec, config=self.redact.mapping(spec.config))
        env = envvars.worker_env(effective_env(self.cfg.comm.profile, self.cfg.comm.env), envvars.snapshot())
        with envvars.applied(env), _threads(_thread_count(env, plan)), _worker_logging(), \
                _process_group(spec, self.cfg.comm.timeout_s, plan.use_gpu) as ctx:
            try:
                run_loop(ctx, spec)
            except ScaletrainError:
                raise
            except Exception as e:  # the loop wrote rank 0's failure record first: worded as torchrun's are
                raise RankFailures(last_failures(Path(spec.run_dir)), f"the worker loop failed: {describe(e)}") from e

    def close(self) -> None:
        pass

    def __enter__(self) -> LocalLauncher:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def run_loop(ctx: DistContext, spec: JobSpec) -> dict:
    from scaletrain.worker.loop import train

    return train(ctx, spec)


def _thread_count(env: dict[str, str], plan: ClusterPlan) -> int:
    """The loop's intra-op threads: the user's OMP_NUM_THREADS (the shell's or comm.env's) where set, as a torchrun
    worker's (comm/launch_env.py torchrun_agent_env: a user's value wins), else the worker's CPUs; one launcher or
    the other then trains with the same threads, and the same float sums."""
    value = envvars.read(envvars.OMP_NUM_THREADS, {**envvars.snapshot(), **env})
    return int(value) if value and value.isdigit() and int(value) > 0 else int(plan.resources_per_worker["CPU"])


@contextlib.contextmanager
def _threads(n: int):
    """torch's intra-op threads for the loop (a worker process gets them from OMP_NUM_THREADS), then as before."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(max(1, n))
    try:
        yield
    finally:
        torch.set_num_threads(before)


@contextlib.contextmanager
def _worker_logging():
    """The loop sends this process's logging to the rank's file (metrics/logs.py, which drops the scaletrain
    handlers it finds); afterwards the driver's records are not the worker's: that handler goes (closed), and the
    root logger's handlers and level are put back as they were."""
    import logging

    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    try:
        yield
    finally:
        added = [h for h in root.handlers if h not in handlers]
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in added:
            handler.close()
        for handler in handlers:  # in their order
            root.addHandler(handler)
        root.setLevel(level)


@contextlib.contextmanager
def _process_group(spec: JobSpec, timeout_s: int, use_gpu: bool):
    """A process group of one rank (an in-memory store: nothing listens), so FSDP, DCP and the collectives run as
    they do under the other launchers; destroyed at the end."""
    import torch
    import torch.distributed as dist

    device = "cpu"
    if use_gpu:
        if spec.backend == "nccl":
            envvars.apply_defaults(envvars.nccl_watchdog_env(str(RunDir(spec.run_dir).flight)))
        torch.cuda.set_device(0)
        device = "cuda:0"
    dist.init_process_group(spec.backend, store=dist.HashStore(), rank=0, world_size=1,
                            timeout=timedelta(seconds=timeout_s))
    try:
        yield DistContext(world_rank=0, local_rank=0, world_size=1, local_world_size=1, node_rank=0, device=device,
                          backend=spec.backend)
    finally:
        dist.destroy_process_group()


def run_in_process(spec: JobSpec) -> dict:
    """The loop in this process without a process group (tests)."""
    ctx = DistContext(world_rank=0, local_rank=0, world_size=1, local_world_size=1, node_rank=0,
                      device="cpu", backend=spec.backend)
    return run_loop(ctx, spec)
