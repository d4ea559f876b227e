"""A job on a team's Ray cluster: submitted through Ray's Job Submission API (``JobSubmissionClient``), or written
out for the scheduler that starts the cluster: an ``sbatch`` script (Slurm) or a KubeRay ``RayJob`` manifest.

The submitted job runs ``scaletrain train`` on the cluster, with this directory as its ``working_dir`` (Ray
uploads it; files Ray should not upload are excluded), so the config and data travel with it unless they are
given as paths on shared storage: every local file the config names is checked first (job_files.py), and one that
only a .gitignore leaves out is uploaded all the same. It writes the same run directory, on the cluster's storage.
"""

from __future__ import annotations

import http.client
import math
import shlex
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import yaml

from scaletrain.config.schema import Config
from scaletrain.errors import LaunchError
from scaletrain.launch.warm.cluster import DASHBOARD_PORT

PROBE_TIMEOUT_S = 3.0
AGENT_WAIT_S = 60.0  # how long a head's job agent may take to answer after its dashboard does
AGENT_PORT = 52365  # Ray's default --dashboard-agent-listen-port
EXCLUDES = [".venv", ".git", "runs", "**/__pycache__", "*.safetensors", "*.pt", "*.bin", ".cache"]
DEFAULT_IMAGE = "rayproject/ray:2.60.0-py311"


def _http_address(address: str) -> str:
    return address if "://" in address else f"http://{address}"


