"""Launch the worker loop on Ray Train V2 (TorchTrainer): embedded local Ray, or join a cluster."""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass

from scaletrain.comm import env as envvars
from scaletrain.comm.device import Platform, reconcile_rocr, select_backend
from scaletrain.comm.profiles import effective_env
from scaletrain.config.schema import CommConfig, Config
from scaletrain.config.schema import ScalingConfig as ScalingSection
from scaletrain.errors import LaunchError
from scaletrain.launch.failures import FailureEvents
from scaletrain.worker.spec import JobSpec

# Train V2 is the default from Ray 2.51; set it so an older default can never pick V1.
os.environ.setdefault(envvars.RAY_TRAIN_V2_ENABLED, "1")


@dataclass(frozen=True)
class ClusterPlan:
    use_gpu: bool
    backend: str
    resources_per_worker: dict[str, float]
    note: str | None = None


def ensure_ray(address: str | None) -> bool:
    """Connect to ``address`` (or RAY_ADDRESS), else start an embedded local Ray. True if we started it."""
    import ray

    if ray.is_initialized():
        return False
    address = address or envvars.read(envvars.RAY_ADDRESS)
    kwargs = dict(log_to_driver=False, logging_level=logging.WARNING, include_dashboard=False,
                  configure_logging=True)
    if address:
        try:
            ray.init(address=address, **kwargs)
        except (ConnectionError, RuntimeError, ValueError) as e:
            raise LaunchError(f"scaling.address={address}: cannot connect to a Ray cluster ({str(e).splitlines()[0]}); "
                              f"start a head node with `ray start --head` or unset scaling.address/RAY_ADDRESS "
                              f"to train on this machine") from None
        return False
    ray.init(**kwargs)
    return True


def plan_cluster(cfg: Config, resources: dict[str, float], vendor: str) -> ClusterPlan:
    """Decide GPU use, backend and per-worker resources from the cluster's totals; check they fit."""
    return plan_scaling(cfg.scaling, cfg.comm, resources, vendor)


def plan_scaling(scaling: ScalingSection, comm: CommConfig, resources: dict[str, float], vendor: str) -> ClusterPlan:
    gpus = int(resources.get("GPU", 0))
    use_gpu = gpus > 0 if scaling.use_gpu == "auto" else bool(scaling.use_gpu)
    choice = select_backend(comm.backend, Platform(vendor if use_gpu else "cpu", gpus if use_gpu else 0))  # type: ignore[arg-type]
    per_worker = dict(scaling.resources_per_worker or {"CPU": 1})
    if use_gpu:
        per_worker.setdefault("GPU", 1)
    n = scaling.num_workers
    for name, amount in per_worker.items():
        have = resources.get(name, 0)
        if amount * n > have:
            what = "GPUs" if name == "GPU" else "CPUs" if name == "CPU" else f"'{name}' resources"
            raise LaunchError(
                f"scaling.num_workers={n} needs {amount * n:g} {what} ({amount:g} per worker) but the cluster "
                f"has {have:g}; lower scaling.num_workers to {int(have // amount) if amount else n} "
                f"or scaling.resources_per_worker"
            )
    return ClusterPlan(use_gpu, choice.backend, per_worker, choice.note)


def cluster_resources() -> dict[str, float]:
    import ray

    return dict(ray.cluster_resources())


def run_workers(spec: JobSpec, cfg: Config, plan: ClusterPlan, worker_env: dict[str, str], redactor=None) -> None:
    """Run the train loop on ``num_workers`` Ray Train workers; Ray's errors propagate (see launch/failures.py)."""
    run_on_workers(
        _ray_worker_entry, {"spec": spec}, cfg.scaling, plan, worker_env, spec.run_dir, cfg.comm.timeout_s,
        max_failures=cfg.fault_tolerance.max_failures, keep=cfg.checkpoint.save_total_limit,
        callbacks=[FailureEvents(spec.run_dir, cfg.scaling.num_workers, cfg.fault_tolerance.max_failures, redactor)],
    )


def run_on_workers(entry, entry_config: dict, scaling: ScalingSection, plan: ClusterPlan, worker_env: dict[str, str],
                   storage_dir: str, timeout_s: int, max_failures: int = 0, keep: int = 1, callbacks=()) -> None:
    """Run ``entry(entry_config)`` on every worker of a Ray Train TorchTrainer (process group set up by Ray)."""
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    trainer = TorchTrainer(
        train_loop_per_worker=entry,
        train_loop_config=entry_config,
        torch_config=TorchConfig(backend=plan.backend, timeout_s=timeout_s),
        scaling_config=ScalingConfig(num_workers=scaling.num_workers, use_gpu=plan.use_gpu,
                                     resources_per_worker=plan.resources_per_worker,
                                     placement_strategy=scaling.placement_strategy),
        run_config=RunConfig(
            # Ray's own bookkeeping goes to <storage_dir>/ray; our checkpoints live beside it.
            name="ray", storage_path=str(storage_dir),
            failure_config=FailureConfig(max_failures=max_failures),
            checkpoint_config=CheckpointConfig(num_to_keep=keep),
            worker_runtime_env={"env_vars": worker_env},
            callbacks=list(callbacks),
        ),
    )
    # fit() runs in a helper thread so the main thread stays in Python, where our SIGINT/SIGTERM handler can
    # ask the workers to checkpoint and stop; a signal inside Ray's blocking C++ call would kill the driver.
    outcome: dict = {}

    def target():
        try:
            trainer.fit()
        except BaseException as e:  # re-raised in the main thread
            outcome["error"] = e

    thread = threading.Thread(target=target, name="scaletrain-fit", daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(0.2)
    if "error" in outcome:
        raise outcome["error"]


def prepare_driver_env(vendor: str) -> list[str]:
    """Fix what would break Ray on AMD before ``ray.init``; returns the notes to log."""
    notes = []
    changes, note = reconcile_rocr(os.environ)
    if note:
        os.environ.update(changes)
        notes.append(note)
    return notes


def worker_env_for(cfg: Config, vendor: str, backend: str, run_dir: str) -> dict[str, str]:
    return comm_worker_env(cfg.comm, vendor, backend, run_dir)


def comm_worker_env(comm: CommConfig, vendor: str, backend: str, run_dir: str) -> dict[str, str]:
    out = envvars.worker_env(effective_env(comm.profile, comm.env))
    if backend == "nccl":
        # A stuck collective fails after comm.timeout_s and leaves a flight-recorder trace; a user's values win.
        for k, v in envvars.nccl_watchdog_env(f"{run_dir}/flight").items():
            out.setdefault(k, v)
    if vendor == "rocm":
        # Ray would give each ROCm worker HIP_VISIBLE_DEVICES=<its GPU> while Train V2 shares
        # CUDA_VISIBLE_DEVICES=<all GPUs of the node>; the two views disagree and device indices break
        # (ray-project/ray#49260). Keep HIP's view whole so both index the same list.
        out.setdefault("RAY_EXPERIMENTAL_NOSET_HIP_VISIBLE_DEVICES", "1")
    return out


def _ray_worker_entry(config: dict) -> None:
    from scaletrain.comm.context import context_from_ray
    from scaletrain.worker.loop import train

    spec: JobSpec = config["spec"]
    train(context_from_ray(spec.backend), spec)
