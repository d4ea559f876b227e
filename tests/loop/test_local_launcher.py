"""scaling.launcher: local (auto's choice for one local worker): the loop in the command's own process, with the run
directory, checkpoints, Ctrl-C, resume and failure messages of the other launchers, and the process left as it was
(environment, torch threads, no process group)."""

import logging
import os
import signal
import threading
import time

import psutil
import pytest
import torch
import torch.distributed as dist
from safetensors.torch import load_file

from scaletrain.config import validate
from scaletrain.envvars import WORKER_ENV_DEFAULTS
from scaletrain.errors import Interrupted, TrainingError
from scaletrain.launch.job import run_job
from scaletrain.metrics.records import read_jsonl


@pytest.fixture(autouse=True)
def no_cluster(monkeypatch):
    for name in WORKER_ENV_DEFAULTS:  # unset, to see that the run's values do not stay
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv("SCALETRAIN_FAULTS", raising=False)
    monkeypatch.setattr("scaletrain.launch.warm.cluster.current", lambda: None)
    monkeypatch.setattr("scaletrain.launch.launcher.ray_running", lambda: False)


def _cfg(classify_cfg, name, **sections):
    cfg = {**classify_cfg, "output": {**classify_cfg["output"], "run_name": name}}
    for section, values in sections.items():
        cfg[section] = {**cfg.get(section, {}), **values}
    return validate(cfg)


def _weights(run_dir):
    return load_file(run_dir / "final" / "model.safetensors")


@pytest.mark.slow  # a whole run or several seconds: make test, not make test-fast
def test_one_worker_runs_here_and_leaves_the_process_as_it_was(classify_cfg, tmp_path, monkeypatch):
    def no_agent(self):
        raise AssertionError("a torchrun agent was started")

    monkeypatch.setattr("scaletrain.launch.torchrun_launcher.TorchrunNode.start", no_agent)
    others = len(psutil.Process().children(recursive=True))  # (the suite's shared Ray, when it is up)
    environ, threads = dict(os.environ), torch.get_num_threads()
    handlers, level = list(logging.getLogger().handlers), logging.getLogger().level
    result = run_job(_cfg(classify_cfg, "here", checkpoint={"save_steps": 4}), tmp_path / "c.yaml",
                     show_progress=False)
    assert "launcher: local" in (result.run_dir / "config.resolved.yaml").read_text()
    assert result.summary["steps"] == 12 and result.summary["world_size"] == 1
    assert result.summary["memory/tree_peak_processes"] <= 1 + others  # nothing was started (test_without_ray: 1)
    assert sorted(p.name for p in (result.run_dir / "checkpoints").iterdir())[-1] == "step-8"
    assert [r["step"] for r in read_jsonl(result.run_dir / "metrics.jsonl") if r.get("kind") == "train"] == [
        2, 4, 6, 8, 10, 12]
    assert (result.run_dir / "logs" / "worker-0.log").is_file() and (result.run_dir / "final").is_dir()
    # the workers' variables (HF offline, ...) were this run's only; torch's threads and process group too
    assert {k: os.environ.get(k) for k in WORKER_ENV_DEFAULTS} == {k: environ.get(k) for k in WORKER_ENV_DEFAULTS}
    assert torch.get_num_threads() == threads and not dist.is_initialized()
    assert logging.getLogger().handlers == handlers and logging.getLogger().level == level  # worker-0.log closed


@pytest.mark.slow
def test_the_same_weights_as_torchrun(classify_cfg, tmp_path):
    here = run_job(_cfg(classify_cfg, "here"), tmp_path / "c.yaml", show_progress=False)
    there = run_job(_cfg(classify_cfg, "there", scaling={"launcher": "torchrun"}), tmp_path / "c.yaml",
                    show_progress=False)
    a, b = _weights(here.run_dir), _weights(there.run_dir)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow  # a whole run or several seconds: make test, not make test-fast
def test_fsdp_runs_on_its_process_group_of_one(classify_cfg, tmp_path):
    result = run_job(_cfg(classify_cfg, "fsdp", train={"strategy": "fsdp"}), tmp_path / "c.yaml",
                     show_progress=False)
    assert result.summary["steps"] == 12 and result.summary["strategy"] == "fsdp" and not dist.is_initialized()


@pytest.mark.slow  # a whole run or several seconds: make test, not make test-fast
def test_a_failure_is_worded_as_torchrun_words_it(classify_cfg, tmp_path, monkeypatch):
    cfg = _cfg(classify_cfg, "fails", scaling={"launcher": "local"})
    monkeypatch.setenv("SCALETRAIN_FAULTS", "raise:0:3")
    environ = dict(os.environ)
    with pytest.raises(TrainingError) as e:
        run_job(cfg, tmp_path / "c.yaml", show_progress=False)
    assert "training failed: [rank 0]: InjectedFault: injected fault at step 3 on rank 0" in str(e.value)
    assert "InjectedFault" in (tmp_path / "runs" / "fails" / "logs" / "worker-0.log").read_text()
    assert {k: os.environ.get(k) for k in WORKER_ENV_DEFAULTS} == {k: environ.get(k) for k in WORKER_ENV_DEFAULTS}
    assert not dist.is_initialized()


@pytest.mark.slow  # a whole run or several seconds: make test, not make test-fast
def test_ctrl_c_checkpoints_here_and_resume_ends_where_an_uninterrupted_run_does(classify_cfg, tmp_path):
    from scaletrain import cli

    reference = run_job(_cfg(classify_cfg, "ref", train={"max_steps": 40}), tmp_path / "c.yaml", show_progress=False)
    cfg = _cfg(classify_cfg, "stopped", train={"max_steps": 40}, checkpoint={"save_steps": 100})
    run_dir = tmp_path / "runs" / "stopped"

    def interrupt():  # Ctrl-C once rank 0 has logged step 6 (the run is in this process: signal ourselves)
        deadline = time.time() + 120
        while time.time() < deadline:
            steps = [r["step"] for r in read_jsonl(run_dir / "metrics.jsonl") if r.get("kind") == "train"] \
                if (run_dir / "metrics.jsonl").is_file() else []
            if steps and steps[-1] >= 6:
                os.kill(os.getpid(), signal.SIGINT)
                return
            time.sleep(0.01)

    threading.Thread(target=interrupt, daemon=True).start()
    with pytest.raises(Interrupted, match=f"scaletrain train --resume {run_dir}"):
        run_job(cfg, tmp_path / "c.yaml", show_progress=False)
    stopped = [p.name for p in (run_dir / "checkpoints").iterdir()]
    assert len(stopped) == 1 and not (run_dir / "final").exists()
    assert cli.main(["train", "--resume", str(run_dir), "--no-progress"]) == 0
    a, b = _weights(run_dir), _weights(reference.run_dir)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert f"resume: from {stopped[0]}" in (run_dir / "logs" / "main.log").read_text()
