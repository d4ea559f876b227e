"""Experiment trackers teams already use: Weights & Biases and MLflow, through their own clients, in the driver.

The driver's monitor follows the workers' metrics.jsonl and hands every record to each tracker's sink; no
tracker code runs in a worker. A sink is a bounded queue drained by its own thread, so a slow or unreachable
tracker never stalls training: when the queue is full a record is dropped and counted, and a tracker whose
client raises is reported once (main.log and the console) and then left alone. The trackers' run ids are kept
in the run directory (``trackers.json``): a resumed run continues the same W&B run and the same MLflow run.
Everything a tracker receives is redacted as the run files are (the resolved config; alert texts).
"""

from __future__ import annotations

import json
import queue
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from scaletrain.errors import ConfigError
from scaletrain.rundir import RunDir

TRACKERS = ("wandb", "mlflow")
EXTRAS = {"wandb": ("wandb", "scaletrain[wandb]"), "mlflow": ("mlflow", "scaletrain[mlflow]")}
QUEUE_SIZE = 10_000  # records waiting for a tracker before new ones are dropped (and counted)
CLOSE_TIMEOUT_S = 60.0  # how long the end of a run waits for a tracker to take what is queued


def check_trackers(report_to: list[str]) -> None:
    """Fail before a run starts when an asked-for tracker's package is missing (and say which extra)."""
    import importlib.util

    for name in report_to:
        if name in EXTRAS and importlib.util.find_spec(EXTRAS[name][0]) is None:
            module, extra = EXTRAS[name]
            raise ConfigError(f"monitor.report_to={name} needs the {module} package; pip install '{extra}' "
                              f"(or remove {name} from monitor.report_to)")


def numeric(record: dict) -> dict[str, float]:
    """The metrics of a record: numbers under names with a '/' (units in the names), booleans excluded."""
    return {k: float(v) for k, v in record.items()
            if "/" in k and isinstance(v, (int, float)) and not isinstance(v, bool)}


class TrackerSink:
    """A tracker behind a bounded queue and a thread (see the module's docstring)."""

    def __init__(self, tracker, events, console=None, maxsize: int = QUEUE_SIZE):
        self.tracker, self.events, self.console = tracker, events, console
        self.queue: queue.Queue = queue.Queue(maxsize)
        self.dropped = 0
        self.failed: str | None = None
        self._thread = threading.Thread(target=self._drain, name=f"scaletrain-{tracker.name}", daemon=True)
        self._thread.start()
        self._call("start")

    def _call(self, method: str, *args) -> None:
        try:
            self.queue.put_nowait((method, args))
        except queue.Full:
            self.dropped += 1

    def write(self, record: dict) -> None:
        self._call("log", record)

    def alert(self, alert) -> None:
        self._call("alert", alert)

    def _drain(self) -> None:
        while True:
            method, args = self.queue.get()
            if method == "stop":
                return
            if self.failed:
                continue
            try:
                getattr(self.tracker, method)(*args)
            except Exception as e:  # noqa: BLE001 - a tracker must never take the run down
                self.failed = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:200] if str(e).strip() else ''}"
                self._say(f"{self.tracker.name} failed and is off for the rest of the run ({self.failed}); "
                          f"training and the other sinks go on")

    def _say(self, text: str) -> None:
        if self.events:
            self.events("tracker", text)
        if self.console is not None:
            self.console.print(f"[yellow]tracker[/] {text}", soft_wrap=True)

    def close(self, artifacts: list[Path], final_dir: Path | None) -> None:
        self._call("finish", artifacts, final_dir)
        try:
            self.queue.put(("stop", ()), timeout=CLOSE_TIMEOUT_S)
        except queue.Full:
            pass
        self._thread.join(CLOSE_TIMEOUT_S)
        if self._thread.is_alive():
            self._say(f"{self.tracker.name} did not finish within {CLOSE_TIMEOUT_S:.0f} s; what it had not sent "
                      f"is lost to it (the run directory has everything)")
        if self.dropped:
            self._say(f"{self.tracker.name}: {self.dropped} record(s) dropped (its queue of {self.queue.maxsize} "
                      f"was full: the tracker was slower than training)")


class RunIds:
    """``trackers.json`` in the run directory: each tracker's run id, and the project/experiment name."""

    def __init__(self, run_dir: Path):
        self.path = RunDir(run_dir).trackers

    def read(self) -> dict:
        try:
            return json.loads(self.path.read_text())
        except (OSError, json.JSONDecodeError):
            return {}

    _lock = threading.Lock()  # the trackers' threads start together and each adds its id

    def save(self, **values: Any) -> None:
        with self._lock:
            data = {**self.read(), **values}
            tmp = self.path.with_name(f".{self.path.name}.{threading.get_ident()}.tmp")
            tmp.write_text(json.dumps(data, indent=1))
            tmp.replace(self.path)  # atomic: a reader sees the old file or the new one


