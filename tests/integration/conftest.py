import logging

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
