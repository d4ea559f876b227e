"""Worker environment, the torchrun agent (command, handoff, output), failure grouping, `watch --once`."""

import io
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from scaletrain import cli
from scaletrain.comm import launch_env
from scaletrain.comm.ports import free_port
from scaletrain.config import validate
from scaletrain.envvars import worker_env
from scaletrain.errors import LaunchError
from scaletrain.launch import torchrun_launcher
from scaletrain.launch.failures import training_error
from scaletrain.launch.torchrun_launcher import TorchrunNode, failures_from_logs, read_spec, write_spec
from scaletrain.worker import faults as faults_module
from scaletrain.worker.faults import Fault, delay_s, maybe_fire, parse_faults
from scaletrain.worker.spec import JobSpec


def _cfg(**comm):
    return validate({"model": {"name_or_path": "builtin:tiny-bert"}, "data": {"train_file": "x"}, "comm": comm})


def test_worker_env_nccl_watchdog_profile_and_offline(monkeypatch):
    monkeypatch.delenv("NCCL_DEBUG", raising=False)
    env = launch_env.worker_env(_cfg(profile="debug", env={"NCCL_DEBUG": "WARN"}).comm, "rocm", "nccl", "/runs/x")
    assert env["HF_HUB_OFFLINE"] == "1" and env["NCCL_DEBUG"] == "WARN"  # comm.env beats the profile
    assert env["NCCL_DEBUG_SUBSYS"] == "INIT,COLL" and env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
    assert env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1" and env["TORCH_FR_DUMP_TEMP_FILE"].startswith("/runs/x/flight/")
    assert env["RAY_EXPERIMENTAL_NOSET_HIP_VISIBLE_DEVICES"] == "1"  # ROCm: keep HIP's view whole
    cpu = launch_env.worker_env(_cfg().comm, "cpu", "gloo", "/runs/x")
    assert "TORCH_NCCL_ASYNC_ERROR_HANDLING" not in cpu and "RAY_EXPERIMENTAL_NOSET_HIP_VISIBLE_DEVICES" not in cpu
    # glibc's fixed mmap threshold costs CPU workers a third of their speed: only where comm.env asks for it
    assert "MALLOC_MMAP_THRESHOLD_" not in cpu
    measured = launch_env.worker_env(_cfg(env={"MALLOC_MMAP_THRESHOLD_": 65536}).comm, "cpu", "gloo", "/runs/x")
    assert measured["MALLOC_MMAP_THRESHOLD_"] == "65536"


def test_shell_value_overridden_by_config_is_reported():
    with pytest.warns(UserWarning, match="NCCL_ALGO: comm.env sets 'Tree', your shell has 'Ring'; the config value "
                                         "wins"):
        env = worker_env({"NCCL_ALGO": "Tree"}, {"NCCL_ALGO": "Ring", "NCCL_DEBUG": "INFO", "HOME": "/root"})
    assert env["NCCL_ALGO"] == "Tree" and env["NCCL_DEBUG"] == "INFO" and "HOME" not in env


def test_spec_roundtrip_with_faults(tmp_path):
    spec = JobSpec(config={"a": 1}, run_dir=str(tmp_path), train_path="t", eval_path="e", pad_token_id=0,
                   vocab_size=10, backend="gloo", total_steps=5, learning_rate=0.1, faults=parse_faults("exit:1:3:2"))
    assert read_spec(write_spec(spec, tmp_path / "launch.json")) == spec
    assert spec.faults == (Fault("exit", 1, 3, 2),)


def test_slow_and_pause_lengthen_every_step_from_theirs_on_and_never_fire(tmp_path, monkeypatch):
    """``slow`` (a busy device) and ``pause`` (asleep: no CPU spent) add their milliseconds to each step of their
    rank from their step on; at their step nothing fires (no marker, no hang)."""
    faults = parse_faults("slow:1:3:250,pause:0:2:400")
    assert [delay_s(faults, 1, s) for s in (2, 3, 9)] == [0.0, 0.25, 0.25]
    assert [delay_s(faults, 0, s, "pause") for s in (1, 2, 9)] == [0.0, 0.4, 0.4]
    assert delay_s(faults, 0, 9) == 0.0 and delay_s(faults, 1, 9, "pause") == 0.0

    def no_hang(_s):
        raise AssertionError("a delay fault fired as a hang")

    monkeypatch.setattr(faults_module.time, "sleep", no_hang)
    assert maybe_fire(faults, str(tmp_path), 0, 2) is False and maybe_fire(faults, str(tmp_path), 1, 3) is False
    assert not (tmp_path / "faults").exists()


