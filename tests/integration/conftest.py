import logging
import os

import psutil
import pytest

from tests.conftest import OWN_HEAD

# Ray Train's controller polls its workers every 2 s by default, so a run's end (and a worker's failure) is seen
# 1 s late on average: ~0.9 s of every one of the suite's ~60 Ray runs (measured, 4 runs each way). The suite
# polls every 0.5 s; scaletrain keeps Ray's default, since the faster poll costs the controller ~0.9% of a core
# for the whole run (2.65 -> 2.91 CPU-s over a 34 s run, measured), a bad trade for a real job.
os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.5")


@pytest.fixture(scope="session")
def ray_local():
    """One local Ray instance shared by every integration test (start-up costs ~20 s here)."""
    import os

    os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")
    import ray

    ray.init(num_cpus=2, log_to_driver=False, include_dashboard=False, logging_level=logging.WARNING)
    yield ray
    ray.shutdown()


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