class WandbTracker:
    name = "wandb"

    def __init__(self, run_dir: Path, project: str, config: dict, files_dir: Path | None = None):
        self.run_dir, self.project, self.config = Path(run_dir), project, config
        self.files_dir = Path(files_dir or run_dir)  # wandb_dir(): WANDB_DIR when set
        self.ids = RunIds(run_dir)
        self.run = None
        self.step = 0

    def start(self) -> None:
        import wandb

        saved = self.ids.read()
        run_id = saved.get("wandb") or uuid.uuid4().hex[:8]  # W&B's own ids are 8 characters of [a-z0-9]
        self.ids.save(wandb=run_id, wandb_project=saved.get("wandb_project", self.project))
        try:
            self.run = wandb.init(project=saved.get("wandb_project", self.project), name=self.run_dir.name,
                                  id=run_id, resume="allow", dir=str(self.files_dir), config=self.config,
                                  settings=wandb.Settings(console="off", silent=True, save_code=False))
        except wandb.errors.UsageError as e:
            text = str(e).lower()
            if "api key" in text or "api_key" in text or "login" in text:
                raise RuntimeError("W&B is online but not logged in: set WANDB_MODE=offline or run `wandb login`"
                                   ) from None
            raise

    def log(self, record: dict) -> None:
        values = numeric(record)
        if record.get("kind") in ("train", "eval") and "step" in record:
            self.step = max(self.step, int(record["step"]))
        if record.get("kind") == "system":  # one series per rank
            values = {f"rank{record.get('rank', 0)}/{k}": v for k, v in values.items()}
        if values:
            self.run.log(values, step=self.step)

    def alert(self, alert) -> None:
        import wandb

        self.run.log({f"alerts/{alert.rule}": 1.0}, step=self.step)
        level = wandb.AlertLevel.ERROR if alert.severity == "error" else wandb.AlertLevel.WARN
        self.run.alert(title=alert.rule, text=alert.message, level=level)

    def finish(self, artifacts: list[Path], final_dir: Path | None) -> None:
        for path in artifacts:
            self.run.save(str(path), base_path=str(path.parent), policy="now")
        self.run.finish()


class MlflowTracker:
    name = "mlflow"

    def __init__(self, run_dir: Path, experiment: str, tracking_uri: str, params: dict, log_model: bool = False,
                 task: str = "causal-lm"):
        self.run_dir, self.experiment, self.uri = Path(run_dir), experiment, tracking_uri
        self.params, self.log_model, self.task = params, log_model, task
        self.ids = RunIds(run_dir)
        self.client = self.run_id = None

    def start(self) -> None:
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=self.uri)
        saved = self.ids.read()
        self.run_id = saved.get("mlflow")
        if self.run_id is None:
            exp = self.client.get_experiment_by_name(self.experiment)
            exp_id = exp.experiment_id if exp else self.client.create_experiment(self.experiment)
            self.run_id = self.client.create_run(exp_id, run_name=self.run_dir.name).info.run_id
            self.ids.save(mlflow=self.run_id, mlflow_tracking_uri=self.uri)
            items = [Param(k[:250], str(v)[:6000]) for k, v in self.params.items()]
            for i in range(0, len(items), 100):  # MLflow takes at most 100 params a batch
                self.client.log_batch(self.run_id, params=items[i:i + 100])
        else:
            self.client.update_run(self.run_id, status="RUNNING")

    def log(self, record: dict) -> None:
        from mlflow.entities import Metric

        values = numeric(record)
        if record.get("kind") == "system":
            values = {f"rank{record.get('rank', 0)}/{k}": v for k, v in values.items()}
        stamp = int(record.get("time", time.time()) * 1000)
        step = int(record.get("step", 0) or 0)
        metrics = [Metric(k.replace("%", "pct"), v, stamp, step) for k, v in values.items()]
        if metrics:
            self.client.log_batch(self.run_id, metrics=metrics)

    def alert(self, alert) -> None:
        self.client.set_tag(self.run_id, f"alert.{alert.rule}", alert.message[:5000])

    def finish(self, artifacts: list[Path], final_dir: Path | None) -> None:
        for path in artifacts:
            self.client.log_artifact(self.run_id, str(path))
        if final_dir is not None and final_dir.is_dir():
            self.client.log_artifacts(self.run_id, str(final_dir), "final")
            if self.log_model:
                self._log_model(final_dir)
        self.client.set_terminated(self.run_id)

    def _log_model(self, final_dir: Path) -> None:
        """The final model as an MLflow transformers model (an adapter directory is logged with its base)."""
        import mlflow
        from transformers import AutoTokenizer, pipeline

        task = "text-generation" if self.task == "causal-lm" else "text-classification"
        model = pipeline(task, model=str(final_dir), tokenizer=AutoTokenizer.from_pretrained(str(final_dir)))
        mlflow.set_tracking_uri(self.uri)
        with mlflow.start_run(run_id=self.run_id):
            # the requirements named, not inferred: inference imports every vision/audio package it can name
            mlflow.transformers.log_model(transformers_model=model, name="model",
                                          pip_requirements=[f"transformers=={_version('transformers')}",
                                                            f"torch=={_version('torch')}",
                                                            *([f"peft=={_version('peft')}"]
                                                              if (final_dir / "adapter_config.json").exists() else [])])


