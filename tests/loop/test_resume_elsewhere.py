"""A run is self-contained: started with relative paths from a project folder, it resumes from any other directory
(the resolved config holds them absolute), and a path that exists only where the run started is named as such."""

import os
import shutil
from pathlib import Path

import pytest
import yaml

from tests.cli import run_cli
from tests.conftest import write_config

pytestmark = pytest.mark.slow  # subprocesses of the CLI or whole runs: make test-loop's budget, not test-fast's


def _cli(*args, cwd, faults=""):
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "SCALETRAIN_FAULTS")}
    if faults:
        env["SCALETRAIN_FAULTS"] = faults
    return run_cli(*args, cwd=cwd, env=env)


def test_a_run_with_relative_paths_resumes_from_another_directory(classify_cfg, demo_dir, tmp_path):
    project = tmp_path / "project"
    (project / "data").mkdir(parents=True)
    shutil.copy(demo_dir / "sentiment.jsonl", project / "data" / "train.jsonl")
    cfg = {**classify_cfg, "data": {**classify_cfg["data"], "train_file": "data/train.jsonl"},
           "train": {**classify_cfg["train"], "max_steps": 6}, "checkpoint": {"save_steps": 2},
           "output": {"output_dir": "runs", "run_name": "r"}}
    write_config(project / "c.yaml", cfg)
    first = _cli("train", "c.yaml", cwd=project, faults="raise:0:4")  # a crash after the step-2 checkpoint
    assert first.returncode != 0
    run = project / "runs" / "r"
    saved = yaml.safe_load((run / "config.resolved.yaml").read_text())
    assert saved["data"]["train_file"] == str(project / "data" / "train.jsonl")
    assert saved["output"]["output_dir"] == str(project / "runs")

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    # the data is only where the run started: named, with what to do, before anything starts
    (project / "data").rename(project / "moved")
    gone = _cli("train", "--resume", run, cwd=elsewhere)
    assert gone.returncode != 0 and "Traceback" not in gone.stderr
    assert (f"data.train_file={project / 'data' / 'train.jsonl'}, recorded by the run, does not exist on this "
            f"machine") in gone.stderr
    (project / "moved").rename(project / "data")
    resumed = _cli("train", "--resume", run, cwd=elsewhere)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert yaml.safe_load((run / "summary.json").read_text())["steps"] == 6
    assert not (elsewhere / "runs").exists() and not list(Path(elsewhere).iterdir())  # nothing written here
