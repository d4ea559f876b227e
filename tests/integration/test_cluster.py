"""A warm local cluster, for real: `scaletrain up` starts a Ray head on loopback (stopped after), two runs in a row
join it (fresh workers each, forked pre-imported), and `down` stops exactly what `up` started. A job goes through
Ray's Job Submission API (its agent on a port of its own); stopping one mid-run, the list and a job that does not
exist are drilled on the token-authenticated head of test_token_cluster.py (`up` starts its head with token
authentication too)."""

import contextlib
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from scaletrain.launch.submit import AGENT_PORT
from tests.conftest import OWN_HEAD

# Its own head, apart from the suite's Ray: it runs beside the `ray` tests under make test (tests/README.md)
pytestmark = pytest.mark.ray_head

DASHBOARD = "http://127.0.0.1:8265"
# Where the warm cluster keeps its state (scaletrain's state file and fork-server log, Ray's temp dir and its
# ray_current_cluster): TMPDIR, a folder of this test's own. Under pytest -n 2 another test's run goes on meanwhile:
# with the machine's /tmp it would join this cluster (its driver forked by this fork server) and die at `down`.
# OWN_HEAD: the suite's orphan check (no_orphans) leaves this head's workers alone.
_PRIVATE: dict[str, str] = {OWN_HEAD: "1"}


def _cli(*args, cwd=None, timeout=300):
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(_PRIVATE)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # `scaletrain` for the jobs
    return subprocess.run([sys.executable, "-m", "scaletrain", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd, env=env)


@pytest.fixture
def warm_cluster(monkeypatch):
    import shutil
    import tempfile

    private = tempfile.mkdtemp(prefix="stc-", dir="/tmp")  # short: Ray's socket paths must fit in 107 bytes
    monkeypatch.setitem(_PRIVATE, "TMPDIR", private)
    monkeypatch.setattr(tempfile, "tempdir", private)  # forkserver_log() read in this process
    _cli("down")
    # Ray's default port of the dashboard agent (which runs submitted jobs) held, as another Ray on the machine
    # holds it (the suite's own Ray may run meanwhile): `up` starts its agent elsewhere, or no job would run
    with socket.socket() as blocker:
        with contextlib.suppress(OSError):  # held already
            blocker.bind(("", AGENT_PORT))
            blocker.listen()
        up = _cli("up", "--num-cpus", "2")
        assert up.returncode == 0, up.stderr
        yield up
    down = _cli("down")
    assert "stopped the local Ray cluster at " in down.stderr + down.stdout
    shutil.rmtree(private, ignore_errors=True)


def _project(tmp_path: Path, demo_dir: Path, name: str, **train) -> Path:
    project = tmp_path / name
    project.mkdir()
    (project / "data.jsonl").write_text((demo_dir / "sentiment.jsonl").read_text())
    cfg = {"model": {"name_or_path": "builtin:tiny-bert"},
           "data": {"train_file": "data.jsonl", "eval_ratio": 0.2, "max_length": 32},
           "train": {"per_device_train_batch_size": 8, "max_steps": 4, "logging_steps": 2, **train},
           "scaling": {"num_workers": 1}, "monitor": {"report": False},
           "output": {"output_dir": str(tmp_path / "runs"), "run_name": name}}
    (project / "config.yaml").write_text(yaml.safe_dump(cfg))
    return project


def _pids(run: Path) -> set[str]:
    return {p.read_text().strip() for p in run.rglob("*.pid")}


def test_up_train_twice_submit_follow_down(tmp_path, demo_dir, warm_cluster):
    assert "up: a local Ray cluster at " in warm_cluster.stderr + warm_cluster.stdout
    assert ":6380 (2 CPUs" in warm_cluster.stderr + warm_cluster.stdout
    again = _cli("up")
    assert again.returncode == 0 and "already up" in again.stderr + again.stdout

    # two runs in a row, different configs: both join the warm cluster, each with fresh worker processes
    first = _project(tmp_path, demo_dir, "first")
    second = _project(tmp_path, demo_dir, "second", learning_rate=1e-3, max_steps=6)
    outs = [_cli("train", "config.yaml", "--no-progress", cwd=p) for p in (first, second)]
    for out in outs:
        assert out.returncode == 0, out.stderr[-2000:]
        assert "using the local Ray cluster started by scaletrain up (" in out.stderr + out.stdout
        assert "driver and workers forked pre-imported" in out.stderr + out.stdout
        assert "run directory" in out.stderr  # the forked driver's console reached this command's stderr
    runs = tmp_path / "runs"
    s1, s2 = (json.loads((runs / n / "summary.json").read_text()) for n in ("first", "second"))
    assert s1["steps"] == 4 and s2["steps"] == 6
    assert _pids(runs / "first") and _pids(runs / "first").isdisjoint(_pids(runs / "second"))
    # ... forked by the warm cluster's fork server (pre-imported, each used once), none started the plain way
    from scaletrain.launch.warm.cluster import forkserver_log

    served = forkserver_log().read_text()
    assert _pids(runs / "first") | _pids(runs / "second") <= set(re.findall(r"^forked (\d+)$", served, re.M))
    assert "exec:" not in served

    # a job through the Job Submission API (the project folder is its working_dir): `up` started its job agent
    # on a free port, as another Ray holds Ray's default one (the fixture holds it), so the job runs
    job = _project(tmp_path, demo_dir, "submitted")
    sub = _cli("submit", "config.yaml", "train.max_steps=3", "--address", DASHBOARD, cwd=job)
    assert sub.returncode == 0, sub.stderr
    job_id = sub.stdout.strip().splitlines()[-1]
    follow = _cli("jobs", "logs", job_id, "--follow", "--address", DASHBOARD)
    assert follow.returncode == 0 and "run directory" in follow.stdout
    status = _cli("jobs", "status", job_id, "--address", DASHBOARD)
    assert status.stdout.strip() == "SUCCEEDED", (status.stdout, follow.stdout[-2000:])
    assert json.loads((runs / "submitted" / "summary.json").read_text())["steps"] == 3  # on the cluster's storage
