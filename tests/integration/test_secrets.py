"""Secrets never reach Ray's logs or dashboard, the run directory, or what the driver prints: a shell HF_TOKEN
and comm.env credentials (by name and by shape), on every launcher and for a failing run."""

import hashlib
import json
import os
from pathlib import Path

import pytest

from scaletrain import cli
from tests.conftest import write_config

pytestmark = pytest.mark.ray

SHELL = {"HF_TOKEN": "hf_ShellTokenAbcdefghijklmnop", "MY_SERVICE_API_KEY": "svc-key-9876543210fedcba"}
COMM_ENV = {
    "WANDB_API_KEY": "wandb-key-0123456789abcdef",  # secret by name
    "MLFLOW_TRACKING_TOKEN": "mlflow-tok-0123456789abcd",  # by name
    "AUTH_HEADER": "Bearer sk-live-0123456789abcdefXYZ",  # by shape only: AUTH_HEADER is no secret name
    "NCCL_DEBUG": "WARN",  # not a secret: still travels in Ray's runtime_env
}
SECRET_VALUES = [*SHELL.values(), *(v for k, v in COMM_ENV.items() if k != "NCCL_DEBUG"),
                 "sk-live-0123456789abcdefXYZ"]


def _hits(paths, values=SECRET_VALUES) -> list[str]:
    found = []
    for path in paths:
        for p in ([path] if Path(path).is_file() else Path(path).rglob("*")):
            if p.is_file():
                data = p.read_bytes()
                found += [f"{v} in {p}" for v in values if v.encode() in data]
    return found


def _session_dir(ray_local) -> Path:
    return Path(ray_local._private.worker.global_worker.node.get_session_dir_path())


def _config(classify_cfg, tmp_path, name, **scaling):
    cfg = json.loads(json.dumps(classify_cfg))
    cfg["train"].update(max_steps=4, logging_steps=2)
    cfg["scaling"] = {"num_workers": 2, **scaling}
    cfg["comm"] = {"env": dict(COMM_ENV)}
    cfg["output"] = {"output_dir": str(tmp_path / "runs"), "run_name": name}
    return write_config(tmp_path / f"{name}.yaml", cfg)


@pytest.mark.parametrize("launcher", ["ray", "torchrun", "local"])
def test_no_secret_in_ray_logs_run_directory_or_output(classify_cfg, tmp_path, monkeypatch, capfd, ray_local,
                                                       no_orphans, launcher):
    for k, v in SHELL.items():
        monkeypatch.setenv(k, v)
    one = launcher == "local"  # the loop in this process: 1 worker
    path = _config(classify_cfg, tmp_path, launcher, launcher=launcher, **({"num_workers": 1} if one else {}))
    assert cli.main(["train", str(path), "--no-progress"]) == 0
    out = capfd.readouterr()
    run_dir = tmp_path / "runs" / launcher
    assert (run_dir / "summary.json").is_file() and not (run_dir / ".private-env.json").exists()
    assert _hits([run_dir]) == []
    assert _hits([_session_dir(ray_local)]) == []
    assert [v for v in SECRET_VALUES if v in out.out + out.err] == []
    resolved = (run_dir / "config.resolved.yaml").read_text()
    assert "AUTH_HEADER: '***'" in resolved and "WANDB_API_KEY: '***'" in resolved
    assert "NCCL_DEBUG: WARN" in resolved
    worker_log = (run_dir / "logs" / f"worker-{0 if one else 1}.log").read_text()
    assert "'AUTH_HEADER': '***'" in worker_log  # the comm.env line, masked (by shape: no secret name)
    assert "'WANDB_API_KEY': '***'" in worker_log  # (by name)
    # the run directory is the user's and their group's only: 0750, no file anyone may read. Ray's own bookkeeping
    # (ray/) follows the umask of the Ray instance, which this shared test instance got before scaletrain ran; it
    # still sits inside the 0750 run directory.
    assert run_dir.stat().st_mode & 0o777 == 0o750
    files = [p for p in run_dir.rglob("*") if p.is_file() and "ray" not in p.relative_to(run_dir).parts]
    assert len(files) > 10 and [str(p) for p in files if p.stat().st_mode & 0o007] == []


def test_a_failing_run_leaks_nothing_either(classify_cfg, tmp_path, monkeypatch, capfd, ray_local, no_orphans):
    for k, v in SHELL.items():
        monkeypatch.setenv(k, v)
    # a failure makes Ray write more of its own (worker .err files, the controller's error): still nothing
    monkeypatch.setenv("SCALETRAIN_FAULTS", "raise:1:2")
    path = _config(classify_cfg, tmp_path, "failing")
    assert cli.main(["train", str(path), "--no-progress"]) == 1
    out = capfd.readouterr()
    assert "training failed" in out.err
    assert _hits([tmp_path / "runs" / "failing"]) == []
    assert _hits([_session_dir(ray_local)]) == []
    assert [v for v in SECRET_VALUES if v in out.out + out.err] == []
    assert not (tmp_path / "runs" / "failing" / ".private-env.json").exists()


def _report_env(config: dict) -> None:
    """A Ray worker entry: which of the expected variables it has (hashes only, so nothing secret is written)."""
    import ray.train

    got = {k: hashlib.sha256(os.environ.get(k, "").encode()).hexdigest() for k in config["names"]}
    if ray.train.get_context().get_world_rank() == 0:
        Path(config["out"]).write_text(json.dumps(got))


def test_secret_variables_reach_every_worker_without_runtime_env(tmp_path, ray_local, no_orphans):
    from scaletrain.config.schema import CommConfig, ScalingConfig
    from scaletrain.launch import ray_launcher
    from scaletrain.launch.plan import plan_scaling

    scaling = ScalingConfig(num_workers=2)
    plan = plan_scaling(scaling, CommConfig(backend="gloo"), ray_launcher.cluster_resources(), "cpu")
    out = tmp_path / "env.json"
    env = {**COMM_ENV, **SHELL}
    ray_launcher.run_on_workers(_report_env, {"names": list(env), "out": str(out)}, scaling, plan, env,
                                str(tmp_path), 60)
    assert json.loads(out.read_text()) == {k: hashlib.sha256(v.encode()).hexdigest() for k, v in env.items()}
    assert not (tmp_path / ".private-env.json").exists()
    assert _hits([_session_dir(ray_local)], [SHELL["HF_TOKEN"], COMM_ENV["AUTH_HEADER"]]) == []
