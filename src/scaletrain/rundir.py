"""The run directory's layout: every file and folder name of ``<output_dir>/<run_name>/`` lives here.

Every reader and writer (driver, workers, monitor, reports, commands) asks a ``RunDir`` for its paths, so a
rename is one edit. A run directory is created once (``create_run_dir``) and never reused by another run.

    config.resolved.yaml   the config the run used, secrets redacted
    summary.json           written by rank 0 when training ends (its presence means "finished")
    metrics.jsonl          train/eval/system/breakdown records, one JSON object a line
    alerts.jsonl           alerts fired by the driver's monitor or the workers
    logs/main.log          key events of the driver and rank 0; logs/worker-<rank>.log per rank
    checkpoints/step-<N>/  see checkpoint/storage.py
    heartbeat/ stacks/     per-rank progress and stack dumps (comm/watchdog.py)
    data/                  the tokenized splits the workers load
    examples/              data.record_examples: the examples each step trained (worker/seen.py)
    final/                 a from_pretrained directory (LoRA: the adapter, base/, merged/)
    STOP                   created on Ctrl-C/SIGTERM: every rank checkpoints and stops
    .private-env.json      secret variables for the Ray workers while they run (0600; see comm/launch_env.py)
    store.json             in the local mirror of a run on object storage: the run's URI (storage/mirror.py)
"""

from __future__ import annotations

import time
from pathlib import Path

from scaletrain.errors import ConfigError, LaunchError

# Owner and group only: configs and logs may hold paths and hostnames users consider private.
DIR_MODE = 0o750
RUN_UMASK = 0o027  # files of a run are not world-readable


class RunDir:
    """Paths inside one run directory (nothing is created by asking)."""

    RESOLVED_CONFIG = "config.resolved.yaml"
    SUMMARY = "summary.json"
    METRICS = "metrics.jsonl"
    ALERTS = "alerts.jsonl"
    TIMELINE = "timeline.jsonl"  # the driver's and rank 0's phase times (metrics/goodput.py)
    STOP = "STOP"
    REPORT = "report.md"
    MAIN_LOG = "logs/main.log"
    SPEC = "launch.json"  # the torchrun launcher's hand-off of the job spec
    TRACKERS = "trackers.json"  # W&B / MLflow run ids, so a resumed run continues the same tracker runs
    PRIVATE_ENV = ".private-env.json"  # secret variables for Ray workers (0600), removed when the workers end
    STORE = "store.json"  # a mirror's home on object storage (storage/mirror.py)
    CHECKPOINTS, DATA, FINAL = "checkpoints", "data", "final"
    # report/plots.py's files, in this order: loss, throughput, ranks, utilization, rewards, goodput, experts, rl
    PLOTS = ("loss.png", "throughput.png", "ranks.png", "utilization.png", "rewards.png", "goodput.png",
             "experts.png", "rl.png")
    SAMPLES = "samples.jsonl"  # GRPO: a few prompts with their completions and rewards at the start and the end
    ROLLOUT = "rollout.jsonl"  # GRPO, rollout.placement: separate: each actor's weight syncs (worker/rollout.py)
    # A run on object storage (storage/): what the mirror never uploads (the store has its own checkpoints; Ray's
    # bookkeeping, process ids and the secrets file belong to this machine), what a worker's forwarder never sends
    # to the driver (checkpoints and final/ go to the store, the data came from it, fault markers and STOP are the
    # worker's own), and what a fetch of the run leaves in the store (the workers read those from there).
    NOT_UPLOADED = (CHECKPOINTS, "ray", PRIVATE_ENV, STORE, "pids", ".shared-storage-check")
    NOT_FORWARDED = (DATA, FINAL, CHECKPOINTS, "faults", STOP)
    NOT_FETCHED = (CHECKPOINTS, DATA, FINAL)

    @staticmethod
    def is_partial(name: str) -> bool:
        """A file being written (written beside its final name, then renamed over it): never copied elsewhere."""
        return name.startswith(".") or name.endswith(".tmp")

    def __init__(self, root: str | Path):
        self.root = Path(root)

    def __fspath__(self) -> str:
        return str(self.root)

    def __str__(self) -> str:
        return str(self.root)

    def __repr__(self) -> str:
        return f"RunDir({str(self.root)!r})"

    @property
    def name(self) -> str:
        return self.root.name

    # --- files written once per run -------------------------------------------------------------------
    @property
    def resolved_config(self) -> Path:
        return self.root / self.RESOLVED_CONFIG

    @property
    def summary(self) -> Path:
        return self.root / self.SUMMARY

    @property
    def metrics(self) -> Path:
        return self.root / self.METRICS

    @property
    def alerts(self) -> Path:
        return self.root / self.ALERTS

    @property
    def timeline(self) -> Path:
        return self.root / self.TIMELINE

    @property
    def report(self) -> Path:
        return self.root / self.REPORT

    @property
    def samples(self) -> Path:
        return self.root / self.SAMPLES

    @property
    def rollout(self) -> Path:
        return self.root / self.ROLLOUT

    @property
    def stop(self) -> Path:
        return self.root / self.STOP

    @property
    def spec(self) -> Path:
        return self.root / self.SPEC

    @property
    def trackers(self) -> Path:
        return self.root / self.TRACKERS

    @property
    def private_env(self) -> Path:
        return self.root / self.PRIVATE_ENV

    @property
    def store(self) -> Path:
        return self.root / self.STORE

    # --- logs -----------------------------------------------------------------------------------------
    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def events(self) -> Path:
        return self.root / self.MAIN_LOG

    def worker_log(self, rank: int) -> Path:
        return self.logs / f"worker-{rank}.log"

    def worker_logs(self) -> list[Path]:
        return sorted(self.logs.glob("worker-*.log"))

    def torchrun_log(self, node_rank: int) -> Path:
        return self.logs / f"torchrun-node{node_rank}.log"

    # --- per-rank liveness ------------------------------------------------------------------------------
    @property
    def heartbeats(self) -> Path:
        return self.root / "heartbeat"

    def heartbeat(self, rank: int) -> Path:
        return self.heartbeats / f"rank-{rank}.json"

    def stacks(self, rank: int) -> Path:
        return self.root / "stacks" / f"rank-{rank}.txt"

    def pid(self, rank: int) -> Path:
        return self.root / "pids" / f"rank-{rank}.pid"

    @property
    def pids(self) -> list[Path]:
        """Every rank's process-id file of the run's latest workers."""
        return sorted((self.root / "pids").glob("rank-*.pid"))

    @property
    def flight(self) -> Path:
        """Prefix directory of the NCCL/RCCL flight-recorder dumps."""
        return self.root / "flight"

    # --- state ----------------------------------------------------------------------------------------
    @property
    def checkpoints(self) -> Path:
        return self.root / self.CHECKPOINTS

    @property
    def data(self) -> Path:
        return self.root / self.DATA

    @property
    def final(self) -> Path:
        return self.root / self.FINAL

    @property
    def examples(self) -> Path:
        return self.root / "examples"

    @property
    def tensorboard(self) -> Path:
        return self.root / "tensorboard"

    # --- questions --------------------------------------------------------------------------------------
    def is_run(self) -> bool:
        return self.resolved_config.is_file()

    def require_run(self) -> RunDir:
        """This, if it is a scaletrain run directory; else the one-line error naming it."""
        if not self.is_run():
            raise ConfigError(f"{self.root}: not a scaletrain run directory (no {self.RESOLVED_CONFIG})")
        return self

    def finished(self) -> bool:
        return self.summary.is_file()