def test_a_resize_is_said_against_the_size_that_trained_last_not_only_the_checkpoints(tmp_path):
    """Elastic: 2 workers save step-10, the node is lost, 1 worker trains steps 11-13 (accumulation 2), then the
    node is back and 2 workers restore step-10 (saved by 2): a resize from 1 to 2 that trains 3 steps again, said;
    a restart on the size that trained last says nothing; without records the checkpoint's size counts."""
    from types import SimpleNamespace

    from scaletrain.checkpoint.manager import Restored
    from scaletrain.worker.resize import resize_note

    cfg = validate({"model": {"name_or_path": "builtin:tiny-llama"}, "data": {"train_file": "x"},
                    "train": {"per_device_train_batch_size": 2}, "scaling": {"num_workers": [1, 2]}})
    metrics = tmp_path / "metrics.jsonl"

    def note(world, records):
        metrics.write_text("".join(json.dumps({"kind": "train", "time": 0.0, **r}) + "\n" for r in records))
        t = SimpleNamespace(checkpointer=SimpleNamespace(restored=Restored(tmp_path / "step-10", 2, 1)),
                            ctx=SimpleNamespace(world_size=world, is_main=True), cfg=cfg,
                            run_dir=SimpleNamespace(metrics=metrics), progress=SimpleNamespace(step=10))
        return resize_note(t)

    two = [{"step": s, "scaling/workers": 2, "scaling/gradient_accumulation_steps": 1} for s in range(1, 11)]
    one = [{"step": s, "scaling/workers": 1, "scaling/gradient_accumulation_steps": 2} for s in (11, 12, 13)]
    grown = note(2, two + one)
    assert grown.startswith("from 1 to 2 worker(s) at step 10 (elastic: more workers fit): "
                            "gradient_accumulation_steps 2 -> 1, global batch 4; 3 step(s) trained again"), grown
    assert note(1, two + one) is None  # the 1-worker group restarted as it was: no resize
    assert note(1, []).startswith("from 2 to 1 worker(s)")  # nothing trained yet: the checkpoint's size


