"""Preflight checks: each is a small function of gathered ``Facts`` returning (name, status, detail, fix).

Facts are collected once (``gather_facts``); checks never touch the machine themselves, so each is
unit-tested with fakes. The two checks that need workers (cluster size, smoke all-reduce) take their
facts from a local or joined Ray cluster.
"""

from __future__ import annotations

import enum
import sys
from dataclasses import dataclass, field
from typing import Callable, Mapping, NamedTuple

from scaletrain.config.schema import Config
from scaletrain.envvars import (
    CUDA_VISIBLE_DEVICES,
    HIP_VISIBLE_DEVICES,
    HSA_FORCE_FINE_GRAIN_PCIE,
    MASTER_PORT,
    ROCR_VISIBLE_DEVICES,
)

GIB = 1024**3


class Status(enum.Enum):
    OK = "ok"
    WARN = "warn"
    FAIL = "fail"


@dataclass(frozen=True)
class CheckResult:
    name: str
    status: Status
    detail: str
    fix: str = ""


@dataclass
class Facts:
    environ: Mapping[str, str]
    vendor: str  # "rocm", "cuda" or "cpu" (the torch build)
    gpu_count: int
    shm_bytes: int | None
    nofile_soft: int | None
    disk_free_bytes: int | None
    port_free: bool
    kernel_cmdline: str = ""
    topology_warnings: list[str] = field(default_factory=list)
    cluster: dict[str, float] | None = None  # Ray cluster resources, when a cluster was reached
    smoke: tuple[bool, str] | None = None  # (passed, detail) of the all-reduce smoke test
    config: Config | None = None
    path_errors: list[str] = field(default_factory=list)
    data: tuple[bool, str, list[str]] | None = None  # (readable, what train would train on or why not, warnings)
    literal_secrets: list[str] = field(default_factory=list)  # config keys holding a credential in clear
    gpu_health: list[dict] = field(default_factory=list)  # each local GPU's health() (metrics/gpu.py)
    store: tuple[bool, str] | None = None  # output.output_dir on object storage: (the write probe passed, detail)
    leftovers: str | None = None  # processes of an earlier run whose driver is gone (launch/orphans.py describe)
    experts: str | None = None  # an MoE model: its experts and the grouped GEMM kernel here (model.grouped_gemm_kernel)


Check = Callable[[Facts], "CheckResult | None"]


