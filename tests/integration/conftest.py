import logging
import os
import signal
import warnings
from pathlib import Path

import psutil
import pytest

from tests.conftest import OWN_HEAD, PLAIN_WORKERS

# Ray Train's controller polls its workers every 2 s by default, so a run's end (and a worker's failure) is seen
# 1 s late on average: ~0.9 s of every one of the suite's ~60 Ray runs (measured, 4 runs each way). The suite
# polls every 0.5 s; scaletrain keeps Ray's default, since the faster poll costs the controller ~0.9% of a core
# for the whole run (2.65 -> 2.91 CPU-s over a 34 s run, measured), a bad trade for a real job.
os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.5")


@pytest.fixture(scope="session")
def ray_local(tmp_path_factory):
    """One local Ray instance shared by every integration test (start-up costs ~20 s here), its processes forked
    pre-imported (_fork_server)."""
    os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")
    log = tmp_path_factory.mktemp("forkserver") / "server.log"
    pgid, runtime_env = _fork_server(log)
    import ray

    ray.init(num_cpus=2, log_to_driver=False, include_dashboard=False, logging_level=logging.WARNING,
             **({"runtime_env": runtime_env} if runtime_env else {}))
    yield ray
    ray.shutdown()
    if pgid:
        os.killpg(pgid, signal.SIGKILL)  # the server and any child it forked: a session of their own
        _say_plain_starts(log)


def _say_plain_starts(log: Path) -> None:
    """A warning in the session's summary when some of the shared Ray's processes were not forked (each such
    process costs the suite seconds of imports), with the server's reasons: a regression shows, it does not hide."""
    lines = log.read_text(errors="replace").splitlines() if log.exists() else []
    plain = sorted({ln for ln in lines if ln.startswith("exec:")})
    if plain:
        forked = sum(ln.startswith("forked ") for ln in lines)
        warnings.warn(f"the shared Ray's fork server forked {forked} process(es) and started "
                      f"{sum(ln.startswith('exec:') for ln in lines)} plain ({'; '.join(plain)[:500]})", stacklevel=2)


def _fork_server(log: Path) -> tuple[int, dict | None]:
    """The fork server `scaletrain up` starts beside its head (launch/warm/forkserver.py, started by the same
    function: two_nodes.worker_forkserver), here beside the shared Ray: every process of a job on it (Ray Train's
    controller and workers) is forked from one that has imported torch, transformers and the worker loop, as on
    the warm cluster, instead of importing them again (~4-9 CPU-seconds a process on this machine; test_train_ray.py
    alone: 115 -> 68 CPU-seconds, measured). The worker loop is the same code either way; the token-auth head of
    test_token_cluster.py starts its workers the plain way, as Ray does, and test_cluster.py checks that the warm
    cluster forks. PLAIN_WORKERS=1 turns it off. A worker whose environment differs from the server's (a test's
    monkeypatched variable) starts plain: the server's log says why. The server imports under RAY_AUTH_MODE=token
    (fork_server_env), as the workers of Ray 2.60's local instance see it: it starts with token authentication.
    (its process group, the job's runtime_env)"""
    from tests.integration.two_nodes import worker_forkserver

    if os.environ.get(PLAIN_WORKERS) == "1":
        return 0, None
    runtime_env, pgid = worker_forkserver(log)
    if runtime_env is None:
        warnings.warn(f"the fork server did not come up (see {log}): Ray workers start plain", stacklevel=2)
    return pgid, runtime_env


def _own_head(p: psutil.Process) -> bool:
    try:
        return OWN_HEAD in p.environ()
    except psutil.Error:  # it ended meanwhile, or is not ours to read
        return False


@pytest.fixture
def no_orphans(ray_local):
    """After the test, no Ray Train worker process of ours is left behind (a head of a `ray_head` test or of a
    simulated cluster, running on the other pytest worker meanwhile, has its own: OWN_HEAD)."""
    yield
    import time

    deadline = time.time() + 20
    while time.time() < deadline:
        left = [p for p in psutil.process_iter(["cmdline"])
                if "RayTrainWorker" in " ".join(p.info["cmdline"] or []) and not _own_head(p)]
        if not left:
            return
        time.sleep(0.5)
    raise AssertionError(f"{len(left)} RayTrainWorker process(es) still running")


@pytest.fixture(autouse=True)
def one_worker_for_ray(request):
    """Under pytest -n 2 the Ray tests keep to one worker (tests/conftest.py); with a grouping that does not hold (an
    xdist or pytest that drops the group suffix, another --dist) two Ray instances would run side by side."""
    if os.environ.get("PYTEST_XDIST_WORKER") and request.node.get_closest_marker("ray") \
            and not request.node.nodeid.endswith("@cluster"):
        pytest.fail(f"{request.node.nodeid} is not in the xdist group 'cluster': run with --dist loadgroup and "
                    "pytest < 9.2 (pyproject.toml)")
