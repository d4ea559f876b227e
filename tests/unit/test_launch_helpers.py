"""Worker environment, torchrun spec files and log-based failure grouping, `watch --once`."""

import json

import pytest

from scaletrain import cli
from scaletrain.comm.env import worker_env
from scaletrain.config import validate
from scaletrain.launch.ray_launcher import worker_env_for
from scaletrain.launch.torchrun_launcher import failure_from_logs, read_spec, write_spec
from scaletrain.worker.faults import Fault, parse_faults
from scaletrain.worker.spec import JobSpec


def _cfg(**comm):
    return validate({"model": {"name_or_path": "builtin:tiny-bert"}, "data": {"train_file": "x"}, "comm": comm})


def test_worker_env_nccl_watchdog_profile_and_offline(monkeypatch):
    monkeypatch.delenv("NCCL_DEBUG", raising=False)
    env = worker_env_for(_cfg(profile="debug", env={"NCCL_DEBUG": "WARN"}), "rocm", "nccl", "/runs/x")
    assert env["HF_HUB_OFFLINE"] == "1" and env["NCCL_DEBUG"] == "WARN"  # comm.env beats the profile
    assert env["NCCL_DEBUG_SUBSYS"] == "INIT,COLL" and env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
    assert env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1" and env["TORCH_FR_DUMP_TEMP_FILE"].startswith("/runs/x/flight/")
    assert env["RAY_EXPERIMENTAL_NOSET_HIP_VISIBLE_DEVICES"] == "1"  # ROCm: keep HIP's view whole
    cpu = worker_env_for(_cfg(), "cpu", "gloo", "/runs/x")
    assert "TORCH_NCCL_ASYNC_ERROR_HANDLING" not in cpu and "RAY_EXPERIMENTAL_NOSET_HIP_VISIBLE_DEVICES" not in cpu


def test_shell_value_overridden_by_config_is_reported():
    with pytest.warns(UserWarning, match="NCCL_ALGO: comm.env sets 'Tree', your shell has 'Ring'; the config value wins"):
        env = worker_env({"NCCL_ALGO": "Tree"}, {"NCCL_ALGO": "Ring", "NCCL_DEBUG": "INFO", "HOME": "/root"})
    assert env["NCCL_ALGO"] == "Tree" and env["NCCL_DEBUG"] == "INFO" and "HOME" not in env


def test_spec_roundtrip_with_faults(tmp_path):
    spec = JobSpec(config={"a": 1}, run_dir=str(tmp_path), train_path="t", eval_path="e", pad_token_id=0,
                   vocab_size=10, backend="gloo", total_steps=5, learning_rate=0.1, faults=parse_faults("exit:1:3:2"))
    assert read_spec(write_spec(spec, tmp_path)) == spec
    assert spec.faults == (Fault("exit", 1, 3, 2),)


def test_failure_from_logs_groups_ranks(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    for r in (0, 1):
        (logs / f"worker-{r}.log").write_text(
            f"2026-01-01 00:00:00,0 [rank {r}] ERROR scaletrain.worker: rank {r} failed at step 3 (phase sync): "
            f"RuntimeError: boom\n")
    err = failure_from_logs(tmp_path, 2, 10, 1, logs / "torchrun-node0.log")
    assert "[rank 0, 1]: RuntimeError: boom" in str(err)
    empty = tmp_path / "e"
    (empty / "logs").mkdir(parents=True)
    assert "torchrun exited with code 1" in str(failure_from_logs(empty, 2, 10, 1, empty / "logs" / "t.log"))


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
