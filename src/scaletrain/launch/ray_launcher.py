"""Launch the worker loop on Ray Train V2 (TorchTrainer): embedded local Ray, or join a cluster."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
from dataclasses import replace
from typing import Iterator

from scaletrain import envvars
from scaletrain.comm.cores import usable_cores
from scaletrain.comm.device import Platform
from scaletrain.comm.launch_env import load_private_env, prepare_ray_driver, private_env, worker_env
from scaletrain.config.schema import Config
from scaletrain.config.schema import ScalingConfig as ScalingSection
from scaletrain.config.stages import RL_STAGES
from scaletrain.credentials import split_secrets
from scaletrain.errors import LaunchError
from scaletrain.launch.plan import ClusterPlan, check_placement, plan_scaling, with_allocator, with_binding
from scaletrain.redact import Redactor
from scaletrain.worker.spec import JobSpec

RAY_AUTH_NOTICE_LOGGER = "ray._private.authentication.authentication_token_setup"


class RayLauncher:
    """``plan`` starts (or joins) Ray and sizes the job against the cluster; ``run`` runs the workers on it;
    ``close`` stops a Ray that ``plan`` started."""

    name = "ray"

    def __init__(self, cfg: Config, redact: Redactor):
        self.cfg, self.redact = cfg, redact
        self._session: contextlib.ExitStack | None = None
        self._notes: list[str] = []

    def connect(self) -> list[str]:
        """Start or join Ray now (``plan`` does otherwise: data.tokenize_on=cluster tokenizes on it first); the
        driver's notes of the first call."""
        if self._session is None:
            self._notes = prepare_ray_driver()
            self._session = contextlib.ExitStack()
            self.resources = self._session.enter_context(ray_session(self.cfg.scaling.address))
        return self._notes

    def plan(self, platform: Platform) -> ClusterPlan:
        notes = self.connect()
        self.vendor = platform.vendor
        separate = self.cfg.train.stage in RL_STAGES and self.cfg.rollout.placement == "separate"
        plan = plan_scaling(self.cfg.scaling, self.cfg.comm, self.resources, platform.vendor, node_resources(),
                            rollout_actors=self.cfg.rollout.num_workers if separate else 0)
        if _EMBEDDED[0]:  # the local Ray this driver started: the node is this run's alone (comm/cores.py)
            plan = with_binding(plan, self.cfg.scaling, usable_cores(), self.cfg.scaling.num_workers)
        if not _FORKED[0]:  # workers forked from the warm cluster's server keep its allocator as it started
            plan = with_allocator(plan, self.cfg.comm)
        return replace(plan, notes=(*notes, *plan.notes))

    def run(self, spec: JobSpec, plan: ClusterPlan) -> None:
        """Run the train loop on ``num_workers`` Ray Train workers; Ray's errors propagate (see failures.py)."""
        from scaletrain.launch.ray_callbacks import FailureEvents, NodeExclusion

        cfg = self.cfg
        # Placement and storage checks need the live cluster (and, for storage, the run directory).
        check_placement(cfg.scaling.placement_strategy, cfg.scaling.min_workers or cfg.scaling.num_workers,
                        plan.resources_per_worker, node_resources())
        if spec.store is None:  # on object storage the workers need no shared disk (storage/relay.py)
            check_shared_storage(spec.run_dir)
        env = worker_env(cfg.comm, self.vendor, plan.backend, spec.run_dir, cpu=plan.allocator)
        # Ray keeps train_loop_config in its object store and may log it: comm.env's secrets travel in the
        # workers' private environment only (comm/launch_env.private_env), never in the config.
        mirror, spec = spec.run_dir, replace(spec, config=self.redact.mapping(spec.config))
        entry_config: dict = {"spec": spec}
        if spec.store is not None:  # the workers get the store, never the driver's mirror
            from scaletrain.storage.relay import start_relay

            entry_config = {"spec": replace(spec, run_dir=spec.store), "relay": start_relay(mirror)}
        try:
            run_on_workers(
                _ray_worker_entry, entry_config, cfg.scaling, plan, env, mirror, cfg.comm.timeout_s,
                max_failures=cfg.fault_tolerance.max_failures,
                callbacks=[FailureEvents(mirror, cfg.scaling.num_workers, cfg.fault_tolerance.max_failures,
                                         self.redact),
                           *([NodeExclusion(mirror, self.redact)] if cfg.fault_tolerance.exclude_faulty_nodes else [])],
                shared_storage=spec.store is None,
            )
        finally:
            if "relay" in entry_config:
                import ray

                ray.kill(entry_config["relay"])

    def close(self) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None

    def __enter__(self) -> RayLauncher:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@contextlib.contextmanager
