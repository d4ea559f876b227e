"""Launch the same worker loop with torch.distributed.run (torchrun) instead of Ray.

Node 0 prepares the job exactly as for Ray (run directory, tokenized data) and writes the JobSpec to
``launch.json`` in the run directory; every node then starts ``torchrun`` for its local processes, each of
which reads the spec, joins the process group and runs ``worker.loop.train``. Run directory, logs, metrics
and reports are the Ray launcher's. ``fault_tolerance.max_failures`` becomes ``--max-restarts``: torchrun
restarts the local workers and the loop resumes from the newest checkpoint.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from scaletrain.comm.device import Platform, select_backend
from scaletrain.comm.watchdog import diagnose, looks_like_timeout
from scaletrain.config.schema import Config
from scaletrain.errors import LaunchError, TrainingError
from scaletrain.launch.ray_launcher import ClusterPlan
from scaletrain.worker.faults import Fault
from scaletrain.worker.spec import JobSpec

SPEC_FILE = "launch.json"
JOIN_TIMEOUT_S = 600  # how long nodes > 0 wait for node 0 to write the spec
_FAILED = re.compile(r"\[rank (\d+)\] ERROR scaletrain\.worker: rank \d+ failed at step \d+ \(phase [\w-]+\): (.*)$")


def free_port(addr: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


def port_free(addr: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((addr, port))
            return True
        except OSError:
            return False


def plan(cfg: Config, platform: Platform, cpus: int | None = None) -> ClusterPlan:
    """Backend and a capacity check for this node's processes."""
    s = cfg.scaling
    per_node = s.num_workers // s.nnodes
    use_gpu = platform.has_gpu if s.use_gpu == "auto" else bool(s.use_gpu)
    choice = select_backend(cfg.comm.backend, platform if use_gpu else Platform("cpu", 0, platform.torch_version))
    have, what = (platform.device_count, "GPUs") if use_gpu else (cpus or os.cpu_count() or 1, "CPUs")
    if per_node > have:
        raise LaunchError(f"scaling.num_workers={s.num_workers} over scaling.nnodes={s.nnodes} puts {per_node} processes "
                          f"on this node, which has {have} {what}; lower scaling.num_workers or add nodes")
    return ClusterPlan(use_gpu, choice.backend, {"CPU": 1, **({"GPU": 1} if use_gpu else {})}, choice.note)


def write_spec(spec: JobSpec, run_dir: Path) -> Path:
    path = run_dir / SPEC_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(dataclasses.asdict(spec)))
    os.replace(tmp, path)
    return path


def read_spec(path: str | Path) -> JobSpec:
    data = json.loads(Path(path).read_text())
    data["faults"] = tuple(Fault(**f) for f in data.get("faults", ()))
    return JobSpec(**data)


def wait_for_spec(run_dir: Path, timeout_s: float = JOIN_TIMEOUT_S) -> Path:
    path = run_dir / SPEC_FILE
    deadline = time.time() + timeout_s
    while not path.exists():
        if time.time() > deadline:
            raise LaunchError(f"{path} did not appear within {timeout_s:.0f} s: start node 0 (scaling.node_rank=0) "
                              f"with the same output.output_dir and output.run_name on a shared filesystem")
        time.sleep(1)
    return path


def run_torchrun(spec: JobSpec, cfg: Config, worker_env: dict[str, str], spec_path: Path) -> None:
    s = cfg.scaling
    port = s.master_port or free_port(s.master_addr)
    if s.node_rank == 0 and s.master_port and not port_free(s.master_addr, s.master_port):
        raise LaunchError(f"scaling.master_port={s.master_port} is in use on {s.master_addr}; pick a free port "
                          f"or leave it unset on one node")
    restarts = 10**6 if cfg.fault_tolerance.max_failures < 0 else cfg.fault_tolerance.max_failures
    # c10d rendezvous (not the static master-addr one): after a failure the restarted workers rendezvous
    # again, which the static backend does not do reliably; the first node to bind the endpoint hosts it.
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={s.nnodes}", f"--node-rank={s.node_rank}",
           f"--nproc-per-node={s.num_workers // s.nnodes}", "--rdzv-backend=c10d",
           f"--rdzv-endpoint={s.master_addr}:{port}", f"--rdzv-id={Path(spec.run_dir).name}",
           f"--rdzv-conf=join_timeout={cfg.comm.timeout_s}", f"--max-restarts={restarts}",
           "-m", "scaletrain.launch.torchrun_entry", str(spec_path)]
    log = Path(spec.run_dir) / "logs" / f"torchrun-node{s.node_rank}.log"
    with open(log, "a") as out:
        # Its own session: a Ctrl-C in the terminal reaches only our driver, which asks the ranks to
        # checkpoint and stop (the STOP file) instead of torchrun killing them mid-step.
        env = {**os.environ, **worker_env}
        # Ray gives each worker OMP_NUM_THREADS = its CPUs; torchrun sets 1 only with several processes per
        # node. The same thread count under both launchers keeps their numbers (and results) comparable.
        cpus = (cfg.scaling.resources_per_worker or {}).get("CPU", 1)
        env.setdefault("OMP_NUM_THREADS", str(max(1, int(cpus))))
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            while proc.poll() is None:
                time.sleep(0.2)
        except BaseException:  # a second Ctrl-C: stop everything now
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(30)
            raise
    if proc.returncode != 0:
        raise failure_from_logs(Path(spec.run_dir), s.num_workers, cfg.comm.timeout_s, proc.returncode, log)


def failure_from_logs(run_dir: Path, world: int, timeout_s: int, code: int, log: Path) -> TrainingError:
    """Per-rank causes from the worker logs (the last failure of each rank), grouped across ranks."""
    last: dict[int, str] = {}
    for path in sorted((run_dir / "logs").glob("worker-*.log")):
        for line in path.read_text(errors="replace").splitlines():
            m = _FAILED.search(line)
            if m:
                last[int(m.group(1))] = m.group(2)[:240]
    groups: dict[str, list[int]] = {}
    for rank, msg in sorted(last.items()):
        groups.setdefault(msg, []).append(rank)
    text = "; ".join(f"[rank {', '.join(map(str, r))}]: {m}" for m, r in groups.items()) or \
        f"torchrun exited with code {code} before any rank reported an error (see {log})"
    hang = diagnose(run_dir, world) if looks_like_timeout(groups) else None
    if hang:
        text = f"{hang.message(timeout_s)}; worker errors: {text}"
    return TrainingError(f"training failed: {text}; see {run_dir}/logs/worker-<rank>.log")
