"""The environment a launch needs: the driver's, before Ray starts, and every worker's.

Here (and in ``envvars.py``, which names every variable) is the only place scaletrain changes its own
process environment or composes a worker's.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Mapping

from scaletrain import envvars
from scaletrain.comm.device import reconcile_rocr
from scaletrain.comm.profiles import effective_env
from scaletrain.credentials import split_secrets
from scaletrain.rundir import RunDir

if TYPE_CHECKING:
    from scaletrain.config.schema import CommConfig


def prepare_ray_driver() -> list[str]:
    """Before Ray starts or ray.train is imported: pin Train V2 and fix what would break Ray on AMD (a user's
    values win). A Ray instance the driver starts inherits them. Returns the notes to log (once)."""
    envvars.apply_defaults(envvars.RAY_DRIVER_DEFAULTS)
    changes, note = reconcile_rocr(envvars.snapshot())
    envvars.apply(changes)
    return [note] if note else []


def worker_env(comm: CommConfig, vendor: str, backend: str, run_dir: str, cpu: bool = False) -> dict[str, str]:
    """Every worker's variables: scaletrain's defaults < the driver's shell < the comm profile < comm.env, plus
    the collective watchdog (nccl), the ROCm device-view fix and, for ``cpu`` workers, the allocator's setting
    (envvars.CPU_WORKER_ENV_DEFAULTS); a user's value wins over the last three."""
    out = envvars.worker_env(effective_env(comm.profile, comm.env))
    if cpu:
        out = {**envvars.cpu_worker_env(envvars.snapshot(), out), **out}
    if backend == "nccl":
        # A stuck collective fails after comm.timeout_s and leaves a flight-recorder trace.
        for k, v in envvars.nccl_watchdog_env(str(RunDir(run_dir).flight)).items():
            out.setdefault(k, v)
    if vendor == "rocm":
        out.setdefault(envvars.RAY_EXPERIMENTAL_NOSET_HIP_VISIBLE_DEVICES, "1")
    return out


def torchrun_agent_env(comm: CommConfig, cpus_per_worker: float, environ: Mapping[str, str] | None = None,
                       cpu: bool = False) -> dict[str, str]:
    """The torchrun agent's environment: the driver's, comm variables, the workers' thread count and, for ``cpu``
    workers, the allocator's setting (a user's value wins)."""
    # The same thread count under both launchers keeps their numbers (and results) comparable: Ray gives
    # each worker OMP_NUM_THREADS = its CPUs, torchrun sets 1 only with several processes per node.
    environ = envvars.snapshot() if environ is None else dict(environ)
    comm_vars = envvars.worker_env(effective_env(comm.profile, comm.env), environ)
    allocator = envvars.cpu_worker_env(environ, comm_vars) if cpu else {}
    return {envvars.OMP_NUM_THREADS: str(max(1, int(cpus_per_worker))), **allocator, **environ, **comm_vars}


@contextlib.contextmanager
def private_env(env: dict[str, str], storage_dir: str) -> Iterator[dict[str, str]]:
    """The variables that may travel in Ray's ``runtime_env``, while the secret ones wait in a 0600 file.

    Ray writes a runtime_env's variables to its logs on every node (runtime_env_agent.log, the worker logs)
    and shows them in its dashboard, so secret values (by name or shape: credentials.py) go to
    ``<storage_dir>/.private-env.json`` instead (a shared filesystem on several nodes, as the run directory
    is), which each worker reads into its own environment at start (``load_private_env``). The file is
    removed when the block ends, however it ends."""
    public, secret = split_secrets(env)
    path = RunDir(storage_dir).private_env
    if secret:
        path.unlink(missing_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(secret, f)
        public[envvars.SCALETRAIN_PRIVATE_ENV_FILE] = str(path)
    try:
        yield public
    finally:
        path.unlink(missing_ok=True)


def load_private_env() -> None:
    """In a Ray worker, first thing: add the secret variables the driver left for it (``private_env``), and take
    the CPU threads Ray gave it (a worker forked from the warm cluster's server loaded torch before)."""
    path = envvars.read(envvars.SCALETRAIN_PRIVATE_ENV_FILE)
    if path:
        envvars.apply(json.loads(Path(path).read_text()))
    envvars.apply_threads()
