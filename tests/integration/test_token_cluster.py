"""A Ray head as Ray's own docs start one, `ray start --head --dashboard-host=127.0.0.1 --port=P --dashboard-port=D`,
with token authentication on (Ray turns it on when its token is on file), on loopback, stopped after. scaletrain
joins it (train on 2 workers), submits and follows jobs, and says in one line what is wrong when the token is
missing or refused; the token string is in no file scaletrain or Ray wrote."""

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from scaletrain.launch.cluster_auth import ask_dashboard, ask_gcs
from scaletrain.launch.warm.cluster import _kill_group
from tests.cli import run_cli
from tests.conftest import OWN_HEAD
from tests.integration.test_cluster import _project  # the same project folder (relative data path)

# Its own head, apart from the suite's Ray: it runs beside the `ray` tests under make test (tests/README.md)
pytestmark = pytest.mark.ray_head

TOKEN = secrets.token_hex(32)
RAY_VARIABLES = ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(home: Path, **extra) -> dict:
    """This process's environment as a user's shell would have it: a home of its own, none of Ray's variables
    (the test session's own Ray set RAY_AUTH_MODE here), this venv's commands first on PATH."""
    env = {k: v for k, v in os.environ.items() if k not in RAY_VARIABLES}
    env.update(HOME=str(home), PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
               **{OWN_HEAD: "1"}, **extra)  # the suite's orphan check (no_orphans) leaves this head's workers alone
    return env


@dataclass
class Head:
    gcs: str
    dashboard: str
    temp: Path  # Ray's session files and logs
    home: Path


@pytest.fixture(scope="module")
def token_head(tmp_path_factory):
    home = tmp_path_factory.mktemp("head-home")
    (home / ".ray").mkdir()
    (home / ".ray" / "auth_token").write_text(TOKEN + "\n")  # as `ray get-auth-token --generate` leaves it
    temp = Path(tempfile.mkdtemp(prefix="rt", dir="/tmp"))  # short: Ray's socket paths must fit 107 characters
    gcs, dash = _free_port(), _free_port()
    # Ports of its own for what Ray would put on fixed defaults: the suite's own Ray runs beside this head on
    # this machine (its dashboard agent holds 52365, and a second agent there never comes up)
    own = [f"--{flag}={_free_port()}" for flag in ("dashboard-agent-listen-port", "dashboard-agent-grpc-port",
                                                   "runtime-env-agent-port", "metrics-export-port")]
    log = open(temp.parent / f"{temp.name}.log", "wb")  # noqa: SIM115 - closed at teardown
    proc = subprocess.Popen(
        [str(Path(sys.executable).with_name("ray")), "start", "--head", "--dashboard-host=127.0.0.1", f"--port={gcs}",
         f"--dashboard-port={dash}", *own, "--num-cpus=2", "--disable-usage-stats", f"--temp-dir={temp}",
         "--block"],
        env=_env(home), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    head = Head(f"127.0.0.1:{gcs}", f"http://127.0.0.1:{dash}", temp, home)
    deadline = time.time() + 120
    try:
        while not (_answers(head.gcs) and ask_dashboard(head.dashboard).kind == "unauthenticated"):
            assert proc.poll() is None and time.time() < deadline, (temp.parent / f"{temp.name}.log").read_text()
            time.sleep(0.5)
        yield head
    finally:  # this head's process group only, as `down` stops its own: `ray stop` would stop every Ray here
        _kill_group(proc.pid, grace_s=30)
        proc.wait(timeout=30)
        log.close()
        shutil.rmtree(temp, ignore_errors=True)


def _answers(gcs: str) -> bool:
    host, port = gcs.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=1).close()
    except OSError:
        return False
    return ask_gcs(gcs, timeout_s=2).kind == "unauthenticated"