def ray_session(address: str | None) -> Iterator[dict[str, float]]:
    """Join ``address`` (or RAY_ADDRESS, or a Ray this process already runs), else start an embedded local Ray,
    and stop it at the end only if it was started here. Yields the cluster's resource totals."""
    started = ensure_ray(address)
    try:
        yield cluster_resources()
    finally:
        if started:
            import ray

            ray.shutdown()
            _EMBEDDED[0] = False


def ensure_ray(address: str | None) -> bool:
    """Connect to ``address`` (or RAY_ADDRESS), else to the cluster `scaletrain up` started, else start an
    embedded local Ray. True if we started it."""
    import sys

    from scaletrain.launch.warm.cluster import current
    from scaletrain.launch.warm.env import prepare_warm_cluster_driver

    address = address or envvars.read(envvars.RAY_ADDRESS)
    joined = sys.modules.get("ray")
    if joined is not None and joined.is_initialized():
        return False
    if address:
        _join_address(address)
        return False
    warm = current()
    if warm is not None and prepare_warm_cluster_driver():  # else ray was imported before it could authenticate
        _join_warm(warm)
        return False
    _start_embedded()
    return True


def _init_kwargs() -> dict:
    prepare_ray_driver()
    return dict(log_to_driver=False, logging_level=logging.WARNING, configure_logging=True)


def _join_address(address: str) -> None:
    from scaletrain.console import console
    from scaletrain.launch.cluster_auth import ask_gcs, authenticate, gcs_address

    _probe_address(address)
    if (gcs := gcs_address(address)) is not None:  # before ray is imported: its token mode is read then
        note = authenticate(f"scaling.address={address}", lambda token: ask_gcs(gcs, token))
        if note:
            console.print(f"[yellow]note:[/] {note}", soft_wrap=True)
    import ray

    try:
        ray.init(address=address, include_dashboard=False, **_init_kwargs())
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise LaunchError(f"scaling.address={address}: cannot connect to a Ray cluster ({str(e).splitlines()[0]}); "
                          f"start a head node with `ray start --head` or unset scaling.address/RAY_ADDRESS "
                          f"to train on this machine") from None


def _join_warm(warm) -> None:
    """The cluster `scaletrain up` started; its workers forked pre-imported when its fork server answers."""
    import ray

    from scaletrain.console import console
    from scaletrain.launch.warm import forkserver
    from scaletrain.launch.warm.env import forked_note, warm_job_env

    kwargs = _init_kwargs()
    forked = bool(warm.forkserver) and forkserver.answers(warm.forkserver)
    console.print(f"[yellow]note:[/] using the local Ray cluster started by scaletrain up ({warm.address}, "
                  f"{warm.num_cpus} CPUs{forked_note() if forked else ''}); scaletrain down stops it", soft_wrap=True)
    _FORKED[0] = forked
    if forked:
        kwargs["runtime_env"] = {"py_executable": forkserver.command(warm.forkserver), "env_vars": warm_job_env()}
    envvars.apply_defaults(envvars.LOCAL_RAY_DEFAULTS)  # one machine, as an embedded Ray
    ray.init(address=warm.address, **kwargs)


