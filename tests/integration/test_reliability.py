"""Fault injection on a shared local Ray (gloo, 2 workers): kill, exceptions, hangs, Ctrl-C, a lost driver (secrets:
test_secrets.py)."""

import contextlib
import json
import os
import re
import signal
import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from scaletrain import cli
from scaletrain.config import validate
from scaletrain.errors import Interrupted, TrainingError
from scaletrain.launch.job import run_job
from scaletrain.metrics.records import read_jsonl
from tests.conftest import classify_dict

# the shared Ray up from the first test on: scaling.launcher auto runs on it, as the tests mean (without it, 2
# local workers would run under torchrun)
pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_local")]


def _cfg(classify_cfg, tmp_path, name, **sections):
    cfg = json.loads(json.dumps(classify_cfg))
    cfg["scaling"]["num_workers"] = 2
    cfg["output"] = {"output_dir": str(tmp_path / "runs"), "run_name": name}
    for section, values in sections.items():
        cfg.setdefault(section, {}).update(values)
    return validate(cfg)


def _run(cfg, tmp_path):
    return run_job(cfg, tmp_path / "c.yaml", show_progress=False)


def _weights(run_dir):
    return load_file(Path(run_dir) / "final" / "model.safetensors")


def _same(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _when_step(run_dir: Path, step: int, action, timeout=240):
    """Run ``action`` in a thread once rank 0 has logged ``step``."""
    def watch():
        deadline = time.time() + timeout
        while time.time() < deadline:
            steps = [r["step"] for r in read_jsonl(run_dir / "metrics.jsonl") if r.get("kind") == "train"]
            if steps and steps[-1] >= step:
                action()
                return
            time.sleep(0.05)
    t = threading.Thread(target=watch, daemon=True)
    t.start()
    return t


@pytest.fixture(scope="module")
def reference(demo_dir, tmp_path_factory, ray_local):
    """An uninterrupted 2-worker run to compare final weights with (run once for the module), under torchrun: the
    same weights to the bit as on Ray (the loop does not depend on the launcher), from a job that starts in about
    half a Ray one's time."""
    tmp_path = tmp_path_factory.mktemp("reference")
    cfg = _cfg(classify_dict(demo_dir, tmp_path), tmp_path, "ref", train={"max_steps": 24, "logging_steps": 1},
               checkpoint={"save_steps": 4, "save_total_limit": 2}, scaling={"launcher": "torchrun"})
    return _weights(_run(cfg, tmp_path).run_dir)


def test_chaos_kills_three_random_workers_and_the_run_ends_bit_identical(classify_cfg, tmp_path, reference,
                                                                         no_orphans):
    """fault_tolerance.chaos: 3 seeded SIGKILLs at random steps; the run completes with the uninterrupted run's
    weights, and its goodput account shows the 3 interruptions and what they cost."""
    cfg = _cfg(classify_cfg, tmp_path, "chaos", train={"max_steps": 24, "logging_steps": 1},
               checkpoint={"save_steps": 4, "save_total_limit": 2},
               fault_tolerance={"max_failures": 3, "chaos": {"kills": 3, "mtbf_steps": 6, "seed": 1}})
    result = _run(cfg, tmp_path)
    run_dir = tmp_path / "runs" / "chaos"
    log = (run_dir / "logs" / "main.log").read_text()
    assert re.search(r"chaos: 3 kill\(s\) of a worker \(seed 1\): rank \d at step \d+, rank", log)
    assert len(re.findall(r"failure \d \(max_failures=3\)", log)) == 3
    assert result.summary["steps"] == 24 and _same(_weights(run_dir), reference)
    g = result.summary
    assert g["goodput/interruptions"] == 3 and g["goodput/restart_s"] > 0 and g["goodput/lost_work_s"] > 0
    parts = [v for k, v in g.items() if k.startswith("goodput/") and k.endswith("_s") and k != "goodput/wall_s"]
    assert sum(parts) == pytest.approx(g["goodput/wall_s"], rel=0.01)


def test_more_failures_than_allowed_fails_grouped_by_rank(classify_cfg, tmp_path, monkeypatch, no_orphans):
    monkeypatch.setenv("SCALETRAIN_FAULTS", "raise:1:3:5")  # fires on every attempt
    cfg = _cfg(classify_cfg, tmp_path, "fails", fault_tolerance={"max_failures": 1})
    with pytest.raises(TrainingError) as e:
        _run(cfg, tmp_path)
    msg = str(e.value)
    assert "[rank 1]: InjectedFault: injected fault at step 3 on rank 1" in msg and msg.endswith("logs/worker-1.log")
    log = (tmp_path / "runs" / "fails" / "logs" / "main.log").read_text()
    assert "failure 1 (max_failures=1)" in log and "failure 2 (max_failures=1)" in log
    assert "no restarts left" in log
    assert "InjectedFault" in (tmp_path / "runs" / "fails" / "logs" / "worker-1.log").read_text()


def test_a_hang_is_detected_names_the_rank_saves_stacks_and_is_retried_once_by_default(
        classify_cfg, tmp_path, monkeypatch, no_orphans):
    """Rank 1 sleeps before the gradient sync of step 5 (once: the retry runs clean): the watchdog names it and the
    steps each rank finished, both ranks' stacks are saved, and the default policy (one hang retry) resumes from
    the newest checkpoint. What the policy decides for hang_retries 0 (raise) and -1 (always retry) is decided in
    milliseconds in tests/unit/test_restart_decisions.py; the error a run that ends raises is the crash path's."""
    monkeypatch.setenv("SCALETRAIN_FAULTS", "hang:1:5")
    cfg = _cfg(classify_cfg, tmp_path, "hang", comm={"timeout_s": 10}, checkpoint={"save_steps": 2})
    result = _run(cfg, tmp_path)
    assert result.summary["steps"] == 12
    run_dir = result.run_dir
    log = (run_dir / "logs" / "main.log").read_text()
    failure = next(ln for ln in log.splitlines() if "[driver] failure: training failed: hang:" in ln)
    assert "rank(s) 1 did not arrive at the gradient sync of step 5" in failure
    assert "last finished step: rank 0: 4, rank 1: 4" in failure and "decision: retry" in failure
    assert "resume: from step-4" in log
    assert "maybe_fire" in (run_dir / "stacks" / "rank-1.txt").read_text()  # the sleeping frame
    assert "backward" in (run_dir / "stacks" / "rank-0.txt").read_text()  # waiting in the gradient all-reduce
    # detected by the collective timeout the run set (comm.timeout_s), not gloo's default of 30 minutes: gloo's own
    # words on the waiting rank name it
    assert "Timed out waiting 10000ms for recv operation to complete" in log


def test_ctrl_c_checkpoints_then_resume_is_bit_identical(classify_cfg, tmp_path, reference, no_orphans):
    cfg = _cfg(classify_cfg, tmp_path, "stopped", train={"max_steps": 24, "logging_steps": 1},
               checkpoint={"save_steps": 4, "save_total_limit": 2})
    run_dir = tmp_path / "runs" / "stopped"
    watcher = _when_step(run_dir, 6, lambda: os.kill(os.getpid(), signal.SIGINT))
    with pytest.raises(Interrupted, match=f"scaletrain train --resume {run_dir}"):
        _run(cfg, tmp_path)
    watcher.join(5)
    log = (run_dir / "logs" / "main.log").read_text()
    stopped_at = int(re.search(r"stopped: on request at step (\d+)", log).group(1))
    assert 6 <= stopped_at < 24 and (run_dir / "checkpoints" / f"step-{stopped_at}").is_dir()
    assert not (run_dir / "final").exists()
    assert cli.main(["train", "--resume", str(run_dir), "--no-progress"]) == 0
    assert _same(_weights(run_dir), reference)
    assert f"resume: from step-{stopped_at}" in (run_dir / "logs" / "main.log").read_text()
    # a finished run cannot be resumed again, and an incompatible config is refused
    assert cli.main(["train", "--resume", str(run_dir)]) != 0


def test_resume_refuses_a_config_that_breaks_it(classify_cfg, tmp_path, capsys):
    run_dir = tmp_path / "runs" / "r"
    run_dir.mkdir(parents=True)
    from scaletrain.config import dump_config

    (run_dir / "config.resolved.yaml").write_text(dump_config(_cfg(classify_cfg, tmp_path, "r")))
    # another number of workers keeps the global batch (accumulation recomputed): allowed; another per-device
    # batch changes the samples of every step: refused
    assert cli.main(["train", "--resume", str(run_dir), "train.per_device_train_batch_size=3"]) != 0
    err = capsys.readouterr().err
    assert "train.per_device_train_batch_size: 8 -> 3" in err and "--force-resume" in err


# --- a run on object storage (an S3 API server on loopback), the workers without the driver's disk ------------

def _store_cfg(classify_cfg, tmp_path, endpoint, bucket, name, **sections):
    cfg = _cfg(classify_cfg, tmp_path, name, train={"max_steps": 24, "logging_steps": 1},
               checkpoint={"save_steps": 4, "save_total_limit": 2}, **sections).model_dump(mode="json")
    cfg["output"] = {"output_dir": f"s3://{bucket}/runs", "run_name": name}
    # the driver's mirror and the workers' node directory are different roots: workers only ever get the URI
    cfg["storage"] = {"endpoint_url": endpoint, "mirror_dir": str(tmp_path / "driver"),
                      "node_dir": str(tmp_path / "nodes"), "sync_interval_s": 1}
    return cfg


def _store_weights(endpoint, uri, tmp_path):
    import fsspec

    fs = fsspec.filesystem("s3", endpoint_url=endpoint, skip_instance_cache=True)
    local = tmp_path / f"final-{time.time_ns()}.safetensors"
    fs.get_file(f"{uri.removeprefix('s3://')}/final/model.safetensors", str(local))
    return load_file(local)


def _store_text(endpoint, key):
    import fsspec

    return fsspec.filesystem("s3", endpoint_url=endpoint, skip_instance_cache=True).cat_file(key).decode()


def test_a_run_on_object_storage_outlives_its_driver_and_a_killed_worker_without_a_shared_disk(
        classify_cfg, demo_dir, tmp_path, reference, s3_server, monkeypatch, no_orphans):
    """Two drills on one run whose directory and data are on object storage (an S3 server on loopback):

    - the driver is SIGKILLed after the store holds step-8, and every process of the Ray it started ends with it
      (#72: its reaper, launch/orphans.py; Ray's controller once stayed 15 minutes);
    - `train --resume s3://...` from another working directory, with another mirror and node directory (as on
      another machine), and in it the kill -9 drill under Ray: a worker SIGKILLed (by the test: the code under
      test cannot fake it) restarts in a new process from the store's checkpoint.

    The run ends with the uninterrupted run's weights, its metrics history continued, not doubled, its goodput
    account showing the interruption; the workers' files reach the driver only through Ray; no credential is
    written anywhere; `report s3://...` writes the report to the store."""
    import subprocess
    import sys

    import fsspec
    import psutil
    import yaml

    from scaletrain.launch import orphans
    from tests.conftest import S3_SECRET, make_bucket

    bucket = make_bucket(s3_server, "st-driver")
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server)  # for data.train_file's URI: the standard chain
    # rank 0 sleeps 600 ms before each step (the losses do not change): the 16 steps after step-8 outlast the
    # reaper's 5 s of grace, so both sessions are killed mid-run (at ~35 ms a step, a fast machine's workers once
    # finished all 24 steps and saved step-24 before they ended, and the resumed session had nothing left to kill)
    monkeypatch.setenv("SCALETRAIN_FAULTS", "pause:0:1:600")
    fs = fsspec.filesystem("s3", endpoint_url=s3_server, skip_instance_cache=True)
    fs.put_file(str(demo_dir / "sentiment.jsonl"), f"{bucket}/input/sentiment.jsonl")
    cfg = _store_cfg(classify_cfg, tmp_path, s3_server, bucket, "lost", fault_tolerance={"max_failures": 2})
    cfg["data"]["train_file"] = f"s3://{bucket}/input/sentiment.jsonl"
    config = tmp_path / "lost.yaml"
    config.write_text(yaml.safe_dump(cfg))
    key, uri = f"{bucket}/runs/lost", f"s3://{bucket}/runs/lost"
    token = None
    driver = subprocess.Popen([sys.executable, "-m", "scaletrain", "train", str(config), "--no-progress"],
                              cwd=tmp_path, start_new_session=True, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 240
        while time.time() < deadline and driver.poll() is None:
            fs.invalidate_cache()
            if fs.exists(f"{key}/checkpoints/step-8/manifest.json"):
                break
            time.sleep(0.2)
        assert driver.poll() is None, "the driver ended before it could be killed"
        token = orphans.token_of(driver.pid)
        started = [p for p, _ in orphans.marked(token)]
        names = {" ".join(p.cmdline()[:1]) for p in started}
        assert any("TrainController" in n for n in names) and any("raylet" in n for n in names), names
        os.kill(driver.pid, signal.SIGKILL)  # the driver alone (an OOM kill): the Ray it started ends with it (#72)
        driver.wait()
        _, alive = psutil.wait_procs(started, timeout=10)  # the reaper's SIGTERM, 5 s of grace, then SIGKILL
        assert not alive, f"still running 10 s after the driver's SIGKILL: {[p.cmdline()[:1] for p in alive]}"
        assert not list(orphans.marked(token))
    finally:
        ours = [p for p, _ in orphans.marked(token)] if token else []
        with contextlib.suppress(ProcessLookupError):
            os.killpg(driver.pid, signal.SIGKILL)
        for p in ours:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
        driver.wait()

    elsewhere, mirror = tmp_path / "elsewhere", tmp_path / "other" / "s3" / bucket / "runs" / "lost"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    resumed_at, killed = time.time(), {}

    def kill_rank1():  # three steps into the resumed session (its records are the ones written after it began)
        deadline = time.time() + 240
        while time.time() < deadline:
            with contextlib.suppress(OSError, ValueError):
                if len([r for r in read_jsonl(mirror / "metrics.jsonl")
                        if r.get("kind") == "train" and r["time"] > resumed_at]) >= 3:
                    pid = int((mirror / "pids" / "rank-1.pid").read_text())  # arrived through the relay
                    os.kill(pid, signal.SIGKILL)
                    killed["pid"] = pid
                    return
            time.sleep(0.05)

    watcher = threading.Thread(target=kill_rank1, daemon=True)
    watcher.start()
    # as on another machine: the store's endpoint given (alone, this test has no earlier one's cached client)
    assert cli.main(["train", "--resume", uri, f"storage.endpoint_url={s3_server}",
                     f"storage.mirror_dir={tmp_path / 'other'}", f"storage.node_dir={tmp_path / 'nodes'}",
                     "--no-progress"]) == 0
    watcher.join(5)
    assert killed and int((mirror / "pids" / "rank-1.pid").read_text()) != killed["pid"]  # a new worker process
    log = _store_text(s3_server, f"{key}/logs/main.log")
    resumes = [int(n) for n in re.findall(r"resume: from step-(\d+)", log)]
    assert len(resumes) == 2 and 8 <= resumes[0] <= resumes[1] < 24, resumes  # the driver's, the worker's
    assert re.search(r"failure 1 \(max_failures=2\): \[rank 1\]: worker process died", log)
    assert "restarting the worker group from the newest checkpoint" in log
    assert _same(_store_weights(s3_server, uri, tmp_path), reference)
    summary = json.loads(_store_text(s3_server, f"{key}/summary.json"))
    assert summary["steps"] == 24
    g = summary  # the goodput account: the interruption, its restart, and the steps it trained again
    assert g["goodput/interruptions"] >= 1 and g["goodput/restart_s"] > 0 and g["goodput/lost_work_s"] >= 0
    assert g["goodput/productive_s"] < g["goodput/wall_s"] and 0 < g["goodput/ratio"] < 1
    steps = [json.loads(line)["step"] for line in _store_text(s3_server, f"{key}/metrics.jsonl").splitlines()
             if json.loads(line).get("kind") == "train"]
    # the history the store kept is not doubled by the resume, and the resumed session logged every step after
    # its checkpoint (steps the lost driver's workers trained past it, if uploaded, stay: the goodput's lost work)
    assert [steps.count(s) for s in set(steps) if s <= resumes[0]] == [1] * len({s for s in steps if s <= resumes[0]})
    assert steps[-(24 - resumes[1]):] == list(range(resumes[1] + 1, 25))
    assert sorted(p.rsplit("/", 1)[-1] for p in fs.ls(f"{key}/checkpoints")) == ["step-20", "step-24"]
    # the workers' world: their node directory and the store; the mirror's copies of their files came by Ray
    nodes = tmp_path / "nodes" / "s3" / bucket / "runs" / "lost"
    assert sorted(p.name for p in nodes.iterdir()) == ["data", "rank-0", "rank-1"]
    worker_files = [p for p in nodes.rglob("*") if p.is_file()]
    assert not any(str(tmp_path / "other").encode() in p.read_bytes() for p in worker_files)
    assert (mirror / "heartbeat" / "rank-1.json").is_file() and (mirror / "logs" / "worker-1.log").is_file()
    # no credential anywhere: our files, the store's objects, Ray's logs
    import ray

    session = Path(ray._private.worker._global_node.get_session_dir_path())
    for p in [*tmp_path.rglob("*"), *session.rglob("*")]:
        if p.is_file() and p.stat().st_size < 50 * 2**20:
            assert S3_SECRET.encode() not in p.read_bytes(), f"the secret key is in {p}"
    fs.invalidate_cache()
    for k in fs.find(bucket):
        assert S3_SECRET.encode() not in fs.cat_file(k), f"the secret key is in s3://{k}"
    # `report s3://...` from another machine's view: fetched, written, uploaded
    fs.rm_file(f"{key}/report.md")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # its mirror goes to ~/.cache/scaletrain/mirror
    assert cli.main(["report", uri]) == 0
    assert "lost" in _store_text(s3_server, f"{key}/report.md")
