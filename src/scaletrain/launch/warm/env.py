"""The environment of the warm cluster's processes: its drivers authenticate with Ray's token, and every process
the fork server starts (drivers, workers, Ray Train's helpers) matches what the server imported under."""

from __future__ import annotations

from scaletrain import envvars


def prepare_warm_cluster_driver() -> bool:
    """Before ray is imported: a driver of the cluster `scaletrain up` started authenticates with Ray's token.
    False when ray was imported already (the setting would not take; the caller says so)."""
    import sys

    envvars.apply_defaults(envvars.WARM_CLUSTER_DRIVER_DEFAULTS)
    return "ray" not in sys.modules


def fork_server_env() -> dict[str, str]:
    """The warm cluster's fork server imports as a worker would: scaletrain's worker defaults < this shell, and
    Ray's token authentication (launch/warm/forkserver.py)."""
    env = {**envvars.WORKER_ENV_DEFAULTS, **envvars.snapshot()}
    for k, v in envvars.WARM_CLUSTER_DRIVER_DEFAULTS.items():
        env.setdefault(k, v)
    return env


def forked_driver_env() -> dict[str, str] | None:
    """The environment for this command's driver forked from the warm cluster's server: this one with what the
    server imported under (scaletrain's offline defaults, which a driver that never downloads does not notice,
    and Ray's token authentication). None in a driver that is such a fork already."""
    if envvars.read(envvars.SCALETRAIN_FORKED_DRIVER):
        return None
    return {**fork_server_env(), envvars.SCALETRAIN_FORKED_DRIVER: "1"}


def forked_note() -> str:
    """How this job's processes start on the warm cluster: what its driver says."""
    who = "driver and workers" if envvars.read(envvars.SCALETRAIN_FORKED_DRIVER) else "workers"
    return f"; {who} forked pre-imported"


def warm_job_env() -> dict[str, str]:
    """Every process of a job on the warm cluster (Ray Train's controller and helpers too, not only its workers)
    gets scaletrain's worker defaults, so that all of them match the fork server (fork_server_env)."""
    server = fork_server_env()
    return {k: server[k] for k in envvars.WORKER_ENV_DEFAULTS}
