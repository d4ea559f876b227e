"""Launch the same worker loop with torch.distributed.run (torchrun) instead of Ray.

Each node runs one torchrun agent (``TorchrunNode``) whose processes read the JobSpec from a handoff file,
join the process group and run ``worker.loop.train``. On a single node the agent starts as soon as the
config is valid: its Python and torch imports, and its workers' imports, overlap the driver's own imports
and data preparation, and the workers wait for the handoff file. With several nodes, node 0 writes the spec
to ``launch.json`` in the shared run directory and the other nodes start once it is there. Run directory,
logs, metrics and reports are the Ray launcher's. ``fault_tolerance.max_failures`` becomes
``--max-restarts``: torchrun restarts the local workers and the loop resumes from the newest checkpoint.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from scaletrain.comm.device import Platform
from scaletrain.comm.launch_env import torchrun_agent_env
from scaletrain.comm.ports import free_port, port_free
from scaletrain.config.schema import Config
from scaletrain.errors import LaunchError
from scaletrain.launch import torchrun_agent
from scaletrain.launch.failures import DEAD_PROCESS, RankFailures, failures_by_rank, format_groups
from scaletrain.launch.plan import ClusterPlan, plan_node
from scaletrain.launch.torchrun_agent import describe_exit, parse_exit
from scaletrain.launch.warm import forkserver
from scaletrain.launch.warm.cluster import node_forkserver
from scaletrain.metrics.logs import parse_failure
from scaletrain.redact import Redactor
from scaletrain.rundir import RunDir
from scaletrain.worker.faults import Fault
from scaletrain.worker.spec import JobSpec

JOIN_TIMEOUT_S = 600  # how long nodes > 0 wait for node 0 to write the spec
# torch.distributed.elastic's agent, before it restarts the workers (agent/server/api.py)
RESTART_LINE = re.compile(r"Worker group (FAILED|UNHEALTHY)\. (\d+)/(\d+) attempts left; will restart worker group")


class TorchrunLauncher:
    """``plan`` checks this node's capacity; ``run`` hands the spec to node 0's agent and waits for it."""

    name = "torchrun"

    def __init__(self, cfg: Config, redact: Redactor):
        self.cfg, self.redact = cfg, redact
        # This node's capacity first: nothing is spawned for a job that cannot run here.
        self._plan = plan_node(cfg, Platform.detect(), os.cpu_count() or 1)
        # Started now on one node: its start-up overlaps the driver's imports and data preparation.
        self.agent = node_zero(cfg)

    def plan(self, platform: Platform) -> ClusterPlan:
        return self._plan

    def run(self, spec: JobSpec, plan: ClusterPlan) -> None:
        # The spec goes to a file: secrets masked (the agent's environment carries comm.env).
        self.agent.run(dataclasses.replace(spec, config=self.redact.mapping(spec.config)))

    def close(self) -> None:
        self.agent.close()

    def __enter__(self) -> TorchrunLauncher:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def write_spec(spec: JobSpec, path: Path) -> Path:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(dataclasses.asdict(spec)))
    os.replace(tmp, path)  # atomic: a waiting worker never reads half a file
    return path


def read_spec(path: str | Path) -> JobSpec:
    data = json.loads(Path(path).read_text())
    data["faults"] = tuple(Fault(**f) for f in data.get("faults", ()))
    return JobSpec(**data)


def shared_run_dir(cfg: Config) -> Path:
    """The run directory of a job over several nodes (output.run_name is required there)."""
    return Path(cfg.output.output_dir).expanduser().resolve() / cfg.output.run_name


def node_zero(cfg: Config) -> TorchrunNode | None:
    """Node 0's torchrun agent (None for the Ray launcher), checked for its port before anything else runs.

    On one node it starts now, before the data exists: its start-up and its workers' imports overlap the
    driver's imports and data preparation, and the workers wait for the spec. With several nodes node 0 writes
    the spec to the shared run directory, where the other nodes wait for it, and starts its agent then: started
    earlier, its rendezvous would wait on nodes that only start once the spec exists.
    """
    if cfg.scaling.launcher != "torchrun":
        return None
    if cfg.scaling.nnodes == 1:
        return TorchrunNode(cfg).start()
    return TorchrunNode(cfg, RunDir(shared_run_dir(cfg)).spec, cfg.output.run_name)


def wait_for_spec(run_dir: Path, timeout_s: float = JOIN_TIMEOUT_S) -> Path:
    path = RunDir(run_dir).spec
    deadline = time.time() + timeout_s
    while not path.exists():
        if time.time() > deadline:
            raise LaunchError(f"{path} did not appear within {timeout_s:.0f} s: start node 0 (scaling.node_rank=0) "
                              f"with the same output.output_dir and output.run_name on a shared filesystem")
        time.sleep(1)
    return path


def wait_for_handoff(path: Path, poll_s: float = 0.05) -> JobSpec:
    """In a worker: wait until the driver has written the spec; give up if our torchrun agent is gone."""
    agent = os.getppid()
    while not path.exists():
        if os.getppid() != agent:
            raise SystemExit(f"torchrun agent {agent} exited before the job spec appeared at {path}")
        time.sleep(poll_s)
    return read_spec(path)


class TorchrunNode:
    """This node's torchrun agent for one job: start it early, hand it the spec, wait, restart for a retry.

    The agent runs in its own session: a Ctrl-C in the terminal reaches only the driver, which asks the ranks
    to checkpoint and stop (the STOP file) instead of torchrun killing them mid-step. It also gets SIGTERM
    when the driver dies, so no agent or worker outlives a killed driver. Its output (and its workers') is
    kept in memory until the run directory exists, then goes to ``logs/torchrun-node<N>.log``.
    """

    def __init__(self, cfg: Config, handoff: Path | None = None, rdzv_id: str | None = None):
        self.cfg = cfg
        s = cfg.scaling
        if s.node_rank == 0 and s.master_port and not port_free(s.master_port, s.master_addr):
            raise LaunchError(f"scaling.master_port={s.master_port} is in use on {s.master_addr}; pick a free port "
                              f"or leave it unset on one node")
        self.port = s.master_port or free_port(s.master_addr)
        self._tmp = None if handoff else Path(tempfile.mkdtemp(prefix="scaletrain-torchrun-"))
        self.handoff = handoff or self._tmp / RunDir.SPEC
        self.rdzv_id = rdzv_id or f"scaletrain-{os.getpid()}-{self.port}"
        self.proc: subprocess.Popen | None = None
        self._handed_over = False
        self._out = _Pump()
        self._restarts = 0
        self._exits: dict[int, int] = {}  # rank -> exit code of the failure torchrun is handling now

    def start(self) -> TorchrunNode:
        if self.proc is None:
            self.proc = subprocess.Popen(self.command(), env=self.env(), stdout=subprocess.PIPE,
                                         stderr=subprocess.STDOUT, start_new_session=True)
            self._out.follow(self.proc.stdout)
        return self

    def command(self) -> list[str]:
        s = self.cfg.scaling
        max_failures = self.cfg.fault_tolerance.max_failures
        # c10d rendezvous (not the static master-addr one): after a failure the restarted workers rendezvous
        # again, which the static backend does not do reliably; the first node to bind the endpoint hosts it.
        worker = ["-m", "scaletrain.launch.torchrun_entry", str(self.handoff)]
        agent = [sys.executable, "-m", torchrun_agent.MODULE, str(os.getpid())]
        if sock := node_forkserver():  # each worker forked pre-imported, or (its environment differs) exec'd plain
            worker = ["--no-python", sys.executable, "-u", "-m", forkserver.MODULE, sock, *worker]
            agent.append(f"{torchrun_agent.FORK_SERVER}{sock}")  # the agent too
        return [*agent, f"--nnodes={s.nnodes}", f"--node-rank={s.node_rank}",
                f"--nproc-per-node={s.num_workers // s.nnodes}", "--rdzv-backend=c10d",
                f"--rdzv-endpoint={s.master_addr}:{self.port}", f"--rdzv-id={self.rdzv_id}",
                f"--rdzv-conf=join_timeout={self.cfg.comm.timeout_s}",
                f"--max-restarts={10**6 if max_failures < 0 else max_failures}", *worker]

    def env(self) -> dict[str, str]:
        plan = plan_node(self.cfg, Platform.detect(), os.cpu_count() or 1)
        return torchrun_agent_env(self.cfg.comm, plan.resources_per_worker["CPU"], cpu=plan.allocator)

    def run(self, spec: JobSpec) -> None:
        """Hand the spec to the workers (starting the agent if it is not running) and wait for them."""
        run_dir = Path(spec.run_dir)
        log = RunDir(run_dir).torchrun_log(self.cfg.scaling.node_rank)
        if self.cfg.scaling.node_rank == 0 and not self._handed_over:  # other nodes read node 0's
            write_spec(spec, self.handoff)
            self._handed_over = True
        self.start()
        self._out.attach(log, on_line=lambda line: self._on_agent_line(line, run_dir))
        try:
            while self.proc.poll() is None:
                time.sleep(0.2)
        except BaseException:  # a second Ctrl-C: stop everything now
            self.stop()
            raise
        code, self.proc = self.proc.returncode, None
        self._out.drain()
        if code != 0:  # training_error words it, with the hang diagnosis, as for the Ray launcher
            raise failures_from_logs(run_dir, code, log, self._exits)

    def _on_agent_line(self, line: str, run_dir: Path) -> None:
        """A worker's exit is noted; torchrun restarting its worker group is said in main.log and on the
        console, as Ray's restarts are, with the causes of this failure (then forgotten for the next one)."""
        if exit_ := parse_exit(line):
            self._exits[exit_[0]] = exit_[1]
            return
        found = RESTART_LINE.search(line)
        if not found:
            return
        self._restarts += 1
        exits, self._exits = self._exits, {}
        from rich.markup import escape

        from scaletrain.console import console
        from scaletrain.metrics.logs import EventLog

        causes = format_groups(last_failures(run_dir, exits)) or "no rank reported an error"
        allowed = self.cfg.fault_tolerance.max_failures
        text = (f"failure {self._restarts} (max_failures={'unlimited' if allowed < 0 else allowed}): {causes}; "
                f"torchrun restarts the worker group from the newest checkpoint ({found.group(2)} of "
                f"{found.group(3)} restarts left)")
        EventLog(run_dir, f"torchrun node {self.cfg.scaling.node_rank}")("failure", text)
        console.print(f"[yellow]restart[/]: {escape(text)}", soft_wrap=True)

    def stop(self) -> None:
        """Stop a running agent; torchrun stops its workers on SIGTERM."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(40)  # torchrun gives its workers 30 s after SIGTERM
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.proc = None
        self._out.drain()

    def close(self) -> None:
        self.stop()
        self._out.close()
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)

    def __enter__(self) -> TorchrunNode:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _Pump:
    """Copy a child's output to a log file, holding it in memory until the file's directory exists."""

    def __init__(self):
        self._lock = threading.Lock()
        self._held: list[bytes] = []
        self._file = None
        self._thread: threading.Thread | None = None
        self._on_line = None
        self._partial = b""

    def follow(self, stream) -> None:
        self._thread = threading.Thread(target=self._copy, args=(stream,), name="torchrun-output", daemon=True)
        self._thread.start()

    def _copy(self, stream) -> None:
        for chunk in iter(lambda: stream.read1(65536), b""):
            with self._lock:
                if self._file is None:
                    self._held.append(chunk)
                else:
                    self._file.write(chunk)
                    self._file.flush()
                on_line = self._on_line
            if on_line is not None:
                *lines, self._partial = (self._partial + chunk).split(b"\n")
                for line in lines:
                    try:
                        on_line(line.decode(errors="replace"))
                    except Exception:  # noqa: BLE001 - a report of a restart must never stop the copy
                        pass

    def attach(self, path: Path, on_line=None) -> None:
        """Write the output to ``path`` from now on; ``on_line`` sees each later line."""
        with self._lock:
            self._on_line = on_line
            if self._file is None or self._file.name != str(path):
                if self._file is not None:
                    self._file.close()
                self._file = open(path, "ab")  # noqa: SIM115 - kept open while the agent runs
            self._file.write(b"".join(self._held))
            self._file.flush()
            self._held.clear()

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None

    def drain(self, timeout_s: float = 5.0) -> None:
        """Wait for the end of the output (a worker that outlives its agent may hold the pipe: bounded)."""
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None


def last_failures(run_dir: Path, exits: dict[int, int] | None = None) -> list[tuple[list[int], str]]:
    """Each rank's last failure from the worker logs, grouped across ranks, with the ranks the agent saw die.

    ``exits`` (rank -> exit code, from the agent): a rank killed by a signal is a dead process (listed
    first: its peers' errors follow from it) whatever its log says; one that exited with an error code
    without reporting one is said by its code.
    """
    last: dict[int, str] = {}
    for path in RunDir(run_dir).worker_logs():
        for line in path.read_text(errors="replace").splitlines():
            if found := parse_failure(line):
                last[found[0]] = found[1]
    for rank, code in (exits or {}).items():
        if code < 0 or rank not in last:
            last[rank] = f"{DEAD_PROCESS} ({describe_exit(code)}) before reporting an error"
    return failures_by_rank(last)


def failures_from_logs(run_dir: Path, code: int, log: Path, exits: dict[int, int] | None = None) -> RankFailures:
    """The ranks' last failures (the message says the rest)."""
    return RankFailures(last_failures(run_dir, exits),
                        f"torchrun exited with code {code} before any rank reported an error (see {log})")