def test_torchrun_failures_are_grouped_across_ranks_and_worded_like_ray_ones(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    for r in (0, 1, 2):
        cause = "RuntimeError: boom" if r < 2 else "ValueError: bad batch"
        (logs / f"worker-{r}.log").write_text(
            f"2026-01-01 00:00:00,0 [rank {r}] ERROR scaletrain.worker: rank {r} failed at step 1 (phase data): "
            f"RuntimeError: earlier attempt\n"
            f"2026-01-01 00:00:09,0 [rank {r}] ERROR scaletrain.worker: rank {r} failed at step 3 (phase sync): "
            f"{cause}\n")
    failures = failures_from_logs(tmp_path, 1, logs / "torchrun-node0.log")
    assert failures.groups == [([0, 1], "RuntimeError: boom"), ([2], "ValueError: bad batch")]  # last failure
    error, hang = training_error(failures, tmp_path, 3, 10)
    assert str(error) == (f"training failed: [rank 0, 1]: RuntimeError: boom; [rank 2]: ValueError: bad batch; "
                          f"see {logs / 'worker-0.log'}, {logs / 'worker-1.log'}, {logs / 'worker-2.log'}") \
        and hang is None
    empty = tmp_path / "e"
    (empty / "logs").mkdir(parents=True)
    error, _ = training_error(failures_from_logs(empty, 1, empty / "logs" / "t.log"), empty, 2, 10)
    assert "torchrun exited with code 1 before any rank reported an error" in str(error)
    assert str(error).endswith(f"see {empty / 'logs' / 'main.log'}")  # no worker log: the file there is


def test_a_rank_the_agent_saw_die_is_named_first_with_its_signal(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "worker-0.log").write_text(  # the peer of the killed rank reports the broken connection
        "2026-01-01 00:00:09,0 [rank 0] ERROR scaletrain.worker: rank 0 failed at step 6 (phase sync): "
        "RuntimeError: Connection closed by peer\n")
    (logs / "worker-1.log").write_text("2026-01-01 00:00:01,0 [rank 1] INFO scaletrain.worker: step 5\n")
    (logs / "worker-2.log").write_text("")
    failures = failures_from_logs(tmp_path, 1, logs / "torchrun-node0.log", {1: -9, 2: 3})
    assert failures.groups == [([1], "worker process died (killed by SIGKILL (exit code -9)) before reporting an "
                                     "error"),
                               ([2], "worker process died (exit code 3) before reporting an error"),
                               ([0], "RuntimeError: Connection closed by peer")]
    # a rank that exited with an error code after reporting its error keeps its own words
    assert failures_from_logs(tmp_path, 1, logs / "t.log", {0: 1}).groups == [
        ([0], "RuntimeError: Connection closed by peer")]
    # without the agent's word the killed rank is not guessed at
    assert failures_from_logs(tmp_path, 1, logs / "t.log").groups == [([0], "RuntimeError: Connection closed by peer")]


def test_the_agent_says_the_first_failed_workers_exit_code_by_global_rank_a_killed_one_first(monkeypatch, capsys):
    from torch.distributed.elastic.agent.server.api import RunResult, WorkerState
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    from scaletrain.launch import torchrun_agent

    def failure(local_rank, code, timestamp):
        f = ProcessFailure(local_rank=local_rank, pid=10 + local_rank, exitcode=code, error_file="/nonexistent")
        f.timestamp = timestamp
        return f

    # found first (before torchrun stopped the others), same second as the one it stopped; then an earlier one
    failed = RunResult(state=WorkerState.FAILED, failures={3: failure(1, -9, 100), 2: failure(0, -15, 100)})
    earlier = RunResult(state=WorkerState.FAILED, failures={3: failure(1, -15, 101), 2: failure(0, 1, 100)})
    # a forked worker's stand-in reports its SIGKILL after its peer exited with the broken connection's error
    peer_first = RunResult(state=WorkerState.FAILED, failures={0: failure(0, 1, 100), 1: failure(1, -9, 101)})
    results = iter([RunResult(state=WorkerState.HEALTHY), failed, earlier, peer_first])
    monkeypatch.setattr(LocalElasticAgent, "_monitor_workers", lambda self, group: next(results))
    torchrun_agent._say_exits()
    assert LocalElasticAgent._monitor_workers(None, None).state == WorkerState.HEALTHY
    assert capsys.readouterr().err == ""  # a healthy poll says nothing
    assert LocalElasticAgent._monitor_workers(None, None) is failed  # torchrun still gets its result
    assert [torchrun_agent.parse_exit(line) for line in capsys.readouterr().err.splitlines()] == [(3, -9)]
    assert LocalElasticAgent._monitor_workers(None, None) is earlier
    assert [torchrun_agent.parse_exit(line) for line in capsys.readouterr().err.splitlines()] == [(2, 1)]
    assert LocalElasticAgent._monitor_workers(None, None) is peer_first
    assert [torchrun_agent.parse_exit(line) for line in capsys.readouterr().err.splitlines()] == [(1, -9)]
    assert torchrun_agent.describe_exit(-9) == "killed by SIGKILL (exit code -9)"
    assert torchrun_agent.describe_exit(-200) == "killed by signal 200 (exit code -200)"
    assert torchrun_agent.describe_exit(2) == "exit code 2"
    assert torchrun_agent.parse_exit("[default0]: rank 1 exited with code 9") is None


def test_watch_once(tmp_path, capsys):
    (tmp_path / "config.resolved.yaml").write_text("x: 1\n")
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "main.log").write_text("2026-01-01 00:00:00 [driver] start: 2 worker(s)\n")
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"kind": "train", "step": 4, "train/loss": 0.5}) + "\n"
                                            + json.dumps({"kind": "system", "rank": 1, "memory/rss_gib": 1.25}) + "\n")
    assert cli.main(["watch", str(tmp_path), "--once"]) == 0
    out = capsys.readouterr().out
    assert "[driver] start" in out and "latest train rank 0: step 4: train/loss=0.5" in out
    assert "latest system rank 1" in out and "memory/rss_gib=1.25" in out
    assert cli.main(["watch", str(tmp_path / "nope"), "--once"]) == 2


def _torchrun_cfg(**scaling):
    return validate({"model": {"name_or_path": "builtin:tiny-bert"}, "data": {"train_file": "x"},
                     "scaling": {"launcher": "torchrun", "num_workers": 2, **scaling},
                     "fault_tolerance": {"max_failures": 3}, "output": {"output_dir": "/runs", "run_name": "job"}})


def test_torchrun_command_ties_the_agent_to_the_driver_and_maps_settings(tmp_path):
    with TorchrunNode(_torchrun_cfg(master_port=None)) as node:
        cmd = node.command()
        handoff = node.handoff
        assert cmd[1:4] == ["-m", "scaletrain.launch.torchrun_agent", str(os.getpid())]
        assert "--nproc-per-node=2" in cmd and "--max-restarts=3" in cmd and "--rdzv-backend=c10d" in cmd
        assert f"--rdzv-endpoint=127.0.0.1:{node.port}" in cmd
        assert cmd[-3:] == ["-m", "scaletrain.launch.torchrun_entry", str(handoff)]
        assert handoff.parent.is_dir() and oct(handoff.parent.stat().st_mode & 0o777) == "0o700"
    assert not handoff.parent.exists()  # the handoff directory goes with the agent


