import logging
import os

import psutil
import pytest


@pytest.fixture(scope="session")
def ray_local():
    """One local Ray instance shared by every integration test (start-up costs ~20 s here)."""
    import os

    os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")
    import ray

    ray.init(num_cpus=2, log_to_driver=False, include_dashboard=False, logging_level=logging.WARNING)
    yield ray
    ray.shutdown()


@pytest.fixture
def no_orphans(ray_local):
    """After the test, no Ray Train worker process of ours is left behind."""
    yield
    import time

    deadline = time.time() + 20
    while time.time() < deadline:
        left = [p for p in psutil.process_iter(["cmdline"]) if "RayTrainWorker" in " ".join(p.info["cmdline"] or [])]
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