def _version(package: str) -> str:
    from importlib.metadata import version

    return version(package)


def flatten(config: dict, prefix: str = "") -> dict[str, Any]:
    """``{"train": {"lr": 1}}`` -> ``{"train.lr": 1}`` (MLflow params)."""
    out: dict[str, Any] = {}
    for k, v in config.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def wandb_dir(run_dir: Path) -> tuple[Path, str]:
    """Where W&B keeps its files, and why: WANDB_DIR when set (as every W&B tool honours it), else the run
    directory."""
    from scaletrain import envvars

    if given := envvars.read(envvars.WANDB_DIR):
        return Path(given).expanduser(), envvars.WANDB_DIR
    return Path(run_dir), "the run directory"


def tensorboard_dir(run_dir: Path) -> tuple[Path, str]:
    """Where the TensorBoard event files go, and why: TENSORBOARD_LOGGING_DIR/<run name> when set (runs side by
    side under it, as TensorBoard lists them), else the run directory's tensorboard/."""
    from scaletrain import envvars

    if given := envvars.read(envvars.TENSORBOARD_LOGGING_DIR):
        return Path(given).expanduser() / Path(run_dir).name, envvars.TENSORBOARD_LOGGING_DIR
    return RunDir(run_dir).tensorboard, "the run directory"


def mlflow_uri(monitor_cfg, output_dir: str) -> tuple[str, str]:
    """The MLflow tracking URI, and why: monitor.mlflow_tracking_uri, else MLFLOW_TRACKING_URI, else a file store
    beside the runs."""
    from scaletrain import envvars

    if monitor_cfg.mlflow_tracking_uri:
        return monitor_cfg.mlflow_tracking_uri, "monitor.mlflow_tracking_uri"
    if given := envvars.read(envvars.MLFLOW_TRACKING_URI):
        return given, envvars.MLFLOW_TRACKING_URI
    return f"file:{Path(output_dir).expanduser().resolve() / 'mlruns'}", "beside the runs"


def tracker_note(monitor_cfg, run_dir: Path, output_dir: str) -> str | None:
    """One line for main.log: where each tracker of ``monitor.report_to`` writes, and which setting says so."""
    places = {"wandb": lambda: wandb_dir(run_dir), "tensorboard": lambda: tensorboard_dir(run_dir),
              "mlflow": lambda: mlflow_uri(monitor_cfg, output_dir)}
    said = [f"{name} -> {where} ({why})" for name in monitor_cfg.report_to if name in places
            for where, why in [places[name]()]]
    return "trackers write to: " + "; ".join(said) if said else None


def start_trackers(monitor_cfg, run_dir: Path, output_dir: str, name: str, config: dict, events,
                   console=None, task: str = "causal-lm") -> list[TrackerSink]:
    """A started sink per tracker of ``monitor.report_to`` (none when it names no tracker). ``config`` is the
    resolved config, redacted; ``name`` the W&B project / MLflow experiment unless the config gives one."""
    from scaletrain import envvars

    sinks = []
    if "wandb" in monitor_cfg.report_to:
        tracker = WandbTracker(run_dir, monitor_cfg.wandb_project or name, config, wandb_dir(run_dir)[0])
        sinks.append(TrackerSink(tracker, events, console))
    if "mlflow" in monitor_cfg.report_to:
        uri = mlflow_uri(monitor_cfg, output_dir)[0]
        envvars.apply_defaults(envvars.TRACKER_DRIVER_DEFAULTS)
        if uri.startswith("file:"):
            envvars.apply_defaults({envvars.MLFLOW_ALLOW_FILE_STORE: "true"})
        saved = RunIds(run_dir).read()
        tracker = MlflowTracker(run_dir, saved.get("mlflow_experiment", name), saved.get("mlflow_tracking_uri", uri),
                                flatten(config), monitor_cfg.mlflow_log_model, task)
        RunIds(run_dir).save(mlflow_experiment=tracker.experiment)
        sinks.append(TrackerSink(tracker, events, console))
    return sinks


def close_trackers(sinks: list[TrackerSink], run_dir: Path) -> None:
    """Send the report, its plots (and, to MLflow, final/) and end the trackers' runs."""
    if not sinks:
        return
    rd = RunDir(run_dir)
    artifacts = [p for p in [rd.report, *(rd.root / f for f in RunDir.PLOTS)] if p.is_file()]
    for sink in sinks:
        sink.close(artifacts, rd.final if rd.final.is_dir() else None)
