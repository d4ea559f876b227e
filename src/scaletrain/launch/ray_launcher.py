"""Launch the worker loop on Ray Train V2 (TorchTrainer): embedded local Ray, or join a cluster."""

from __future__ import annotations

import logging
import os
import socket
import threading
from dataclasses import dataclass

from scaletrain.comm import env as envvars
from scaletrain.comm.device import Platform, reconcile_rocr, select_backend
from scaletrain.comm.profiles import effective_env
from scaletrain.config.schema import CommConfig, Config
from scaletrain.config.schema import ScalingConfig as ScalingSection
from scaletrain.errors import LaunchError
from scaletrain.worker.spec import JobSpec

# Train V2 is the default from Ray 2.51; set it so an older default can never pick V1.
os.environ.setdefault(envvars.RAY_TRAIN_V2_ENABLED, "1")


RAY_AUTH_NOTICE_LOGGER = "ray._private.authentication.authentication_token_setup"


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
        _probe_address(address)
        try:
            ray.init(address=address, **kwargs)
        except (ConnectionError, RuntimeError, ValueError) as e:
            raise LaunchError(f"scaling.address={address}: cannot connect to a Ray cluster ({str(e).splitlines()[0]}); "
                              f"start a head node with `ray start --head` or unset scaling.address/RAY_ADDRESS "
                              f"to train on this machine") from None
        return False
    envvars.apply_defaults(envvars.LOCAL_RAY_DEFAULTS)  # Ray Train reads them when the trainer starts
    # A new local Ray turns on token authentication and logs a notice about it on every start; here
    # scaletrain starts that Ray for the user, so the notice is noise in every run's output. Ray's default
    # (token authentication on) is kept: setting RAY_AUTH_MODE after ray is imported breaks the driver.
    logging.getLogger(RAY_AUTH_NOTICE_LOGGER).setLevel(logging.ERROR)
    ray.init(**kwargs)
    return True


def _probe_address(address: str, timeout_s: float = 5.0) -> None:
    """Fail in seconds, not minutes, when nothing listens at a cluster address."""
    if address == "auto":
        return
    hostport = address.split("://", 1)[-1].rstrip("/")
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise LaunchError(f"scaling.address={address}: write host:port (6379 for a head node, ray://host:10001 for "
                          f"Ray Client) or 'auto'")
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as e:
        raise LaunchError(f"scaling.address={address}: nothing answers at {host}:{port} ({e.strerror or e}); start a "
                          f"head node there with `ray start --head --port={port}` or fix the address") from None


def check_placement(strategy: str, n: int, per_worker: dict[str, float], nodes: list[dict[str, float]]) -> None:
    """Say which resource is short instead of letting Ray wait forever for an impossible placement."""
    def fits(node: dict[str, float], count: int) -> bool:
        return all(node.get(k, 0) >= v * count for k, v in per_worker.items())

    need = ", ".join(f"{v:g} {k}" for k, v in per_worker.items())
    if strategy == "STRICT_SPREAD":
        ok = sum(fits(node, 1) for node in nodes)
        if ok < n:
            raise LaunchError(f"scaling.placement_strategy=STRICT_SPREAD puts each of the {n} workers on its own node, "
                              f"but only {ok} of the cluster's {len(nodes)} node(s) have {need} free; use SPREAD or PACK, "
                              f"or add nodes")
    elif strategy == "STRICT_PACK" and not any(fits(node, n) for node in nodes):
        biggest = max(nodes, key=lambda nd: nd.get("CPU", 0), default={})
        raise LaunchError(f"scaling.placement_strategy=STRICT_PACK puts all {n} workers on one node, but no node has "
                          f"{', '.join(f'{v * n:g} {k}' for k, v in per_worker.items())} (the largest has "
                          f"{biggest.get('CPU', 0):g} CPU, {biggest.get('GPU', 0):g} GPU); use PACK or fewer workers")


def node_resources() -> list[dict[str, float]]:
    import ray

    return [dict(n["Resources"]) for n in ray.nodes() if n.get("Alive")]


def check_shared_storage(run_dir: str) -> None:
    """On a multi-node cluster every node must see the run directory (checkpoints, logs, data)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = [n for n in ray.nodes() if n.get("Alive")]
    if len(nodes) < 2 or "://" in run_dir:
        return
    marker = os.path.join(run_dir, ".shared-storage-check")
    with open(marker, "w") as f:
        f.write("scaletrain")

    @ray.remote(num_cpus=0)
    def sees(path: str) -> bool:
        return os.path.exists(path)

    refs = {n["NodeID"]: sees.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False))
            .remote(marker) for n in nodes}
    blind = [node for node, ref in refs.items() if not ray.get(ref, timeout=60)]
    os.remove(marker)
    if blind:
        raise LaunchError(f"output.output_dir: {run_dir} is node-local: node(s) {', '.join(b[:12] for b in blind)} cannot "
                          f"see it; on several nodes put output.output_dir on a shared filesystem (NFS) or a cloud URI")


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


def check_cluster(cfg: Config, plan: ClusterPlan, run_dir: str) -> None:
    """Placement and storage checks that need the live cluster (after the run directory exists)."""
    check_placement(cfg.scaling.placement_strategy, cfg.scaling.num_workers, plan.resources_per_worker,
                    node_resources())
    check_shared_storage(run_dir)


def cluster_resources() -> dict[str, float]:
    import ray

    return dict(ray.cluster_resources())


def run_workers(spec: JobSpec, cfg: Config, plan: ClusterPlan, worker_env: dict[str, str], redactor=None) -> None:
    """Run the train loop on ``num_workers`` Ray Train workers; Ray's errors propagate (see launch/failures.py)."""
    from scaletrain.launch.ray_callbacks import FailureEvents

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
