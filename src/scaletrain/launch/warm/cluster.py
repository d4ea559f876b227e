"""A warm local cluster: `scaletrain up` starts a persistent Ray head on this machine (`ray start --head`), `down`
stops it. While it is up, `train`, `scale`, `commbench` and `doctor` join it instead of starting an embedded Ray
(and say so), so a run skips Ray's start-up. Beside the head, `up` starts a fork server (forkserver.py) that has
imported torch, transformers and scaletrain's worker loop once: the driver of `train`/`scale`/`commbench` and
every worker process of their jobs are forked from it instead of importing all of that again. Workers are still
fresh processes per run: Ray Train starts new worker actors for every run, each forked child serves one of
them, and the server itself never runs job code, so nothing of one run's process state reaches the next.

What scaletrain started is recorded in a state file; `down` stops only that, and `up` refuses to start a second
Ray beside one it did not start.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from scaletrain.errors import LaunchError

GCS_PORT = 6380  # not Ray's default 6379: a user's own `ray start --head` keeps its port
DASHBOARD_PORT = 8265
RAY_CURRENT_CLUSTER = Path(tempfile.gettempdir()) / "ray" / "ray_current_cluster"  # written by `ray start`


@dataclass(frozen=True)
class Cluster:
    address: str  # GCS host:port
    dashboard: str
    num_cpus: int
    num_gpus: int
    started: float
    pgid: int = 0  # the process group of `ray start --block` and the Ray processes it started
    forkserver: str = ""  # the socket of the fork server that starts its workers pre-imported (forkserver.py)
    forkserver_pgid: int = 0  # its process group (the server and the workers it forked)


def state_file() -> Path:
    return Path(tempfile.gettempdir()) / f"scaletrain-cluster-{os.getuid()}.json"


def _listening(address: str, timeout_s: float = 0.5) -> bool:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout_s):
            return True
    except (OSError, ValueError):
        return False


def current() -> Cluster | None:
    """The cluster `scaletrain up` started, when it is still up."""
    path = state_file()
    if not path.is_file():
        return None
    try:
        cluster = Cluster(**json.loads(path.read_text()))
    except (ValueError, TypeError):
        return None
    return cluster if _listening(cluster.address) else None


def foreign() -> str | None:
    """The address of a Ray on this machine that scaletrain did not start, if one answers."""
    try:
        address = RAY_CURRENT_CLUSTER.read_text().strip()
    except OSError:
        return None
    ours = current()
    if not address or (ours is not None and address.endswith(ours.address.rpartition(":")[2])):
        return None
    return address if _listening(address) else None


def _ray_cli() -> str:
    return str(Path(sys.executable).with_name("ray"))


def require_dashboard() -> None:
    """The Job Submission API lives in Ray's dashboard, which needs ray[default]'s packages."""
    try:
        import aiohttp  # noqa: F401
        import ray.dashboard  # noqa: F401
    except ImportError:
        raise LaunchError("Ray's dashboard (the Job Submission API) needs ray[default]: pip install "
                          "'scaletrain[cluster]'") from None


def up(num_cpus: int | None, num_gpus: int | None) -> tuple[Cluster, bool]:
    """(the cluster, whether this call started it)."""
    if (ours := current()) is not None:
        return ours, False
    if (other := foreign()) is not None:
        raise LaunchError(f"a Ray instance that scaletrain did not start is running at {other}; not starting a "
                          f"second one. scaletrain uses it only when asked (scaling.address=auto or RAY_ADDRESS="
                          f"{other}); or stop it (ray stop) and run scaletrain up again")
    require_dashboard()
    cpus = num_cpus or os.cpu_count() or 1
    # Ray rewrites a loopback bootstrap address to this node's IP when a driver joins, so the head listens there
    from ray.util import get_node_ip_address

    node_ip = get_node_ip_address()
    cmd = [_ray_cli(), "start", "--head", f"--node-ip-address={node_ip}", f"--port={GCS_PORT}",
           f"--num-cpus={cpus}", "--include-dashboard=true", "--dashboard-host=127.0.0.1",
           f"--dashboard-port={DASHBOARD_PORT}", "--disable-usage-stats"]
    if num_gpus is not None:
        cmd.append(f"--num-gpus={num_gpus}")
    # --block in a session of its own: `down` stops exactly these processes (`ray stop` would stop every Ray
    # on the machine, a user's own included)
    log = open(state_file().with_suffix(".log"), "ab")  # noqa: SIM115 - the head's output, for `up` failures
    proc = subprocess.Popen([*cmd, "--block"], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    log.close()
    address = f"{node_ip}:{GCS_PORT}"
    deadline = time.time() + 120
    while not (_listening(address) and _listening(f"127.0.0.1:{DASHBOARD_PORT}")):
        if proc.poll() is not None or time.time() > deadline:
            _kill_group(proc.pid)
            tail = state_file().with_suffix(".log").read_text(errors="replace").strip().splitlines()[-1:]
            raise LaunchError(f"ray start --head did not come up ({tail[0][:300] if tail else 'no output'}); see "
                              f"{state_file().with_suffix('.log')}")
        time.sleep(0.5)
    sock, server_pgid = _start_forkserver()
    cluster = Cluster(address, f"http://127.0.0.1:{DASHBOARD_PORT}", cpus, num_gpus or 0, time.time(), proc.pid,
                      sock, server_pgid)
    state_file().write_text(json.dumps(asdict(cluster)))
    return cluster, True


def forkserver_log() -> Path:
    return state_file().with_suffix(".forkserver.log")


def _start_forkserver(timeout_s: float = 120.0) -> tuple[str, int]:
    """Start the fork server in a session of its own, which `down` stops with the head: (its socket once it has
    imported what workers import, its process group), or ("", 0) when it did not come up (workers then start
    the plain way)."""
    from scaletrain.launch.warm import forkserver
    from scaletrain.launch.warm.env import fork_server_env

    sock = str(state_file().with_suffix(".sock"))
    log = open(forkserver_log(), "wb")  # noqa: SIM115 - the server's own output: what it forked, and why not
    proc = subprocess.Popen([sys.executable, "-m", forkserver.MODULE, "--serve", sock], stdout=log,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=fork_server_env(),
                            start_new_session=True)
    log.close()
    deadline = time.time() + timeout_s
    while not forkserver.answers(sock):
        if proc.poll() is not None or time.time() > deadline:
            _kill_group(proc.pid)
            return "", 0
        time.sleep(0.2)
    return sock, proc.pid


def run_forked_driver(argv: list[str]) -> int | None:
    """Run this scaletrain command in a driver the warm cluster's fork server forks (its imports done), and
    return its exit status; None when there is no such server or it would not fork this environment (the
    command then runs in this process, as without `up`)."""
    from scaletrain.launch.warm import forkserver
    from scaletrain.launch.warm.env import forked_driver_env

    cluster = current()
    env = forked_driver_env()
    if cluster is None or not cluster.forkserver or env is None:
        return None
    return forkserver.run_forked(cluster.forkserver, argv, env, module="scaletrain")


def _kill_group(pgid: int, grace_s: float = 20.0) -> None:
    import signal

    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.time() + grace_s
    while time.time() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def down() -> Cluster | None:
    """Stop the cluster `scaletrain up` started (None: there was none)."""
    path = state_file()
    cluster = None
    if path.is_file():
        try:
            cluster = Cluster(**json.loads(path.read_text()))
        except (ValueError, TypeError):
            cluster = None
    if cluster is None:
        return None
    for pgid in (cluster.forkserver_pgid, cluster.pgid):
        if pgid:
            _kill_group(pgid)
    if cluster.forkserver:
        Path(cluster.forkserver).unlink(missing_ok=True)
    try:  # `ray start` left its address here; a later ray.init() without one would try to join the dead head
        if RAY_CURRENT_CLUSTER.read_text().strip() == cluster.address:
            RAY_CURRENT_CLUSTER.unlink()
    except OSError:
        pass
    path.unlink(missing_ok=True)
    return cluster