def probe_dashboard(address: str, timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """Fail in seconds when no Ray dashboard answers at ``address`` (the Job API lives there)."""
    url = _http_address(address).rstrip("/") + "/api/version"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:
            r.read(256)
    except urllib.error.HTTPError:
        return  # it answered (401: a token-authenticated cluster: cluster_auth.authenticate asks it)
    except http.client.HTTPException:
        return  # something answers, not in HTTP/1 (the GCS port?): cluster_auth.authenticate says what it is
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", e)
        raise LaunchError(f"--address {address}: no Ray dashboard answers there within {timeout_s:.0f} s ({reason}); "
                          f"start a head with its dashboard: ray start --head --dashboard-host 0.0.0.0 (port "
                          f"{DASHBOARD_PORT}), or scaletrain up on this machine") from None


def client(address: str):
    probe_dashboard(address)
    from scaletrain.console import console
    from scaletrain.launch.cluster_auth import ask_dashboard, authenticate
    from scaletrain.launch.warm.cluster import require_dashboard

    url = _http_address(address)
    if note := authenticate(f"--address {address}", lambda token: ask_dashboard(url, token), "dashboard"):
        console.print(f"[yellow]note:[/] {note}", soft_wrap=True)
    require_dashboard()
    from ray.job_submission import JobSubmissionClient

    try:
        return JobSubmissionClient(_http_address(address))
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise LaunchError(f"--address {address}: the Job API refused the connection ({str(e).splitlines()[0]})") \
            from None


def entrypoint(config: str, overrides: list[str]) -> str:
    return " ".join(["scaletrain", "train", shlex.quote(config), *map(shlex.quote, overrides), "--no-progress"])


def submit(address: str, config: Path, overrides: list[str], working_dir: Path) -> str:
    """The job id of ``scaletrain train CONFIG overrides`` submitted to ``address``."""
    config = config.resolve()
    working_dir = working_dir.resolve()
    try:
        rel = str(config.relative_to(working_dir))
    except ValueError:
        raise LaunchError(f"{config}: the config must be inside the working directory {working_dir} (it is "
                          f"uploaded with it); run submit from the project folder or copy the config there") \
            from None
    from scaletrain import envvars
    from scaletrain.config import load_config
    from scaletrain.console import console
    from scaletrain.launch.job_files import plan_upload, working_dir_env

    # before anything is sent: the config's local files as written (the job reads them in its working directory)
    upload = plan_upload(load_config(config, overrides, absolute=False), working_dir, EXCLUDES)
    for note in upload.notes:
        console.print(f"[yellow]note:[/] {note}", soft_wrap=True)
    c = client(address)
    runtime_env = {"working_dir": str(working_dir), "excludes": upload.excludes}
    deadline = time.monotonic() + AGENT_WAIT_S
    while True:
        try:
            with envvars.applied(working_dir_env(upload)):  # Ray packages the working directory in this call
                return c.submit_job(entrypoint=entrypoint(rel, overrides), runtime_env=runtime_env,
                                    metadata={"scaletrain_config": rel})
        except RuntimeError as e:
            # The head's job agent answers some seconds after its dashboard does (a head just started).
            if "No available agent" not in str(e):
                raise
            if time.monotonic() > deadline:
                raise LaunchError(
                    f"--address {address}: the head has no job agent after {AGENT_WAIT_S:.0f} s (Ray's dashboard "
                    f"agent did not start; dashboard_agent.log in the head's session logs says why: often another "
                    f"Ray on that node holds its port {AGENT_PORT}: start the head with "
                    f"--dashboard-agent-listen-port=<a free port>)") from None
            time.sleep(2.0)


def _known(c, job_id: str) -> None:
    try:
        c.get_job_status(job_id)
    except RuntimeError as e:
        if "does not exist" in str(e) or "404" in str(e):
            raise LaunchError(f"job {job_id} does not exist on this cluster; scaletrain jobs list shows the jobs "
                              f"it has") from None
        raise


def status(address: str, job_id: str) -> str:
    c = client(address)
    _known(c, job_id)
    return str(c.get_job_status(job_id).value)


def logs(address: str, job_id: str) -> str:
    c = client(address)
    _known(c, job_id)
    return c.get_job_logs(job_id)


async def follow(address: str, job_id: str, write) -> None:
    c = client(address)
    _known(c, job_id)
    async for lines in c.tail_job_logs(job_id):
        write(lines)


def stop(address: str, job_id: str) -> bool:
    c = client(address)
    _known(c, job_id)
    return bool(c.stop_job(job_id))


def list_jobs(address: str) -> list[dict]:
    c = client(address)
    return [{"job_id": j.submission_id or j.job_id, "status": str(j.status.value), "entrypoint": j.entrypoint,
             "start_time": j.start_time} for j in c.list_jobs()]


@dataclass(frozen=True)
class Shape:
    """How many nodes and what each gives: from the config's workers and resources."""

    nodes: int
    gpus_per_node: int
    cpus_per_node: int


def shape(cfg: Config, gpus_per_node: int, cpus_per_node: int | None) -> Shape:
    s = cfg.scaling
    per = s.resources_per_worker or {}
    use_gpu = s.use_gpu is not False
    if use_gpu:
        gpus_per_worker = max(1, int(per.get("GPU", 1)))
        workers_per_node = max(1, gpus_per_node // gpus_per_worker)
        nodes = math.ceil(s.num_workers / workers_per_node)
        cpus = cpus_per_node or workers_per_node * max(1, int(per.get("CPU", 8))) + 2
        return Shape(nodes, gpus_per_node, cpus)
    cpus = cpus_per_node or max(2, int(per.get("CPU", 1)) * s.num_workers + 1)
    return Shape(1, 0, cpus)


def slurm_script(cfg: Config, config: str, overrides: list[str], sh: Shape, job_name: str) -> str:
    """An sbatch script: a Ray head on the first node, workers on the rest, wait for all, train, stop Ray."""
    gpu_line = f"#SBATCH --gpus-per-node={sh.gpus_per_node}\n" if sh.gpus_per_node else ""
    gpus = f" --num-gpus={sh.gpus_per_node}" if sh.gpus_per_node else ""
    train = entrypoint(config, overrides) + ' scaling.address="$head_ip:$port"'  # expanded by the shell
    return f"""#!/bin/bash
# Written by `scaletrain submit --emit slurm`: {cfg.scaling.num_workers} worker(s) on {sh.nodes} node(s).
#SBATCH --job-name={job_name}
#SBATCH --nodes={sh.nodes}
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task={sh.cpus_per_node}
{gpu_line}#SBATCH --exclusive
set -euo pipefail

nodes=($(scontrol show hostnames "$SLURM_JOB_NODELIST"))
head=${{nodes[0]}}
head_ip=$(srun --nodes=1 --ntasks=1 -w "$head" hostname --ip-address | awk '{{print $1}}')
port=6379
stop_ray() {{ srun --nodes={sh.nodes} --ntasks={sh.nodes} ray stop --force >/dev/null 2>&1 || true; }}
trap stop_ray EXIT

# Ray's token authentication: every node, and the driver below, read the token from one file on storage all nodes
# share ($HOME on most clusters; else set RAY_AUTH_TOKEN_PATH to such a file before sbatch). srun passes both
# variables on; the token itself is never printed.
export RAY_AUTH_MODE=token
export RAY_AUTH_TOKEN_PATH="${{RAY_AUTH_TOKEN_PATH:-$HOME/.ray/auth_token}}"
if [ ! -s "$RAY_AUTH_TOKEN_PATH" ]; then
    mkdir -p "$(dirname "$RAY_AUTH_TOKEN_PATH")"
    (umask 077; python -c 'import secrets; print(secrets.token_hex(32))' > "$RAY_AUTH_TOKEN_PATH")
fi

srun --nodes=1 --ntasks=1 -w "$head" ray start --head --node-ip-address="$head_ip" --port=$port \\
    --num-cpus={sh.cpus_per_node}{gpus} --block &
sleep 5
for node in "${{nodes[@]:1}}"; do
    srun --nodes=1 --ntasks=1 -w "$node" ray start --address="$head_ip:$port" \\
        --num-cpus={sh.cpus_per_node}{gpus} --block &
done

# wait until every node has joined (at most 5 minutes)
python - "$head_ip:$port" {sh.nodes} <<'PY'
import sys, time
import ray
ray.init(address=sys.argv[1], log_to_driver=False)
deadline = time.time() + 300
while sum(n["Alive"] for n in ray.nodes()) < int(sys.argv[2]):
    if time.time() > deadline:
        sys.exit(f"only {{sum(n['Alive'] for n in ray.nodes())}} of {{sys.argv[2]}} Ray nodes joined in 300 s")
    time.sleep(2)
PY

{train}
"""


GPU_RESOURCES = {"amd": "amd.com/gpu", "nvidia": "nvidia.com/gpu"}  # the device plugins' resource names


def kuberay_manifest(cfg: Config, config_text: str, overrides: list[str], sh: Shape, name: str,
                     image: str = DEFAULT_IMAGE, vendor: str = "nvidia") -> str:
    """A ConfigMap holding the config and a KubeRay RayJob (ray.io/v1) that runs it and deletes its cluster
    after the job finishes."""
    vendor_gpu = GPU_RESOURCES[vendor]
    worker_resources = {"cpu": str(sh.cpus_per_node), "memory": "64Gi"}
    if sh.gpus_per_node:
        worker_resources[vendor_gpu] = str(sh.gpus_per_node)
    mount = {"name": "scaletrain-config", "mountPath": "/scaletrain"}
    token_secret = f"{name}-ray-token"
    volume = {"name": "scaletrain-config", "configMap": {"name": f"{name}-config"}}

    def container(role: str, resources: dict) -> dict:
        return {"name": f"ray-{role}", "image": image, "resources": {"limits": resources, "requests": resources},
                "volumeMounts": [mount]}

    config_map = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"{name}-config"},
                  "data": {"config.yaml": config_text}}
    job = {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": name},
           "spec": {"entrypoint": entrypoint("/scaletrain/config.yaml", overrides),
                    "shutdownAfterJobFinishes": True, "ttlSecondsAfterFinished": 600,
                    "rayClusterSpec": {
                        # token authentication (KubeRay >= 1.5.1): the operator sets RAY_AUTH_MODE and RAY_AUTH_TOKEN
                        # from this Secret in every Ray container and the job's submitter
                        "rayVersion": ray_version_of(image),
                        "authOptions": {"mode": "token", "secretName": token_secret},
                        "headGroupSpec": {"rayStartParams": {"dashboard-host": "0.0.0.0", "num-gpus": "0"},
                                          "template": {"spec": {"containers": [container(
                                              "head", {"cpu": "4", "memory": "16Gi"})], "volumes": [volume]}}},
                        "workerGroupSpecs": [{"groupName": "workers", "replicas": sh.nodes, "minReplicas": sh.nodes,
                                              "maxReplicas": sh.nodes, "rayStartParams": {},
                                              "template": {"spec": {"containers": [container(
                                                  "worker", worker_resources)], "volumes": [volume]}}}]}}}
    how = (f"# Written by `scaletrain submit --emit kuberay`. Ray's token authentication is on: create its Secret\n"
           f"# once, before applying this file (the token stays in Kubernetes; nothing here holds it):\n"
           f"#   kubectl create secret generic {token_secret} \\\n"
           f"#     --from-literal=auth_token=\"$(openssl rand -hex 32)\"\n"
           f"# A client outside the cluster (scaletrain jobs ... --address URL) reads it into ~/.ray/auth_token:\n"
           f"#   kubectl get secret {token_secret} -o jsonpath='{{.data.auth_token}}' \\\n"
           f"#     | base64 -d > ~/.ray/auth_token\n")
    return how + yaml.safe_dump_all([config_map, job], sort_keys=False)


def ray_version_of(image: str) -> str:
    """The Ray version of a ``rayproject/ray:X.Y.Z...`` image (KubeRay's ``rayVersion``; token authentication needs
    2.52 or newer), else the version of the Ray installed here."""
    import re

    m = re.search(r":(\d+\.\d+\.\d+)", image)
    if m:
        return m.group(1)
    from importlib.metadata import version

    return version("ray")