def test_torchrun_env_keeps_the_shells_thread_count(monkeypatch):
    node = TorchrunNode(_torchrun_cfg(resources_per_worker={"CPU": 2}))
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert node.env()["OMP_NUM_THREADS"] == "2" and node.env()["HF_HUB_OFFLINE"] == "1"
    monkeypatch.setenv("OMP_NUM_THREADS", "7")
    assert node.env()["OMP_NUM_THREADS"] == "7"
    node.close()


def test_the_local_loop_keeps_the_shells_thread_count_as_torchrun_does(monkeypatch):
    """One worker trained in the command's own process gets torchrun's threads: the shell's or comm.env's
    OMP_NUM_THREADS where set (the same float sums under either launcher), else the worker's CPUs."""
    from scaletrain.launch.local import _thread_count
    from scaletrain.launch.plan import ClusterPlan

    plan = ClusterPlan(False, "gloo", {"CPU": 2})
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert _thread_count({}, plan) == 2
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert _thread_count({}, plan) == 1
    assert _thread_count({"OMP_NUM_THREADS": "3"}, plan) == 3  # comm.env's over the shell's
    monkeypatch.setenv("OMP_NUM_THREADS", "x")
    assert _thread_count({}, plan) == 2


def test_node_zero_over_several_nodes_uses_the_shared_run_dir_and_checks_the_port():
    cfg = _torchrun_cfg(nnodes=2, num_workers=2, master_port=free_port())
    node = torchrun_launcher.node_zero(cfg)
    assert node.proc is None  # started once the spec is in the shared run directory
    assert node.handoff == Path("/runs/job/launch.json") and node.rdzv_id == "job"
    node.close()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        port = busy.getsockname()[1]
        with pytest.raises(LaunchError, match=f"scaling.master_port={port} is in use on 127.0.0.1"):
            torchrun_launcher.node_zero(_torchrun_cfg(nnodes=2, num_workers=2, master_port=port))
    assert torchrun_launcher.node_zero(validate({"model": {"name_or_path": "builtin:tiny-bert"},
                                                 "data": {"train_file": "x"}})) is None


def test_output_is_held_until_the_run_directory_exists(tmp_path):
    pump = torchrun_launcher._Pump()
    pump.follow(io.BufferedReader(io.BytesIO(b"agent started\nworker 0 imported\n")))
    pump.drain()
    log = tmp_path / "torchrun-node0.log"
    log.write_bytes(b"earlier attempt\n")
    pump.attach(log)
    pump.close()
    assert log.read_text() == "earlier attempt\nagent started\nworker 0 imported\n"  # appended, never replaced


def test_worker_gives_up_when_its_agent_is_gone(tmp_path, monkeypatch):
    parents = iter([100, 100, 1])
    monkeypatch.setattr(torchrun_launcher.os, "getppid", lambda: next(parents))
    with pytest.raises(SystemExit, match="torchrun agent 100 exited before the job spec appeared"):
        torchrun_launcher.wait_for_handoff(tmp_path / "launch.json", poll_s=0)


def test_worker_reads_the_spec_once_it_appears(tmp_path):
    spec = JobSpec(config={"a": 1}, run_dir=str(tmp_path), train_path="t", eval_path="e", pad_token_id=0,
                   vocab_size=10, backend="gloo", total_steps=5, learning_rate=0.1)
    assert torchrun_launcher.wait_for_handoff(write_spec(spec, tmp_path / "launch.json")) == spec


@pytest.mark.loop
def test_agent_refuses_to_start_when_its_driver_already_died():
    # Its parent (this test) is not the driver it names (pid 1): it exits 1 before torchrun parses --help.
    agent = subprocess.run([sys.executable, "-m", "scaletrain.launch.torchrun_agent", "1", "--help"],
                           capture_output=True, text=True, timeout=60)
    assert agent.returncode == 1 and "usage" not in agent.stdout


