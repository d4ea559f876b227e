"""A simulated 2-node Ray cluster (1 CPU each) for the harness test_two_nodes.py runs in its own process
(two_node_drills.py: every 2-node drill on one cluster); and the fork server that starts the Ray workers of the suite's
clusters pre-imported (worker_forkserver: the shared Ray's too, tests/integration/conftest.py)."""

import atexit
import contextlib
import os
import signal
import tempfile
from pathlib import Path

_SERVER: dict = {}


def worker_forkserver(log: Path) -> tuple[dict | None, int]:
    """Start a fork server (launch/warm/forkserver.py, as `scaletrain up` starts one beside its head) for the Ray
    workers of a cluster of the suite: (the runtime_env that has every process of a job forked from it, its
    process group), or (None, 0) where it did not come up (workers then start plain). A plain Ray worker costs
    ~8-9 CPU-seconds of imports here.

    The server imports under glibc's allocator settings for CPU workers (envvars.CPU_WORKER_ENV_DEFAULTS), and the
    runtime_env gives them to every process of the job: scaletrain gives them to the Ray Train workers of a CPU
    run (launch/plan.py with_allocator), glibc reads them when a process starts, so a server without them forked
    none of those workers (measured: 67 of the shared Ray's processes, every training worker, started plain in a
    make test, ~540 CPU-seconds). A worker whose environment still differs (a test's own MALLOC_ variable) starts
    plain; the server's log says why."""
    from scaletrain import envvars
    from scaletrain.launch.warm import forkserver
    from scaletrain.launch.warm.cluster import start_forkserver
    from scaletrain.launch.warm.env import fork_server_env

    sock, pgid = start_forkserver(str(log.with_name("server.sock")), log,
                                  env={**fork_server_env(), **envvars.CPU_WORKER_ENV_DEFAULTS})
    if not sock:
        return None, 0
    return {"py_executable": forkserver.command(sock),
            "env_vars": {**envvars.WORKER_ENV_DEFAULTS, **envvars.CPU_WORKER_ENV_DEFAULTS}}, pgid


def worker_runtime_env() -> dict | None:
    """This script's fork server (worker_forkserver), started once, used by each cluster it starts and stopped at
    exit: its runtime_env, None where it did not come up."""
    if "env" not in _SERVER:
        d = Path(tempfile.mkdtemp(prefix="fs"))  # under the script's own short TMPDIR (run_own_group)
        _SERVER["log"] = d / "server.log"
        _SERVER["env"], pgid = worker_forkserver(_SERVER["log"])
        if pgid:
            atexit.register(os.killpg, pgid, signal.SIGKILL)
    return _SERVER["env"]


def plain_starts() -> list[str]:
    """Why each of this script's Ray workers that started plain did (its environment differed from the server's)."""
    log = _SERVER.get("log")
    return [ln for ln in log.read_text().splitlines() if ln.startswith("exec:")] if log and log.exists() else []


@contextlib.contextmanager
def two_node_cluster():
    import ray
    from ray.cluster_utils import Cluster

    # no dashboard: its port (8265) stays free for the warm cluster test_cluster.py may start meanwhile
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    cluster.add_node(num_cpus=1)
    runtime_env = worker_runtime_env()
    ray.init(address=cluster.address, log_to_driver=False, **({"runtime_env": runtime_env} if runtime_env else {}))
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()
