"""The driver's monitor: follows ``metrics.jsonl`` and feeds the progress bar, alert rules and optional sinks.

Following the file (instead of a Ray channel) keeps it identical for every launcher and lets
`scaletrain watch` do the same from another terminal.
"""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path

from rich.markup import escape

from scaletrain.config.schema import MonitorConfig
from scaletrain.errors import ConfigError, LaunchError
from scaletrain.metrics.alerts import build_rules, write_alert
from scaletrain.metrics.sampler import TreeMemory
from scaletrain.metrics.trackers import tensorboard_dir
from scaletrain.rundir import RunDir


class JsonlFollower:
    """Returns the complete new lines of a growing JSONL file on each ``poll``."""

    def __init__(self, path: str | Path):
        self.path, self.offset, self.partial = Path(path), 0, b""

    def poll(self) -> list[dict]:
        if not self.path.exists():
            return []
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read()
        self.offset += len(data)
        data = self.partial + data
        lines = data.split(b"\n")
        self.partial = lines.pop()  # an incomplete last line waits for the next poll
        out = []
        for line in lines:
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        return out


class TensorBoardSink:
    def __init__(self, log_dir: Path):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise ConfigError("monitor.report_to=tensorboard needs the tensorboard package; pip install "
                              "tensorboard") from None
        self.writer = SummaryWriter(str(log_dir))
        self.step = 0

    def write(self, r: dict) -> None:
        if r.get("kind") in ("train", "eval"):
            self.step = r.get("step", self.step)
        prefix = f"rank{r['rank']}/" if r.get("kind") == "system" else ""
        for k, v in r.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool) and "/" in k:
                self.writer.add_scalar(prefix + k, v, self.step)

    def close(self) -> None:
        self.writer.close()


class PrometheusSink:
    """Latest value of every metric per rank at http://HOST:PORT/metrics (rank 0 holds the aggregates)."""

    def __init__(self, port: int):
        try:
            import prometheus_client as prom
        except ImportError:
            raise ConfigError("monitor.prometheus_port needs the prometheus-client package; "
                              "pip install prometheus-client") from None
        self.prom = prom
        self.registry = prom.CollectorRegistry()
        self.gauges: dict[str, object] = {}
        try:
            self.server, _ = prom.start_http_server(port, registry=self.registry)
        except OSError as e:
            raise LaunchError(f"monitor.prometheus_port={port}: cannot listen ({e.strerror}); pick a free "
                              f"port") from None

    def write(self, r: dict) -> None:
        rank = str(r.get("rank", 0))
        for k, v in r.items():
            if not (isinstance(v, (int, float)) and not isinstance(v, bool) and "/" in k):
                continue
            name = "scaletrain_" + re.sub(r"[^a-zA-Z0-9_]", "_", k)
            gauge = self.gauges.get(name)
            if gauge is None:
                gauge = self.gauges[name] = self.prom.Gauge(name, k, ["rank"], registry=self.registry)
            gauge.labels(rank=rank).set(v)

    def close(self) -> None:
        self.server.shutdown()


def check_sinks(cfg: MonitorConfig) -> None:
    """Fail before a run starts when an asked-for sink cannot work: missing package or taken port."""
    from scaletrain.metrics.trackers import check_trackers

    check_trackers(cfg.report_to)
    if "tensorboard" in cfg.report_to:
        try:
            import tensorboard  # noqa: F401
        except ImportError:
            raise ConfigError("monitor.report_to=tensorboard needs the tensorboard package; pip install "
                              "tensorboard") from None
    if cfg.prometheus_port:
        try:
            import prometheus_client  # noqa: F401
        except ImportError:
            raise ConfigError("monitor.prometheus_port needs the prometheus-client package; "
                              "pip install prometheus-client") from None
        from scaletrain.comm.ports import port_free

        if not port_free(cfg.prometheus_port):
            raise LaunchError(f"monitor.prometheus_port={cfg.prometheus_port} is in use; pick a free port")


class RunMonitor:
    """Context manager for the driver: a thread polls the run's records every ``poll_s``."""

    def __init__(self, run_dir: str | Path, cfg: MonitorConfig, events=None, progress=None, console=None,
                 poll_s: float = 0.5, sinks=(), phases=None):
        """``phases``: told of rank 0's timeline marks and the metrics records (launch/phases.py)."""
        self.run_dir = Path(run_dir)
        self.follower = JsonlFollower(RunDir(run_dir).metrics)
        self.phases, self.timeline = phases, JsonlFollower(RunDir(run_dir).timeline)
        self.tree = TreeMemory()  # the driver's process tree, for summary.json (memory/tree_peak_bytes)
        self.rules = build_rules(cfg.alerts)
        self.events, self.progress, self.console, self.poll_s = events, progress, console, poll_s
        self.sinks = []
        self.trackers = list(sinks)  # closed by their owner after the report exists (metrics/trackers.py)
        if "tensorboard" in cfg.report_to:
            self.sinks.append(TensorBoardSink(tensorboard_dir(run_dir)[0]))
        if cfg.prometheus_port:
            self.sinks.append(PrometheusSink(cfg.prometheus_port))
        self.alerts = []
        self._stop = threading.Event()
        self._warned = False

    def poll(self) -> None:
        self.tree.sample()
        if self.phases is not None:
            for mark in self.timeline.poll():
                self.phases.observe("timeline", mark)
        for record in self.follower.poll():
            if self.phases is not None:
                self.phases.observe("metrics", record)
            for sink in (*self.sinks, *self.trackers):
                sink.write(record)
            if self.progress is not None and record.get("kind") == "train":
                self.progress.show(record)
            for rule in self.rules:
                for alert in rule.observe(record):
                    self.alerts.append(alert)
                    write_alert(self.run_dir, alert)
                    for tracker in self.trackers:
                        tracker.alert(alert)
                    if self.events:
                        self.events("alert", f"{alert.rule}: {alert.message}")
                    if self.console is not None:
                        self.console.print(f"[yellow]alert[/] {alert.rule}: {escape(alert.message)}", soft_wrap=True)

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            self._poll_or_warn()

    def _poll_or_warn(self) -> None:
        try:
            self.poll()
        except OSError as e:  # alerts.jsonl or a sink on a full disk: one line, no thread traceback
            if not self._warned and self.console is not None:
                self.console.print(f"[yellow]warning[/]: the monitor cannot write ({escape(str(e.strerror or e))}: "
                                   f"{e.filename or self.run_dir}); alerts are not recorded until there is space",
                                   soft_wrap=True)
            self._warned = True

    def __enter__(self) -> "RunMonitor":
        if self.progress is not None:
            self.progress.start()
        self._thread = threading.Thread(target=self._run, name="scaletrain-monitor", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._poll_or_warn()
        if self.progress is not None:
            self.progress.stop()
        for sink in self.sinks:
            sink.close()
