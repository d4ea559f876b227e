"""Planning a launch, as pure functions of the config and the resources found: GPU use, backend, per-worker
resources, and whether the workers fit (before any worker or run directory exists)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from scaletrain import envvars
from scaletrain.comm.cores import binding_note
from scaletrain.comm.device import Platform, select_backend
from scaletrain.config.schema import CommConfig, Config
from scaletrain.config.schema import ScalingConfig as ScalingSection
from scaletrain.errors import LaunchError


@dataclass(frozen=True)
class ClusterPlan:
    use_gpu: bool
    backend: str
    resources_per_worker: dict[str, float]
    notes: tuple[str, ...] = ()  # what the user should know about the choice (backend fallback, device fixes)
    bind_cores: bool = False  # each CPU worker's threads on its own cores (comm/cores.py)
    allocator: bool = False  # CPU workers start with envvars.CPU_WORKER_ENV_DEFAULTS (comm/launch_env.py)


def cpus_per_worker(nodes: list[dict[str, float]], workers: int, use_gpu: bool) -> int:
    """Every core used, none oversubscribed: a CPU worker gets its node's cores / the workers placed on it, a GPU
    worker its node's cores / the node's GPUs (the host side of a GPU worker: collation, the optimizer step of
    offloaded states). Ray places PACK, so a node holds as many workers as fit; with nodes of different sizes
    the smallest decides (a worker may land on it)."""
    if not nodes:
        return 1
    if use_gpu:
        return max(1, min(int(n.get("CPU", 1) // max(1, n.get("GPU", 1))) for n in nodes if n.get("GPU", 0) > 0)
                   if any(n.get("GPU", 0) > 0 for n in nodes) else 1)
    per_node = -(-workers // len(nodes))  # ceil: PACK fills each node it uses
    return max(1, min(int(n.get("CPU", 1)) // min(per_node, workers) for n in nodes))


def plan_scaling(scaling: ScalingSection, comm: CommConfig, resources: dict[str, float], vendor: str,
                 nodes: list[dict[str, float]] | None = None, rollout_actors: int = 0) -> ClusterPlan:
    """Decide GPU use, backend and per-worker resources from a Ray cluster's totals (and its ``nodes``, for the
    CPUs a worker gets by default: ``cpus_per_worker``); check they fit. ``rollout_actors``: GRPO's separate rollout
    engine, a device each (a GPU, or a CPU core) beside the workers'."""
    gpus = int(resources.get("GPU", 0))
    use_gpu = gpus > 0 if scaling.use_gpu == "auto" else bool(scaling.use_gpu)
    # type: ignore[arg-type]
    choice = select_backend(comm.backend, Platform(vendor if use_gpu else "cpu", gpus if use_gpu else 0))
    per_worker = dict(scaling.resources_per_worker or {})
    notes = [choice.note] if choice.note else []
    if "CPU" not in per_worker:
        cpus = cpus_per_worker(nodes or [resources], scaling.max_workers + (0 if use_gpu else rollout_actors), use_gpu)
        per_worker["CPU"] = cpus
        notes.append(f"{cpus} CPU(s) per worker: the node's cores / its {'GPUs' if use_gpu else 'workers'}, none "
                     f"idle or oversubscribed (scaling.resources_per_worker: {{CPU: n}} overrides)")
    if use_gpu:
        per_worker.setdefault("GPU", 1)
    n = scaling.min_workers if scaling.elastic else scaling.num_workers  # elastic: it starts once min fit
    for name, amount in sorted(per_worker.items(), key=lambda kv: kv[0] != "GPU"):  # the devices first
        have = resources.get(name, 0)
        if amount * n > have:
            what = "GPUs" if name == "GPU" else "CPUs" if name == "CPU" else f"'{name}' resources"
            raise LaunchError(
                f"scaling.num_workers={n}{' (the elastic minimum)' if scaling.elastic else ''} needs "
                f"{amount * n:g} {what} ({amount:g} per worker) but the cluster "
                f"has {have:g}; lower scaling.num_workers to {int(have // amount) if amount else n} "
                f"or scaling.resources_per_worker"
            )
    if rollout_actors:
        device = "GPU" if use_gpu else "CPU"
        need = per_worker[device] * n + rollout_actors
        if need > resources.get(device, 0):
            raise LaunchError(
                f"rollout.num_workers={rollout_actors} rollout actors need a {device} each beside the "
                f"{per_worker[device] * n:g} of scaling.num_workers={n}, {need:g} in all, but the cluster has "
                f"{resources.get(device, 0):g}; lower rollout.num_workers or scaling.num_workers, or use "
                f"rollout.placement: colocated")
        notes.append(f"{rollout_actors} rollout actor(s), a {device} each, beside the workers")
    return ClusterPlan(use_gpu, choice.backend, per_worker, tuple(notes))


