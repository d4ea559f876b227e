"""One launcher interface, chosen once from ``scaling.launcher``.

A launcher has two steps: ``plan(platform)`` sizes the job against what it can run on (Ray: the cluster it
starts or joins; torchrun: this node; local: this process, one worker) and fails before any run directory exists
if it does not fit; ``run(spec, plan)`` runs the worker loop on every worker and raises what they raised
(launch/failures.py words it). ``close()`` releases what the launcher started (a Ray it started, a torchrun
agent). The torchrun launcher starts its agent when it is made, so its start-up overlaps the driver's data
preparation.
"""

from __future__ import annotations

import os
from typing import Protocol

from scaletrain import envvars
from scaletrain.comm.device import Platform
from scaletrain.config.schema import Config
from scaletrain.config.stages import RL_STAGES
from scaletrain.errors import LaunchError
from scaletrain.launch.plan import ClusterPlan
from scaletrain.redact import Redactor
from scaletrain.worker.spec import JobSpec


class Launcher(Protocol):
    name: str

    def plan(self, platform: Platform) -> ClusterPlan: ...

    def run(self, spec: JobSpec, plan: ClusterPlan) -> None: ...

    def close(self) -> None: ...

    def __enter__(self) -> "Launcher": ...

    def __exit__(self, *exc) -> None: ...


def joins_torchrun(cfg: Config) -> bool:
    """Nodes > 0 of a torchrun job join node 0's job (its spec, in the shared run directory) instead of
    preparing one: they need no launcher of their own."""
    return cfg.scaling.launcher == "torchrun" and cfg.scaling.node_rank > 0


def require_ray(what: str) -> None:
    """Ray is imported only by what needs a Ray cluster; elsewhere (a GPU machine without it) this says so."""
    import importlib.util

    try:
        found = importlib.util.find_spec("ray") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise LaunchError(f"{what} needs Ray, which is not installed in this Python: pip install 'ray[train]>=2.51' "
                          f"(scaletrain[cluster] for up/submit); training runs without it with "
                          f"scaling.launcher=torchrun")


def auto_note(launcher: str, workers: int) -> str:
    """The line that says what ``scaling.launcher: auto`` chose when it is not Ray."""
    if launcher == "local":
        return ("1 worker on this machine and no restarts asked: it runs in this process (nothing to start: the "
                "quickest, lightest start); scaling.launcher=torchrun gives it a process of its own (a crash is then "
                "reported, not the command's end), =ray forces Ray")
    return (f"{workers} workers on this machine and no restarts asked: under torchrun (no Ray cluster to start: a "
            f"quicker, lighter start); scaling.launcher=ray forces Ray")


GPU_DEVICE_FILES = ("/dev/nvidiactl", "/dev/kfd")  # the NVIDIA and AMD (ROCm) drivers' control devices


def fits_this_machine(s) -> bool:
    """Whether ``s.num_workers`` processes fit on this machine under torchrun: a GPU each where it has GPUs, else
    a core each. Without a GPU driver's device file the machine is a CPU box: no torch import (~2 s here) before
    the torchrun agent can start; with one, torch counts the GPUs (the count the workers will see)."""
    if s.nnodes > 1:
        return False
    if s.use_gpu is not False and any(os.path.exists(f) for f in GPU_DEVICE_FILES):
        platform = Platform.detect()
        if platform.has_gpu or s.use_gpu is True:
            return s.num_workers <= platform.device_count
    return s.num_workers <= (os.cpu_count() or 1)


def ray_reasons(cfg: Config) -> list[str]:
    """What of Ray's a config asks for (an empty list: this process or torchrun runs it as well: a fixed number of
    workers that fit on this machine, no restarts, no cluster, no object storage)."""
    s, ft = cfg.scaling, cfg.fault_tolerance
    custom = set(s.resources_per_worker or {}) - {"CPU", "GPU"}
    reasons = [why for why, asked in (
        ("elastic workers", s.elastic), ("more workers than this machine has GPUs or cores", not fits_this_machine(s)),
        ("a placement strategy", s.placement_strategy != "PACK"), ("custom resources", bool(custom)),
        ("restarts", ft.max_failures != 0),
        ("chaos", ft.chaos is not None), ("a cluster address", bool(s.address or envvars.read(envvars.RAY_ADDRESS))),
        ("object storage", "://" in cfg.output.output_dir),
        ("rollout actors of their own (rollout.placement=separate)",
         cfg.train.stage in RL_STAGES and cfg.rollout.placement == "separate")) if asked]
    if not reasons:
        from scaletrain.launch.warm.cluster import current

        if ray_running():
            reasons.append("the Ray this process runs (scale, parity, a notebook)")
        elif current() is not None:
            reasons.append("the warm cluster of scaletrain up")
    return reasons


def ray_running() -> bool:
    """This process has joined or started a Ray (without importing ray when it has not)."""
    import sys

    joined = sys.modules.get("ray")
    return joined is not None and joined.is_initialized()


def choose_launcher(cfg: Config) -> tuple[Config, str | None]:
    """``scaling.launcher: auto`` made concrete (the config the run uses and keeps), with the line that says so
    when it is not Ray."""
    if cfg.scaling.launcher != "auto":
        return cfg, None
    # One worker runs in this process, except in a drill of injected faults (SCALETRAIN_FAULTS), whose kills are
    # a worker's, not the command's.
    drill = bool(envvars.read(envvars.SCALETRAIN_FAULTS))
    chosen = ("ray" if ray_reasons(cfg) else
              "local" if cfg.scaling.num_workers == 1 and not drill else "torchrun")
    cfg = cfg.model_copy(update={"scaling": cfg.scaling.model_copy(update={"launcher": chosen})})
    return cfg, auto_note(chosen, cfg.scaling.num_workers) if chosen != "ray" else None


def runs_on_ray(cfg: Config) -> bool:
    """Whether a run of ``cfg`` needs Ray (a command that runs several jobs, `parity`, starts it once for them only
    then: a Ray start costs ~20 CPU-seconds, and its runs would otherwise go to it)."""
    return cfg.scaling.launcher == "ray" or (cfg.scaling.launcher == "auto" and bool(ray_reasons(cfg)))


def launcher_for(cfg: Config, redact: Redactor | None = None) -> Launcher:
    redact = redact or Redactor.from_environment(cfg.comm.env)
    cfg, _ = choose_launcher(cfg)
    if cfg.scaling.launcher == "torchrun":
        from scaletrain.launch.torchrun_launcher import TorchrunLauncher

        return TorchrunLauncher(cfg, redact)
    if cfg.scaling.launcher == "local":
        from scaletrain.launch.local import LocalLauncher

        return LocalLauncher(cfg, redact)
    require_ray("scaling.launcher=ray")
    from scaletrain.launch.ray_launcher import RayLauncher

    return RayLauncher(cfg, redact)