def _cli(*args, env, cwd=None, timeout=300):
    """A command in a process of its own: where it talks to the cluster through Ray's own client (a job, its logs,
    status and list: Ray's token is read once per process) or trains on it."""
    return subprocess.run([sys.executable, "-m", "scaletrain", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd, env=env)


def _holding(token: str, *roots: Path) -> list[str]:
    """The files under ``roots`` whose bytes contain ``token``."""
    found = []
    for root in roots:
        for p in root.rglob("*"):
            try:
                if p.is_file() and not p.is_symlink() and token.encode() in p.read_bytes():
                    found.append(str(p))
            except OSError:  # a socket, a file Ray removed meanwhile
                pass
    return found


def test_the_head_requires_the_token_as_ray_starts_it(token_head):
    assert ask_gcs(token_head.gcs).kind == "unauthenticated"
    assert ask_gcs(token_head.gcs, TOKEN).kind == "ok" and ask_gcs(token_head.gcs, "x" * 64).kind == "unauthenticated"
    assert ask_dashboard(token_head.dashboard, TOKEN).kind == "ok"


def test_train_on_two_workers_with_the_token_file_and_the_token_is_nowhere(token_head, tmp_path, demo_dir):
    home = tmp_path / "home"
    (home / ".ray").mkdir(parents=True)
    (home / ".ray" / "auth_token").write_text(TOKEN)  # the token found in ~/.ray/auth_token
    project = _project(tmp_path, demo_dir, "joined")
    wandb_dir = tmp_path / "wandb-files"
    out = _cli("train", "config.yaml", "--no-progress", f"scaling.address={token_head.gcs}", "scaling.num_workers=2",
               "monitor.report_to=[wandb]", cwd=project,
               env=_env(home, WANDB_MODE="offline", WANDB_DIR=str(wandb_dir), WANDB_SILENT="true"))
    assert out.returncode == 0, out.stderr[-3000:]
    run = tmp_path / "runs" / "joined"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 4 and summary["world_size"] == 2
    resolved = yaml.safe_load((run / "config.resolved.yaml").read_text())
    assert resolved["data"]["train_file"] == str(project / "data.jsonl")  # absolute: the run is self-contained
    # W&B follows WANDB_DIR (and main.log says so), not the run directory
    assert list(wandb_dir.glob("wandb/offline-run-*")) and not (run / "wandb").exists()
    assert f"wandb -> {wandb_dir} (WANDB_DIR)" in (run / "logs" / "main.log").read_text()
    # the token is in no file of the run, of the tracker, or of Ray's session (its logs included)
    assert _holding(TOKEN, run, wandb_dir, token_head.temp) == []
    assert TOKEN not in out.stdout + out.stderr


def test_jobs_with_the_token_in_the_environment_and_in_a_token_path(token_head, tmp_path, demo_dir):
    env = _env(tmp_path / "empty-home", RAY_AUTH_TOKEN=TOKEN)
    job = _project(tmp_path, demo_dir, "submitted")
    # the data in a git-ignored folder, where users keep it: Ray leaves such files out of the upload, so the job
    # failed on the cluster with "file not found" (#60); it is uploaded all the same, and said
    (job / "data").mkdir()
    (job / "data.jsonl").rename(job / "data" / "train.jsonl")
    (job / ".gitignore").write_text("data/\n*.log\n")
    (job / "data" / "other.jsonl").write_text("not for the job\n")
    outside = run_cli("submit", "config.yaml", "data.train_file=../outside.jsonl", "--address",
                      token_head.dashboard, cwd=job, env=env)
    assert outside.returncode != 0 and len(outside.stderr.strip().splitlines()) == 1
    assert "data.train_file=../outside.jsonl: outside the working directory" in outside.stderr
    sub = _cli("submit", "config.yaml", "train.max_steps=3", "data.train_file=data/train.jsonl", "--address",
               token_head.dashboard, cwd=job, env=env)
    assert sub.returncode == 0, sub.stderr[-3000:]
    assert "data.train_file=data/train.jsonl: ignored by .gitignore, uploaded with the job all the same" in sub.stderr
    job_id = sub.stdout.strip().splitlines()[-1]
    follow = _cli("jobs", "logs", job_id, "--follow", "--address", token_head.dashboard, env=env)
    assert follow.returncode == 0 and "run directory" in follow.stdout, follow.stderr[-2000:]
    status = _cli("jobs", "status", job_id, "--address", token_head.dashboard, env=env)
    assert status.stdout.strip() == "SUCCEEDED", (status.stderr, follow.stdout[-2000:])
    assert json.loads((tmp_path / "runs" / "submitted" / "summary.json").read_text())["steps"] == 3

    # the token in the file RAY_AUTH_TOKEN_PATH names, with the spaces and newline an editor leaves
    token_file = tmp_path / "token"
    token_file.write_text(f"  {TOKEN} \n")
    env = _env(tmp_path / "empty-home", RAY_AUTH_TOKEN_PATH=str(token_file))
    long = _project(tmp_path, demo_dir, "long", max_steps=100000)
    long_id = _cli("submit", "config.yaml", "--address", token_head.dashboard, cwd=long, env=env
                   ).stdout.strip().splitlines()[-1]
    stop = _cli("jobs", "stop", long_id, "--address", token_head.dashboard, env=env)
    assert stop.returncode == 0 and "stop requested" in stop.stdout, stop.stderr[-2000:]
    deadline = time.time() + 120  # (a job stopped before its driver ran ends all the same)
    while _cli("jobs", "status", long_id, "--address", token_head.dashboard, env=env).stdout.strip() not in (
            "STOPPED", "FAILED"):
        assert time.time() < deadline, "the stopped job did not stop"
        time.sleep(2)
    listed = _cli("jobs", "list", "--address", token_head.dashboard, env=env)
    assert job_id in listed.stdout and long_id in listed.stdout, listed.stderr[-2000:]
    assert "SUCCEEDED" in listed.stdout
    missing = _cli("jobs", "status", "raysubmit_doesnotexist", "--address", token_head.dashboard, env=env)
    assert missing.returncode != 0 and "does not exist on this cluster" in missing.stderr
    assert "Traceback" not in missing.stderr
    assert TOKEN not in sub.stdout + sub.stderr + follow.stdout + follow.stderr + listed.stdout + listed.stderr


# The refusals below are said before Ray is imported or joined (launch/cluster_auth.py): in this process, as
# tests/cli.py runs a command, each with the environment a user's shell would give it.
@pytest.mark.parametrize("command", ["train", "jobs"])
def test_a_missing_or_refused_token_is_one_line(token_head, tmp_path, demo_dir, command):
    project = _project(tmp_path, demo_dir, "refused")
    args = (["train", "config.yaml", f"scaling.address={token_head.gcs}"] if command == "train"
            else ["jobs", "list", "--address", token_head.dashboard])
    missing = run_cli(*args, cwd=project, env=_env(tmp_path / "empty-home"))
    refused = run_cli(*args, cwd=project, env=_env(tmp_path / "empty-home", RAY_AUTH_TOKEN="0" * 64))
    for out, says in ((missing, "requires Ray's token authentication and no token was found here; Ray looks in "
                                "RAY_AUTH_TOKEN, the file RAY_AUTH_TOKEN_PATH names, or ~/.ray/auth_token"),
                      (refused, "the cluster refused the token from RAY_AUTH_TOKEN")):
        errors = [ln for ln in out.stderr.splitlines() if ln.startswith("error:")]
        assert out.returncode != 0 and len(errors) == 1 and says in errors[0], out.stderr[-2000:]
        assert "ray get-auth-token" in errors[0] and "Traceback" not in out.stderr
        assert "InvalidAuthToken" not in out.stderr and "0" * 64 not in out.stderr
    assert not (tmp_path / "runs" / "refused").exists()  # nothing was started or written


def test_an_address_that_answers_but_is_not_ray(token_head, tmp_path, demo_dir):
    project = _project(tmp_path, demo_dir, "not-ray")
    port = token_head.dashboard.rsplit(":", 1)[1]
    train = run_cli("train", "config.yaml", f"scaling.address=127.0.0.1:{port}", cwd=project, env=_env(tmp_path))
    assert train.returncode != 0 and "something answers there but it is not a Ray cluster" in train.stderr
    assert "GCS address" in train.stderr and "Traceback" not in train.stderr
    jobs = run_cli("jobs", "list", "--address", f"http://{token_head.gcs}", env=_env(tmp_path))
    assert jobs.returncode != 0 and "not a Ray cluster" in jobs.stderr and "dashboard address" in jobs.stderr
    assert "Traceback" not in jobs.stderr


def test_our_token_mode_disabled_against_a_token_cluster_is_one_line(token_head, tmp_path, demo_dir):
    project = _project(tmp_path, demo_dir, "disabled")
    out = run_cli("train", "config.yaml", f"scaling.address={token_head.gcs}", cwd=project,
                  env=_env(tmp_path, RAY_AUTH_MODE="disabled", RAY_AUTH_TOKEN=TOKEN))
    assert out.returncode != 0 and "RAY_AUTH_MODE=disabled here" in out.stderr and "Traceback" not in out.stderr