def with_allocator(plan: ClusterPlan, comm: CommConfig) -> ClusterPlan:
    """``plan`` with its CPU workers given glibc's allocator setting (envvars.CPU_WORKER_ENV_DEFAULTS) where the
    user set none of glibc's variables in the shell or ``comm.env``, and the line that says so. For workers that
    start a process of their own (the loader reads it then), not ones forked from a running server."""
    given = envvars.cpu_worker_env(envvars.snapshot(), comm.env) if not plan.use_gpu else {}
    if not given:
        return plan
    note = ("CPU workers keep the memory a step frees for the next one (" + ", ".join(
        f"{k}={v}" for k, v in given.items()) + "): no page faults to touch a step's tensors again, the step's peak "
        "held between steps; set a MALLOC_ variable or GLIBC_TUNABLES (comm.env) to use yours")
    return replace(plan, allocator=True, notes=(*plan.notes, note))


def with_binding(plan: ClusterPlan, scaling: ScalingSection, cores: list[int], workers: int) -> ClusterPlan:
    """``plan`` with its CPU workers bound to cores of a node the run has to itself (``workers`` of them there),
    said in its notes; unchanged for GPU workers, one worker, or ``scaling.bind_cores: false``."""
    if plan.use_gpu or not scaling.bind_cores:
        return plan
    note = binding_note(cores, workers, int(plan.resources_per_worker.get("CPU", 1)))
    return replace(plan, bind_cores=True, notes=(*plan.notes, note)) if note else plan


def plan_node(cfg: Config, platform: Platform, cpus: int) -> ClusterPlan:
    """One torchrun node: its processes' backend, and whether this node has a device (or CPU) for each."""
    s = cfg.scaling
    per_node = s.num_workers // s.nnodes
    use_gpu = platform.has_gpu if s.use_gpu == "auto" else bool(s.use_gpu)
    choice = select_backend(cfg.comm.backend, platform if use_gpu else Platform("cpu", 0, platform.torch_version))
    have, what = (platform.device_count, "GPUs") if use_gpu else (cpus, "CPUs")
    if per_node > have:
        raise LaunchError(f"scaling.num_workers={s.num_workers} over scaling.nnodes={s.nnodes} puts {per_node} "
                          f"processes "
                          f"on this node, which has {have} {what}; lower scaling.num_workers or add nodes")
    threads = (s.resources_per_worker or {}).get("CPU") or cpus_per_worker(
        [{"CPU": cpus, "GPU": platform.device_count}], per_node, use_gpu)
    notes = [choice.note] if choice.note else []
    if not (s.resources_per_worker or {}).get("CPU"):
        notes.append(f"{int(threads)} CPU thread(s) per process: this node's {cpus} cores / its "
                     f"{'GPUs' if use_gpu else f'{per_node} process(es)'} (scaling.resources_per_worker: {{CPU: n}} "
                     f"overrides)")
    plan = ClusterPlan(use_gpu, choice.backend, {"CPU": threads, **({"GPU": 1} if use_gpu else {})}, tuple(notes))
    return with_binding(with_allocator(plan, cfg.comm), s, list(range(cpus)), per_node)


def check_placement(strategy: str, n: int, per_worker: dict[str, float], nodes: list[dict[str, float]]) -> None:
    """Say which resource is short instead of letting Ray wait forever for an impossible placement."""
    def fits(node: dict[str, float], count: int) -> bool:
        return all(node.get(k, 0) >= v * count for k, v in per_worker.items())

    need = ", ".join(f"{v:g} {k}" for k, v in per_worker.items())
    if strategy == "STRICT_SPREAD":
        ok = sum(fits(node, 1) for node in nodes)
        if ok < n:
            raise LaunchError(f"scaling.placement_strategy=STRICT_SPREAD puts each of the {n} workers on its own node, "
                              f"but only {ok} of the cluster's {len(nodes)} node(s) have {need} free; use SPREAD or "
                              f"PACK, "
                              f"or add nodes")
    elif strategy == "STRICT_PACK" and not any(fits(node, n) for node in nodes):
        biggest = max(nodes, key=lambda nd: nd.get("CPU", 0), default={})
        raise LaunchError(f"scaling.placement_strategy=STRICT_PACK puts all {n} workers on one node, but no node has "
                          f"{', '.join(f'{v * n:g} {k}' for k, v in per_worker.items())} (the largest has "
                          f"{biggest.get('CPU', 0):g} CPU, {biggest.get('GPU', 0):g} GPU); use PACK or fewer workers")
