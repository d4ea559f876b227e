"""One launcher interface, chosen once from ``scaling.launcher``.

A launcher has two steps: ``plan(platform)`` sizes the job against what it can run on (Ray: the cluster it
starts or joins; torchrun: this node) and fails before any run directory exists if it does not fit;
``run(spec, plan)`` runs the worker loop on every worker and raises what they raised (launch/failures.py
words it). ``close()`` releases what the launcher started (a Ray it started, a torchrun agent). The torchrun
launcher starts its agent when it is made, so its start-up overlaps the driver's data preparation.
"""

from __future__ import annotations

from typing import Protocol

from scaletrain.comm.device import Platform
from scaletrain.config.schema import Config
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


def launcher_for(cfg: Config, redact: Redactor | None = None) -> Launcher:
    redact = redact or Redactor.from_environment(cfg.comm.env)
    if cfg.scaling.launcher == "torchrun":
        from scaletrain.launch.torchrun_launcher import TorchrunLauncher

        return TorchrunLauncher(cfg, redact)
    require_ray("scaling.launcher=ray")
    from scaletrain.launch.ray_launcher import RayLauncher

    return RayLauncher(cfg, redact)