_EMBEDDED = [False]  # this driver started the Ray it runs on (it stops with the driver)
_FORKED = [False]  # its workers are forked from the warm cluster's server (launch/warm/forkserver.py)


def _start_embedded() -> None:
    import ray

    from scaletrain.launch.orphans import mark_and_watch

    kwargs = _init_kwargs()
    envvars.apply_defaults(envvars.LOCAL_RAY_DEFAULTS)  # Ray Train reads them when the trainer starts
    # A new local Ray turns on token authentication and logs a notice about it on every start; here
    # scaletrain starts that Ray for the user, so the notice is noise in every run's output. Ray's default
    # (token authentication on) is kept: setting RAY_AUTH_MODE after ray is imported breaks the driver.
    logging.getLogger(RAY_AUTH_NOTICE_LOGGER).setLevel(logging.ERROR)
    mark_and_watch()  # every process this Ray starts ends with this driver, however it dies (launch/orphans.py)
    ray.init(include_dashboard=False, **kwargs)
    _EMBEDDED[0] = True


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
        raise LaunchError(f"output.output_dir: {run_dir} is node-local: node(s) {', '.join(b[:12] for b in blind)} "
                          f"cannot "
                          f"see it; on several nodes put output.output_dir on a shared filesystem (NFS) or a cloud URI")


def cluster_resources() -> dict[str, float]:
    import ray

    return dict(ray.cluster_resources())


def run_on_workers(entry, entry_config: dict, scaling: ScalingSection, plan: ClusterPlan, env: dict[str, str],
                   storage_dir: str, timeout_s: int, max_failures: int = 0, callbacks=(),
                   shared_storage: bool = True) -> None:
    """Run ``entry(entry_config)`` on every worker of a Ray Train TorchTrainer (process group set up by Ray).

    Checkpoints are scaletrain's own (checkpoint/; nothing is reported to Ray), so no CheckpointConfig.
    Secret variables of ``env`` reach the workers through a 0600 file, never Ray's runtime_env (which Ray logs);
    without a disk the workers share (``shared_storage`` False: a run on object storage), through Ray's object
    store instead (an ObjectRef is all the config holds)."""
    if not shared_storage:
        import ray

        public, secret = split_secrets(env)
        config = {**entry_config, "private": ray.put(secret)}
        return _fit(entry, config, scaling, plan, public, storage_dir, timeout_s, max_failures, callbacks)
    with private_env(env, storage_dir) as public:
        _fit(entry, entry_config, scaling, plan, public, storage_dir, timeout_s, max_failures, callbacks)