def test_the_lean_trainer_leaves_out_the_helper_actors_scaletrain_does_not_use():
    """Ray Train's default callbacks start a Ray Datasets manager and a placement-group cleaner (a process each):
    no Ray Dataset is passed, and an embedded Ray dies with its driver, so neither does anything here."""
    from ray.train.torch import TorchTrainer
    from ray.train.v2._internal.callbacks import DatasetsCallback
    from ray.train.v2._internal.callbacks.placement_group_callback import PlacementGroupCleanerCallback

    from scaletrain.launch.ray_launcher import _lean_trainer

    assert callable(TorchTrainer._create_default_callbacks)  # the method the subclass overrides is still Ray's

    datasets_cb, cleaner, other = object.__new__(DatasetsCallback), object.__new__(PlacementGroupCleanerCallback), 1

    class Trainer:  # the two things of DataParallelTrainer the subclass touches
        def __init__(self, datasets=None):
            self.datasets = datasets

        def _create_default_callbacks(self):
            return [other, datasets_cb, cleaner]

    assert _lean_trainer(Trainer, embedded=True)()._create_default_callbacks() == [other]
    assert _lean_trainer(Trainer, embedded=False)()._create_default_callbacks() == [other, cleaner]  # a cluster
    assert _lean_trainer(Trainer, embedded=True)({"train": 0})._create_default_callbacks() == [other, datasets_cb,
                                                                                               cleaner]


def _fake_trainer(config, seen: dict):
    """DataParallelTrainer's hooks the lean subclass touches; the controller's arguments land in ``seen``."""
    class Trainer:
        datasets = None
        scaling_config = config

        def _create_default_callbacks(self):
            return []

        def _initialize_and_run_controller(self, **kwargs):
            seen.update(kwargs)
            return "result"

    return Trainer


def test_an_elastic_run_with_context_parallelism_resizes_by_whole_groups():
    """Ray's elastic policy picks any count the free resources allow; with CP 2, 3 free CPUs must give 2 workers (a
    3-rank group cannot form the data x context mesh), 5 give 4, and the range's top caps it."""
    from ray.train import ScalingConfig
    from ray.train.v2._internal.execution.scaling_policy.elastic import ElasticScalingPolicy

    from scaletrain.launch.ray_launcher import _lean_trainer
    from scaletrain.launch.ray_policy import WholeGroupsPolicy

    config = ScalingConfig(num_workers=(2, 6), resources_per_worker={"CPU": 1})
    policy = WholeGroupsPolicy(config, 2)
    plain = ElasticScalingPolicy(config)
    for free, whole in (({"a": {"CPU": 3.0}}, 2), ({"a": {"CPU": 2.0}, "b": {"CPU": 3.0}}, 4),
                        ({"a": {"CPU": 9.0}}, 6), ({"a": {"CPU": 1.0}}, 0)):
        assert policy._count_possible_workers(free) == whole
    assert plain._count_possible_workers({"a": {"CPU": 3.0}}) == 3  # what Ray alone would start

    seen = {}
    Trainer = _fake_trainer(config, seen)
    assert _lean_trainer(Trainer, embedded=True, group=2)()._initialize_and_run_controller(
        scaling_policy=plain, failure_policy="f") == "result"
    assert isinstance(seen["scaling_policy"], WholeGroupsPolicy) and seen["scaling_policy"].group == 2
    assert seen["failure_policy"] == "f"
    _lean_trainer(Trainer, embedded=True, elastic=True)()._initialize_and_run_controller(scaling_policy=plain)
    assert seen["scaling_policy"] is plain  # no CP: Ray's own policy


def test_a_fixed_run_on_the_local_ray_starts_no_autoscaling_coordinator():
    """Ray Train's fixed policy starts an autoscaling-coordinator actor (a process waking 100 times a second) to
    forward resource requests to an autoscaler; the local Ray scaletrain starts has none, so it is left out there,
    and kept on a cluster (which may autoscale)."""
    from ray.train import ScalingConfig
    from ray.train.v2._internal.execution.scaling_policy.fixed import FixedScalingPolicy

    from scaletrain.launch.ray_launcher import _lean_trainer
    from scaletrain.launch.ray_policy import LocalFixedPolicy

    config = ScalingConfig(num_workers=2, resources_per_worker={"CPU": 1})
    seen = {}
    Trainer = _fake_trainer(config, seen)
    plain = FixedScalingPolicy(config)
    _lean_trainer(Trainer, embedded=True)()._initialize_and_run_controller(scaling_policy=plain)
    local = seen["scaling_policy"]
    assert isinstance(local, LocalFixedPolicy)
    local.after_controller_start(None)  # Ray's would make the coordinator's client (and so its actor) here
    assert local._coordinator_client is None
    assert local.make_decision_for_non_running_worker_group().num_workers == 2  # sizes as Ray's does
    local.make_decision_for_running_worker_group(None, None)
    _lean_trainer(Trainer, embedded=False)()._initialize_and_run_controller(scaling_policy=plain)
    assert seen["scaling_policy"] is plain  # a cluster keeps Ray's policy