class WorkerFit(NamedTuple):
    """How a config's workers fit a Ray cluster's resources (shared by doctor and `scale`)."""

    use_gpu: bool
    per_worker: float  # GPUs (or CPUs, for CPU workers) one worker takes
    have: int  # GPUs (or CPUs) in the cluster
    cpus: int
    gpus: int

    @property
    def capacity(self) -> int:
        """How many workers fit (any number when a worker asks for none of the resource)."""
        return int(self.have // self.per_worker) if self.per_worker > 0 else sys.maxsize

    def fills_cpus(self, workers: int, launcher: str) -> bool:
        """CPU workers under Ray that take every CPU, so Ray's own processes run on the workers' cores."""
        return launcher == "ray" and not self.use_gpu and workers * self.per_worker == self.cpus


def worker_fit(config: Config, cluster: Mapping[str, float]) -> WorkerFit:
    gpus, cpus = int(cluster.get("GPU", 0)), int(cluster.get("CPU", 0))
    use_gpu = gpus > 0 if config.scaling.use_gpu == "auto" else bool(config.scaling.use_gpu)
    per = (config.scaling.resources_per_worker or {}).get("GPU" if use_gpu else "CPU", 1)
    return WorkerFit(use_gpu, per, gpus if use_gpu else cpus, cpus, gpus)


# Measured: benchmarks/RESULTS.md, Ray launcher 0.952 of a hand-written loop on 2 cores (28 rounds).
CPU_HEADROOM_COST = "~5% lower throughput on 2 cores"
CPU_HEADROOM_NOTE = f"Ray's processes share the workers' CPUs ({CPU_HEADROOM_COST})"


def check_workers(f: Facts) -> CheckResult | None:
    if f.config is None or f.cluster is None:
        return None
    fit, n = worker_fit(f.config, f.cluster), f.config.scaling.num_workers
    what = "GPUs" if fit.use_gpu else "CPUs"
    if n * fit.per_worker > fit.have:
        return CheckResult("workers", Status.FAIL,
                           f"scaling.num_workers={n} needs {n * fit.per_worker:g} {what}; the cluster has {fit.have}",
                           f"lower scaling.num_workers to {fit.capacity} or add nodes")
    return CheckResult("workers", Status.OK,
                       f"{n} worker(s) on {fit.have} {what} ({fit.cpus} CPUs, {fit.gpus} GPUs in the cluster)")


def check_cpu_headroom(f: Facts) -> CheckResult | None:
    if f.config is None or f.cluster is None:
        return None
    from scaletrain.launch.launcher import choose_launcher

    fit, n = worker_fit(f.config, f.cluster), f.config.scaling.num_workers
    if not fit.fills_cpus(n, choose_launcher(f.config)[0].scaling.launcher):  # auto: the one a run would use
        return None
    return CheckResult("CPU headroom", Status.WARN,
                       f"{n} CPU worker(s) x {fit.per_worker:g} CPU take all {fit.cpus} CPUs, so Ray's controller, "
                       f"helper actors, raylet and GCS run on the workers' cores ({CPU_HEADROOM_COST}; "
                       f"benchmarks/RESULTS.md)",
                       "leave a CPU free, or measure scaling on this machine with scaling.launcher=torchrun")


def check_visible_devices(f: Facts) -> CheckResult:
    env = f.environ
    rocr, hip, cuda = env.get(ROCR_VISIBLE_DEVICES), env.get(HIP_VISIBLE_DEVICES), env.get(CUDA_VISIBLE_DEVICES)
    shown = ", ".join(f"{k}={v}" for k, v in ((ROCR_VISIBLE_DEVICES, rocr), (HIP_VISIBLE_DEVICES, hip),
                                              (CUDA_VISIBLE_DEVICES, cuda)) if v is not None) or "none set"
    name = "visible devices"
    if f.vendor == "rocm":
        if rocr is not None and hip is None:
            return CheckResult(name, Status.WARN, f"{shown}: Ray reads only HIP_VISIBLE_DEVICES and refuses ROCR alone",
                               "scaletrain sets the equivalent HIP_VISIBLE_DEVICES for you; or export it yourself")
        if hip is not None and cuda is not None and hip != cuda:
            return CheckResult(name, Status.FAIL, f"{shown}: HIP and CUDA lists disagree; on ROCm both filter devices "
                                                  f"and ranks map to the wrong GPU", "unset CUDA_VISIBLE_DEVICES and "
                                                                                     "keep HIP_VISIBLE_DEVICES")
    elif f.vendor == "cuda" and (hip is not None or rocr is not None):
        return CheckResult(name, Status.WARN, f"{shown}: HIP/ROCR variables do nothing on a CUDA build",
                           "use CUDA_VISIBLE_DEVICES")
    return CheckResult(name, Status.OK, shown)


def check_shm(f: Facts) -> CheckResult | None:
    if f.shm_bytes is None:
        return None
    gib = f.shm_bytes / GIB
    fix = "run the container with --ipc=host or --shm-size=16g"
    if f.shm_bytes < 256 * 1024**2:
        return CheckResult("/dev/shm", Status.FAIL, f"{gib:.2f} GiB: NCCL/RCCL and data loaders hang or crash with "
                                                    f"this little", fix)
    if f.shm_bytes < 2 * GIB:
        return CheckResult("/dev/shm", Status.WARN, f"{gib:.2f} GiB: small for multi-GPU jobs (Docker's default is 64 "
                                                    f"MiB)", fix)
    return CheckResult("/dev/shm", Status.OK, f"{gib:.1f} GiB")


def check_port(f: Facts) -> CheckResult:
    if f.port_free:
        return CheckResult("rendezvous port", Status.OK, "a free TCP port can be bound on this node")
    return CheckResult("rendezvous port", Status.FAIL, f"{MASTER_PORT} is taken (or no port can be bound)",
                       f"unset {MASTER_PORT} so one is chosen, or pick a free one")


def check_nofile(f: Facts) -> CheckResult | None:
    if f.nofile_soft is None:
        return None
    if f.nofile_soft < 4096:
        return CheckResult("open files", Status.WARN, f"ulimit -n is {f.nofile_soft}: Ray and NCCL open many "
                                                      f"sockets/files",
                           "ulimit -n 65536 (or raise nofile in /etc/security/limits.conf)")
    return CheckResult("open files", Status.OK, f"ulimit -n {f.nofile_soft}")


def check_disk(f: Facts) -> CheckResult | None:
    if f.disk_free_bytes is None:
        return None
    gib = f.disk_free_bytes / GIB
    where = f.config.output.output_dir if f.config else "the output directory"
    if gib < 1:
        return CheckResult("disk", Status.FAIL, f"{gib:.2f} GiB free under {where}", "free space or set "
                                                                                     "output.output_dir")
    if gib < 10:
        return CheckResult("disk", Status.WARN, f"{gib:.1f} GiB free under {where}: checkpoints may not fit",
                           "free space or lower checkpoint.save_total_limit")
    return CheckResult("disk", Status.OK, f"{gib:.0f} GiB free under {where}")


def check_store(f: Facts) -> CheckResult | None:
    if f.store is None:
        return None
    ok, detail = f.store
    if not ok:
        return CheckResult("object storage", Status.FAIL, detail, "the fix the line names (storage.endpoint_url, the "
                                                                  "bucket, AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY)")
    return CheckResult("object storage", Status.OK, detail)


def check_paths(f: Facts) -> CheckResult | None:
    if f.config is None:
        return None
    if f.path_errors:
        return CheckResult("data and model", Status.FAIL, f.path_errors[0], "fix the path in the config")
    return CheckResult("data and model", Status.OK, f"{f.config.data.train_file} and {f.config.model.name_or_path} "
                                                    f"readable")


def check_data(f: Facts) -> CheckResult | None:
    """The data as train reads it: formats, columns, labels, records skipped and why, placeholder text."""
    if f.data is None:
        return None
    ok, detail, warnings = f.data
    if not ok:
        return CheckResult("data content", Status.FAIL, detail, "fix the data or the data keys, as the message says")
    if warnings:
        return CheckResult("data content", Status.WARN, f"{detail}; {'; '.join(warnings)}",
                           "fix the records named, or accept the skips")
    return CheckResult("data content", Status.OK, detail)


def check_batch_lr(f: Facts) -> CheckResult | None:
    if f.config is None:
        return None
    from scaletrain.config.batch import global_batch, scaled_learning_rate

    t, n = f.config.train, f.config.scaling.data_parallel
    gb1, gbn = global_batch(t, 1), global_batch(t, n)
    lr = scaled_learning_rate(t, n)
    detail = f"global batch {gbn} ({gb1} on 1 worker), lr {lr:g} ({t.lr_scaling} scaling)"
    if n > 1 and t.lr_scaling == "none":
        return CheckResult("batch and LR", Status.WARN, detail + f": the global batch is {n}x the 1-worker baseline "
                           f"with the same LR, so fewer, larger steps; results will differ from 1 worker",
                           "set train.lr_scaling=linear (or sqrt), or divide per_device_train_batch_size by the "
                           "workers")
    return CheckResult("batch and LR", Status.OK, detail)


def check_rocm_hints(f: Facts) -> CheckResult | None:
    if f.vendor != "rocm":
        return None
    hints = []
    if "iommu=pt" not in f.kernel_cmdline:
        hints.append("the kernel command line lacks iommu=pt (AMD recommends it for multi-GPU peer-to-peer)")
    if f.environ.get(HSA_FORCE_FINE_GRAIN_PCIE) != "1" and any("PCIE" in w for w in f.topology_warnings):
        hints.append(f"GPUs talk over PCIe and {HSA_FORCE_FINE_GRAIN_PCIE} is not 1 (RCCL needs it for PCIe peer "
                     f"access)")
    if hints:
        return CheckResult("ROCm hints", Status.WARN, "; ".join(hints),
                           f"add iommu=pt to the kernel command line; export {HSA_FORCE_FINE_GRAIN_PCIE}=1 on PCIe "
                           f"boxes")
    return CheckResult("ROCm hints", Status.OK, "iommu=pt set")


def check_topology(f: Facts) -> CheckResult | None:
    if f.gpu_count == 0:
        return CheckResult("topology", Status.OK, "no GPU on this node (CPU workers, gloo)")
    if f.topology_warnings:
        return CheckResult("topology", Status.WARN, f.topology_warnings[0], "see `scaletrain topo`")
    return CheckResult("topology", Status.OK, "no slow GPU pairs")


def check_gpu_health(f: Facts) -> CheckResult | None:
    """GPUs with uncorrectable ECC errors or a memory page retirement pending: a job on them is likely to fail."""
    if not f.gpu_health:
        return None
    bad = [h for h in f.gpu_health if (h.get("ecc_uncorrected") or 0) > 0 or h.get("retirement_pending")]
    if not bad:
        return CheckResult("GPU health", Status.OK, f"{len(f.gpu_health)} GPU(s): no uncorrectable ECC errors, no "
                                                    f"page retirement pending")
    what = "; ".join(f"GPU {h.get('bus_id')}: " + ", ".join(
        ([f"{h['ecc_uncorrected']} uncorrectable ECC error(s)"] if h.get("ecc_uncorrected") else [])
        + (["a page retirement pending"] if h.get("retirement_pending") else [])) for h in bad)
    return CheckResult("GPU health", Status.WARN, what,
                       "reset the GPU (a pending retirement completes at reset) or keep the node out of the job; "
                       "if uncorrectable errors keep rising, report the GPU to its vendor")


def check_experts(f: Facts) -> CheckResult | None:
    """An MoE model's routed experts compute as one grouped GEMM per projection where torch has the kernel for this
    device; elsewhere transformers loops over the active experts (correct, slower): said, not failed."""
    if f.experts is None:
        return None
    fallback = "fallback" in f.experts
    return CheckResult("moe experts", Status.WARN if fallback else Status.OK, f.experts,
                       "a torch build with grouped GEMM for this device (CUDA sm80+, or torch >= 2.9 on CPU) runs the "
                       "experts in one kernel per projection" if fallback else "")


def check_literal_secrets(f: Facts) -> CheckResult | None:
    if f.config is None:
        return None
    if f.literal_secrets:
        keys = ", ".join(f.literal_secrets)
        var = f.literal_secrets[0].rsplit(".", 1)[-1].upper()
        return CheckResult("secrets in the config", Status.WARN,
                           f"{keys}: a credential written in the config file (anyone who can read the file, or "
                           f"a copy of it, has it)", f"export it in the environment and write ${{{var}}} instead")
    return CheckResult("secrets in the config", Status.OK, "none written in clear")


def check_leftovers(f: Facts) -> CheckResult:
    if f.leftovers:
        detail, _, fix = f.leftovers.rpartition(": stop them with ")
        return CheckResult("leftover processes", Status.WARN, detail, f"stop them: {fix}")
    return CheckResult("leftover processes", Status.OK, "none of an earlier run")


def check_smoke(f: Facts) -> CheckResult | None:
    if f.smoke is None:
        return None
    ok, detail = f.smoke
    return CheckResult("all-reduce smoke test", Status.OK if ok else Status.FAIL, detail,
                       "" if ok else "run with the debug comm profile (comm.profile=debug) and read the worker logs")


CHECKS: tuple[Check, ...] = (check_workers, check_cpu_headroom, check_visible_devices, check_shm, check_port,
                             check_nofile, check_disk, check_store, check_paths, check_data, check_batch_lr,
                             check_rocm_hints, check_topology, check_gpu_health, check_experts,
                             check_literal_secrets, check_leftovers, check_smoke)


def run_checks(facts: Facts, checks: tuple[Check, ...] = CHECKS) -> list[CheckResult]:
    return [r for r in (c(facts) for c in checks) if r is not None]