def default_run_name(config_path: str | Path, now: float | None = None) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    return f"{Path(config_path).stem}-{stamp}"


def check_output_dir(output_dir: str | Path, run_name: str | None) -> Path:
    """Before anything is written under it (the data cache lives there too): ``output_dir`` is a directory this
    process can write, or can be created (its nearest existing parent is written to and cleaned at once: nothing
    is left, not even the directory); a named run does not exist yet. Returns it, resolved."""
    root = Path(output_dir).expanduser()
    key = f"output.output_dir={output_dir}"
    if root.exists() and not root.is_dir():
        raise LaunchError(f"{key} is a file, not a directory; choose a directory (it is created if missing)")
    parent = root
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise LaunchError(f"{key} lies under {parent}, which is a file; choose a directory path")
    try:
        import tempfile

        with tempfile.NamedTemporaryFile(dir=parent, prefix=".scaletrain-write-probe-"):
            pass
    except OSError as e:
        raise LaunchError(f"{key}: cannot write there ({e.strerror or e}); choose a writable directory or fix its "
                          f"permissions") from None
    if run_name and (root / run_name).exists():
        raise LaunchError(f"output.run_name={run_name}: {root / run_name} already exists and is never overwritten; "
                          f"choose another run_name, or continue it with --resume {root / run_name}")
    return root.resolve()


def create_run_dir(output_dir: str | Path, run_name: str | None, config_path: str | Path,
                   now: float | None = None) -> Path:
    """Create a fresh run directory atomically (mkdir fails if it exists, so no run is overwritten)."""
    # Absolute: Ray's storage_path and every worker (whatever its cwd) must resolve it the same way.
    root = Path(output_dir).expanduser().resolve()
    try:
        root.mkdir(parents=True, exist_ok=True, mode=DIR_MODE)
    except OSError as e:
        raise LaunchError(f"output.output_dir={output_dir}: cannot create it ({e.strerror}); choose a writable "
                          f"directory") from None
    if run_name:
        path = root / run_name
        try:
            path.mkdir(mode=DIR_MODE)
        except FileExistsError:
            raise LaunchError(f"output.run_name={run_name}: {path} already exists and is never overwritten; "
                              f"choose another run_name, or continue it with --resume {path}") from None
        return path
    base = default_run_name(config_path, now)
    for i in range(1, 1000):
        path = root / (base if i == 1 else f"{base}-{i}")
        try:
            path.mkdir(mode=DIR_MODE)
            return path
        except FileExistsError:
            continue
    raise LaunchError(f"output.output_dir={output_dir}: could not find a free run name for {base}")
