"""The torchrun launcher: one node with 2 processes, 2 "nodes" on loopback, restarts; same curve as Ray."""

import json
import subprocess
import sys

import pytest
import yaml

from scaletrain.comm.ports import free_port
from scaletrain.config import validate
from scaletrain.launch.job import run_job
from scaletrain.launch.launcher import launcher_for
from tests.conftest import classify_dict, train_losses

pytestmark = pytest.mark.ray


def _cfg(classify_cfg, tmp_path, name, launcher, **scaling):
    cfg = json.loads(json.dumps(classify_cfg))
    cfg["train"].update(max_steps=12, logging_steps=2)
    cfg["checkpoint"] = {"save_steps": 4}
    cfg["scaling"] = {"num_workers": 2, "launcher": launcher, **scaling}
    cfg["output"] = {"output_dir": str(tmp_path / "runs"), "run_name": name}
    return cfg


@pytest.fixture(scope="module")
def ray_curve(demo_dir, tmp_path_factory, ray_local):
    """The Ray launcher's curve of the same job, run once for the module's comparisons."""
    tmp_path = tmp_path_factory.mktemp("ray-curve")
    cfg = _cfg(classify_dict(demo_dir, tmp_path), tmp_path, "ray", "ray")
    result = run_job(validate(cfg), tmp_path / "c.yaml", show_progress=False)
    return train_losses(result.run_dir)


def test_one_node_two_processes_same_curve_as_ray(classify_cfg, tmp_path, ray_curve):
    result = run_job(validate(_cfg(classify_cfg, tmp_path, "tr", "torchrun")), tmp_path / "c.yaml", show_progress=False)
    assert train_losses(result.run_dir) == ray_curve and len(ray_curve) == 6
    run = result.run_dir
    for name in ("config.resolved.yaml", "metrics.jsonl", "summary.json", "report.md", "logs/main.log",
                 "logs/worker-0.log", "logs/worker-1.log", "final/model.safetensors", "checkpoints/step-12"):
        assert (run / name).exists(), name
    assert json.loads((run / "summary.json").read_text())["world_size"] == 2


def test_two_nodes_on_loopback_same_curve_as_ray(classify_cfg, tmp_path, ray_curve):
    port = free_port()
    procs = []
    for node in (0, 1):
        cfg = _cfg(classify_cfg, tmp_path, "two-nodes", "torchrun", nnodes=2, node_rank=node, master_port=port)
        cfg["comm"] = {"env": {"WANDB_API_KEY": "wandb-secret-value-42"}}
        # both "nodes" share this machine's cores: one thread each, as the Ray reference's two workers have
        # (by default each node would take all of its cores; another thread count rounds differently)
        cfg["scaling"]["resources_per_worker"] = {"CPU": 1}
        path = tmp_path / f"node{node}.yaml"
        path.write_text(yaml.safe_dump(cfg))
        procs.append(subprocess.Popen([sys.executable, "-m", "scaletrain", "train", str(path), "--no-progress"],
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    run = tmp_path / "runs" / "two-nodes"
    assert train_losses(run) == ray_curve
    log = (run / "logs" / "main.log").read_text()
    assert "[driver node 1] join" in log and (run / "logs" / "torchrun-node1.log").exists()
    assert "wandb-secret-value-42" not in (run / "launch.json").read_text()  # the spec the nodes share


def test_killed_process_restarts_from_checkpoint(classify_cfg, tmp_path, monkeypatch, ray_curve):
    monkeypatch.setenv("SCALETRAIN_FAULTS", "exit:1:6")  # rank 1 SIGKILLs itself at step 6, once
    cfg = _cfg(classify_cfg, tmp_path, "tr-kill", "torchrun")
    cfg["fault_tolerance"] = {"max_failures": 1}
    result = run_job(validate(cfg), tmp_path / "c.yaml", show_progress=False)
    log = (result.run_dir / "logs" / "main.log").read_text()
    assert "resume: from step-4: step 4" in log
    # the restart is said in main.log with the rank that died, first (its peer's error, if it reported one
    # before torchrun stopped it, follows)
    assert ("[torchrun node 0] failure: failure 1 (max_failures=1): [rank 1]: worker process died (killed by "
            "SIGKILL (exit code -9)) before reporting an error") in log
    assert "torchrun restarts the worker group from the newest checkpoint (1 of 1 restarts left)" in log
    assert result.summary["steps"] == 12
    # the restarted run recomputes steps 5..12 exactly: its last records match the uninterrupted curve
    assert train_losses(result.run_dir)[-4:] == ray_curve[-4:]


def test_bad_torchrun_settings(classify_cfg, tmp_path):
    from scaletrain.errors import ConfigError

    with pytest.raises(ConfigError, match=r"scaling.node_rank=2 is out of range for scaling.nnodes=2"):
        validate(_cfg(classify_cfg, tmp_path, "x", "torchrun", nnodes=2, node_rank=2, master_port=29500))
    with pytest.raises(ConfigError, match="scaling.master_port is required"):
        validate(_cfg(classify_cfg, tmp_path, "x", "torchrun", nnodes=2))


def test_capacity_is_checked_before_anything_is_spawned(classify_cfg, tmp_path):
    from scaletrain.errors import LaunchError

    cfg = _cfg(classify_cfg, tmp_path, "big", "torchrun")
    cfg["scaling"]["num_workers"] = 99
    cfg["data"]["train_file"] = str(tmp_path / "missing.jsonl")  # the second problem: the shortage is named first
    with pytest.raises(LaunchError, match=r"scaling.num_workers=99 .* puts 99 processes on this node, which has "
                                          r"\d+ CPUs"):
        launcher_for(validate(cfg))
    assert _ours_running() == [] and not (tmp_path / "runs").exists()


def _ours_running() -> list:
    """This test process's torchrun agents and workers still running (its descendants only: under make test's two
    pytest workers the other one runs torchrun jobs of its own)."""
    import psutil

    return [p for p in psutil.Process().children(recursive=True)
            if any("scaletrain.launch.torchrun_" in part for part in _cmdline(p))]


def _cmdline(p) -> list:
    import psutil

    try:
        return p.cmdline()
    except psutil.Error:  # it ended meanwhile
        return []


def test_bad_data_stops_the_early_agent_and_touches_nothing(classify_cfg, tmp_path):
    from scaletrain.errors import DataError

    cfg = _cfg(classify_cfg, tmp_path, "bad", "torchrun")
    cfg["data"]["train_file"] = str(tmp_path / "missing.jsonl")
    parsed = validate(cfg)
    launcher = launcher_for(parsed)  # as the CLI does: the agent starts before the data is read
    agent = launcher.agent
    assert agent.proc.poll() is None and agent.handoff.parent.is_dir()
    with pytest.raises(DataError, match="data.train_file=.*missing.jsonl: file not found"):
        run_job(parsed, tmp_path / "c.yaml", show_progress=False, launcher=launcher)
    assert agent.proc is None and not agent.handoff.parent.exists()
    assert not (tmp_path / "runs").exists() and _ours_running() == []