def _fit(entry, entry_config: dict, scaling: ScalingSection, plan: ClusterPlan, env: dict[str, str],
         storage_dir: str, timeout_s: int, max_failures: int, callbacks) -> None:
    prepare_ray_driver()  # before ray.train is imported: pins Train V2
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    group = scaling.context_parallel if scaling.elastic else 1
    trainer = _lean_trainer(TorchTrainer, embedded=_EMBEDDED[0], group=group, elastic=scaling.elastic)(
        train_loop_per_worker=_with_private_env,
        train_loop_config={"entry": entry, "config": entry_config, "private": entry_config.pop("private", None)},
        torch_config=TorchConfig(backend=plan.backend, timeout_s=timeout_s),
        scaling_config=ScalingConfig(
            num_workers=(scaling.min_workers, scaling.num_workers) if scaling.elastic else scaling.num_workers,
            use_gpu=plan.use_gpu, resources_per_worker=plan.resources_per_worker,
            placement_strategy=scaling.placement_strategy,
            **({"elastic_resize_monitor_interval_s": scaling.elastic_resize_interval_s} if scaling.elastic else {})),
        run_config=RunConfig(
            # Ray's own bookkeeping goes to <storage_dir>/ray; our checkpoints live beside it.
            name="ray", storage_path=str(storage_dir),
            failure_config=FailureConfig(max_failures=max_failures),
            worker_runtime_env={"env_vars": env},
            callbacks=list(callbacks),
        ),
    )
    # fit() runs in a helper thread so the main thread stays in Python, where our SIGINT/SIGTERM handler can
    # ask the workers to checkpoint and stop; a signal inside Ray's blocking C++ call would kill the driver.
    outcome: dict = {}

    def target():
        try:
            trainer.fit()
        except BaseException as e:  # noqa: BLE001 - re-raised in the main thread
            outcome["error"] = e

    thread = threading.Thread(target=target, name="scaletrain-fit", daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(0.2)
    if "error" in outcome:
        raise outcome["error"]


def _lean_trainer(trainer_cls, embedded: bool, group: int = 1, elastic: bool = False):
    """Ray Train V2 starts a helper actor (a Python process, ~0.2 GiB) for each of its default callbacks; two do
    nothing for scaletrain: the Ray Datasets manager (scaletrain passes no Ray Dataset: each worker reads its own
    shard) and, on the embedded Ray that dies with this driver, the detached placement-group cleaner (it frees the
    workers' reservation if the controller dies while the cluster lives on). Ray has no switch for them, so this
    subclass leaves them out of the default list (benchmarks/RESULTS.md "cold start"); on a Ray whose private
    classes moved it changes nothing. A fixed-size run on the embedded Ray leaves out the autoscaling
    coordinator too (``ray_policy.LocalFixedPolicy``). With ``group`` > 1 (an elastic run with context
    parallelism) its scaling policy resizes by whole groups (``ray_policy.py``); on a Ray without that private
    class it is refused."""
    if group > 1:
        try:
            from scaletrain.launch.ray_policy import WholeGroupsPolicy
        except ImportError as e:
            raise LaunchError(f"scaling.context_parallel={group} with an elastic scaling.num_workers needs Ray "
                              f"Train's ElasticScalingPolicy, which this Ray does not have ({e}); set a fixed "
                              f"scaling.num_workers") from None
    local_policy = None
    if embedded and not elastic:
        try:
            from scaletrain.launch.ray_policy import LocalFixedPolicy as local_policy
        except ImportError:
            pass
    try:
        from ray.train.v2._internal.callbacks import DatasetsCallback
        from ray.train.v2._internal.callbacks.placement_group_callback import PlacementGroupCleanerCallback
    except ImportError:
        DatasetsCallback = PlacementGroupCleanerCallback = None
    unused = tuple(c for c in ((DatasetsCallback, PlacementGroupCleanerCallback) if embedded else (DatasetsCallback,))
                   if c is not None)

    class LeanTrainer(trainer_cls):
        def _create_default_callbacks(self):
            callbacks = super()._create_default_callbacks()
            return [cb for cb in callbacks if not isinstance(cb, unused)] if not self.datasets else callbacks

        def _initialize_and_run_controller(self, **kwargs):
            if group > 1:  # Ray made its elastic policy from the ScalingConfig; the same, by whole groups
                kwargs["scaling_policy"] = WholeGroupsPolicy(self.scaling_config, group)
            elif local_policy is not None:  # a fixed size on the local Ray: no autoscaler to ask
                kwargs["scaling_policy"] = local_policy(self.scaling_config)
            return super()._initialize_and_run_controller(**kwargs)

    return LeanTrainer


def _with_private_env(config: dict) -> None:
    """Every Ray worker starts here: its secret variables first, then the entry it was given."""
    if config.get("private") is not None:
        import ray

        envvars.apply(ray.get(config["private"]))
    load_private_env()
    config["entry"](config["config"])


def _ray_worker_entry(config: dict) -> None:
    from scaletrain.comm.context import context_from_ray
    from scaletrain.worker.loop import train

    spec: JobSpec = config["spec"]
    ctx = context_from_ray(spec.backend)
    if config.get("relay") is None:
        train(ctx, spec)
        return
    from scaletrain.storage.relay import worker_view

    with worker_view(spec, config["relay"], ctx.world_rank) as local:
        train(ctx, local)
