"""Job submission without a cluster: the Slurm script and the KubeRay manifest scaletrain writes, and the bad
inputs (no dashboard at the address, no job id, an --out that exists) as one line each."""

import os
import subprocess

import pytest
import yaml

from tests.cli import run_cli
from tests.conftest import write_config


def _cli(*args, cwd=None):
    return run_cli(*args, cwd=cwd, env={k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"})


@pytest.fixture
def gpu_cfg(classify_cfg, tmp_path):
    classify_cfg["scaling"] = {"num_workers": 16, "resources_per_worker": {"CPU": 4, "GPU": 1}}
    return write_config(tmp_path / "c.yaml", classify_cfg)


def test_emit_slurm_is_a_valid_script_for_the_nodes_the_config_needs(gpu_cfg, tmp_path):
    out = tmp_path / "job.sbatch"
    proc = _cli("submit", gpu_cfg, "train.max_steps=5", "--emit", "slurm", "--out", out)
    assert proc.returncode == 0, proc.stderr
    text = out.read_text()
    assert subprocess.run(["bash", "-n", str(out)]).returncode == 0  # bash parses it
    assert "#SBATCH --nodes=2" in text and "#SBATCH --gpus-per-node=8" in text
    assert "ray start --head" in text and 'ray start --address="$head_ip:$port"' in text
    assert "trap stop_ray EXIT" in text  # Ray is stopped however the job ends
    assert f'scaletrain train {gpu_cfg} train.max_steps=5 --no-progress scaling.address="$head_ip:$port"' in text
    # Ray's token authentication on every node and for the driver: one token file on shared storage, made when
    # missing (owner-only), never printed
    assert "export RAY_AUTH_MODE=token" in text
    setup = text[text.index("export RAY_AUTH_MODE=token"):text.index("\nfi\n") + 4]
    home = tmp_path / "home"
    shown = subprocess.run(["bash", "-euc", setup + 'echo "$RAY_AUTH_TOKEN_PATH"'], capture_output=True, text=True,
                           env={"HOME": str(home), "PATH": os.environ["PATH"]})
    token_file = home / ".ray" / "auth_token"
    assert shown.returncode == 0 and shown.stdout.strip() == str(token_file), shown.stderr
    assert len(token_file.read_text().strip()) == 64 and token_file.stat().st_mode & 0o077 == 0
    assert token_file.read_text().strip() not in shown.stdout + shown.stderr
    again = _cli("submit", gpu_cfg, "--emit", "slurm", "--out", out)
    assert again.returncode != 0 and "exists; nothing overwritten" in again.stderr and out.read_text() == text


def test_emit_kuberay_is_a_rayjob_with_the_config_in_a_configmap(gpu_cfg, tmp_path):
    proc = _cli("submit", gpu_cfg, "--emit", "kuberay", "--gpu-vendor", "amd", "--image", "example/scaletrain:1")
    assert proc.returncode == 0, proc.stderr
    config_map, job = list(yaml.safe_load_all(proc.stdout))
    assert config_map["kind"] == "ConfigMap" and yaml.safe_load(config_map["data"]["config.yaml"]) == \
        yaml.safe_load(gpu_cfg.read_text())
    assert job["apiVersion"] == "ray.io/v1" and job["kind"] == "RayJob"
    spec = job["spec"]
    assert spec["entrypoint"] == "scaletrain train /scaletrain/config.yaml --no-progress"
    assert spec["shutdownAfterJobFinishes"] is True
    head = spec["rayClusterSpec"]["headGroupSpec"]
    assert head["rayStartParams"]["dashboard-host"] == "0.0.0.0"
    assert head["template"]["spec"]["containers"][0]["image"] == "example/scaletrain:1"
    workers = spec["rayClusterSpec"]["workerGroupSpecs"][0]
    assert workers["replicas"] == workers["minReplicas"] == workers["maxReplicas"] == 2
    container = workers["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["amd.com/gpu"] == "8"
    assert container["volumeMounts"][0]["mountPath"] == "/scaletrain"
    assert workers["template"]["spec"]["volumes"][0]["configMap"]["name"] == config_map["metadata"]["name"]
    # token authentication: KubeRay sets RAY_AUTH_MODE/RAY_AUTH_TOKEN from the named Secret in every container
    secret = f"{job['metadata']['name']}-ray-token"
    assert spec["rayClusterSpec"]["authOptions"] == {"mode": "token", "secretName": secret}
    assert spec["rayClusterSpec"]["rayVersion"] >= "2.52"
    assert f"kubectl create secret generic {secret}" in proc.stdout and "auth_token=" in proc.stdout


def test_submit_to_an_address_without_a_dashboard_fails_in_seconds(gpu_cfg):
    proc = _cli("submit", gpu_cfg, "--address", "http://127.0.0.1:9", cwd=gpu_cfg.parent)
    assert proc.returncode != 0
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "no Ray dashboard answers there within 3 s" in lines[0]
    assert "ray start --head --dashboard-host 0.0.0.0" in lines[0] and "Traceback" not in proc.stderr
    for args in (["jobs", "status", "--address", "http://127.0.0.1:9"], ["jobs", "list"]):
        proc = _cli(*args)
        assert proc.returncode != 0 and proc.stderr.startswith("error:") and "Traceback" not in proc.stderr


def test_up_leaves_a_ray_it_did_not_start_alone(tmp_path, monkeypatch):
    import socket

    from scaletrain.errors import LaunchError
    from scaletrain.launch.warm import cluster as local_cluster

    with socket.socket() as s:  # "a Ray" answering at an address scaletrain did not record
        s.bind(("127.0.0.1", 0))
        s.listen()
        address = f"127.0.0.1:{s.getsockname()[1]}"
        current = tmp_path / "ray_current_cluster"
        current.write_text(address)
        monkeypatch.setattr(local_cluster, "RAY_CURRENT_CLUSTER", current)
        monkeypatch.setattr(local_cluster, "state_file", lambda: tmp_path / "state.json")
        with pytest.raises(LaunchError, match=rf"a Ray instance that scaletrain did not start is running at "
                                              rf"{address}; not starting a second one"):
            local_cluster.up(2, None)
    assert local_cluster.down() is None  # nothing recorded: nothing stopped
    assert current.exists()


class _AgentLate:
    """A Job API whose head's job agent is not up for the first ``late`` submissions (or never: -1)."""

    def __init__(self, late: int):
        self.late, self.tries = late, 0

    def submit_job(self, **kw):
        self.tries += 1
        if self.late < 0 or self.tries <= self.late:
            raise RuntimeError("Request failed with status code 500: No available agent to submit job, please try "
                               "again later..")
        return "raysubmit_1"


def test_submit_waits_for_a_late_job_agent_then_names_its_port(tmp_path, monkeypatch):
    from scaletrain.errors import LaunchError
    from scaletrain.launch import submit

    (tmp_path / "c.yaml").write_text("{model: {name_or_path: 'builtin:tiny-bert'}, data: {train_file: d.jsonl}}")
    (tmp_path / "d.jsonl").write_text("{}\n")
    monkeypatch.chdir(tmp_path)  # (the config's files are checked first: job_files.py)
    monkeypatch.setattr(submit.time, "sleep", lambda s: None)
    late = _AgentLate(2)
    monkeypatch.setattr(submit, "client", lambda address: late)
    assert submit.submit("127.0.0.1:8265", tmp_path / "c.yaml", [], tmp_path) == "raysubmit_1" and late.tries == 3

    monkeypatch.setattr(submit, "client", lambda address: _AgentLate(-1))
    monkeypatch.setattr(submit, "AGENT_WAIT_S", 0.0)
    with pytest.raises(LaunchError, match=r"no job agent after 0 s .*--dashboard-agent-listen-port"):
        submit.submit("127.0.0.1:8265", tmp_path / "c.yaml", [], tmp_path)
