"""Trackers in the driver: a broken or slow one never stalls training; bad input is one line; no secrets."""

import json
import socket
import time

import pytest

from scaletrain.config.schema import MonitorConfig
from scaletrain.errors import ConfigError
from scaletrain.metrics.monitor import RunMonitor
from scaletrain.metrics.trackers import MlflowTracker, TrackerSink, check_trackers, flatten


class Recorder:
    name = "recorder"

    def __init__(self, delay=0.0):
        self.calls, self.delay = [], delay

    def start(self):
        self.calls.append("start")

    def log(self, record):
        time.sleep(self.delay)
        self.calls.append(record["step"])

    def alert(self, alert):
        self.calls.append(("alert", alert.rule))

    def finish(self, artifacts, final_dir):
        self.calls.append("finish")


class Broken(Recorder):
    name = "broken"

    def log(self, record):
        raise ConnectionError("tracker down")


def _records(run_dir, n):
    with open(run_dir / "metrics.jsonl", "a") as f:
        for s in range(1, n + 1):
            f.write(json.dumps({"kind": "train", "step": s, "train/loss": 1.0 / s, "world_size": 1,
                                "throughput/samples_per_s": 10.0, "ranks/step_s": [0.1]}) + "\n")


def test_a_tracker_that_raises_leaves_the_others_whole_and_is_reported_once(tmp_path):
    events = []
    good, bad = TrackerSink(Recorder(), lambda *a: events.append(a)), TrackerSink(Broken(), lambda *a: events.append(a))
    monitor = RunMonitor(tmp_path, MonitorConfig(), sinks=[good, bad], poll_s=0.05)
    with monitor:
        _records(tmp_path, 50)
        time.sleep(0.3)
    for sink in (good, bad):
        sink.close([], None)
    assert good.tracker.calls == ["start", *range(1, 51), "finish"]
    failures = [e for e in events if "broken failed" in e[1]]
    assert len(failures) == 1 and "ConnectionError: tracker down" in failures[0][1]


def test_a_slow_tracker_drops_and_counts_instead_of_waiting(tmp_path):
    events = []
    slow = TrackerSink(Recorder(delay=0.2), lambda *a: events.append(a), maxsize=5)
    for s in range(1, 41):
        slow.write({"kind": "train", "step": s})
    slow.close([], None)
    # writing never waited for the tracker: what it could not take was dropped, and said
    assert slow.dropped > 20 and any(f"{slow.dropped} record(s) dropped" in e[1] for e in events)


def test_report_to_a_tracker_that_is_not_installed_names_the_extra(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(ConfigError, match=r"monitor.report_to=wandb needs the wandb package; pip install "
                                          r"'scaletrain\[wandb\]'"):
        check_trackers(["jsonl", "wandb"])
    check_trackers(["jsonl", "mlflow"])


@pytest.mark.loop  # MLflow's import and its HTTP client start processes
def test_an_unreachable_mlflow_server_is_one_warning_in_seconds(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: nothing listens there
    events = []
    sink = TrackerSink(MlflowTracker(tmp_path, "exp", f"http://127.0.0.1:{port}", {"a": 1}),
                       lambda *a: events.append(a))
    for s in range(1, 6):
        sink.write({"kind": "train", "step": s, "train/loss": 1.0})
    sink.close([], None)
    assert len([e for e in events if "mlflow failed" in e[1]]) == 1


@pytest.mark.loop
def test_wandb_online_without_a_key_is_one_line(tmp_path):
    import os
    import subprocess
    import sys

    # A fresh process: wandb keeps its settings (the mode among them) in a per-process singleton, so a W&B run
    # of an earlier test in this process would make this one offline.
    code = ("import sys; from pathlib import Path; from scaletrain.metrics.trackers import TrackerSink, WandbTracker;"
            "events = []; sink = TrackerSink(WandbTracker(Path(sys.argv[1]), 'p', {}), lambda *a: events.append(a));"
            "sink.close([], None); print([e[1] for e in events if 'wandb failed' in e[1]])")
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(WANDB_MODE="online", HOME=str(tmp_path), WANDB_CONFIG_DIR=str(tmp_path / "wandb-config"))
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, env=env,
                         timeout=120)
    failures = eval(out.stdout.strip().splitlines()[-1])
    assert len(failures) == 1 and "set WANDB_MODE=offline or run `wandb login`" in failures[0], out.stderr[-2000:]


def test_flatten_gives_mlflow_params():
    assert flatten({"train": {"lr": 1e-3, "x": {"y": 1}}, "data": {"dataset": ["a", "b"]}, "e": {}}) == {
        "train.lr": 1e-3, "train.x.y": 1, "data.dataset": ["a", "b"], "e": {}}


@pytest.mark.loop
def test_mlflow_logs_final_as_an_artifact_and_as_a_transformers_model(tmp_path, monkeypatch):
    import mlflow
    from mlflow.tracking import MlflowClient
    from transformers import BertConfig, BertForSequenceClassification

    from scaletrain.model.tokenizer import load_tokenizer

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    tok = load_tokenizer("builtin:tiny-bert")
    BertForSequenceClassification(BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=1,
                                             num_attention_heads=2, intermediate_size=64)).save_pretrained(
        tmp_path / "final")
    tok.save_pretrained(tmp_path / "final")
    uri = f"file:{tmp_path / 'mlruns'}"
    tracker = MlflowTracker(tmp_path, "exp", uri, {"train.lr": 0.1}, log_model=True, task="sequence-classification")
    tracker.start()
    tracker.log({"kind": "train", "step": 3, "train/loss": 0.5, "time": 1.0})
    tracker.finish([], tmp_path / "final")
    client = MlflowClient(uri)
    assert [m.step for m in client.get_metric_history(tracker.run_id, "train/loss")] == [3]
    assert "final" in {a.path for a in client.list_artifacts(tracker.run_id)}
    exp = client.get_run(tracker.run_id).info.experiment_id
    (model,) = mlflow.search_logged_models(experiment_ids=[exp], output_format="list")
    assert model.name == "model" and model.source_run_id == tracker.run_id


def test_each_tracker_writes_where_its_own_variable_says_else_the_run_directory(tmp_path, monkeypatch):
    from scaletrain.config.schema import MonitorConfig
    from scaletrain.metrics.trackers import tensorboard_dir, tracker_note, wandb_dir

    for name in ("WANDB_DIR", "TENSORBOARD_LOGGING_DIR", "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(name, raising=False)
    run = tmp_path / "runs" / "r1"
    cfg = MonitorConfig(report_to=["wandb", "tensorboard", "mlflow"])
    assert wandb_dir(run) == (run, "the run directory") and tensorboard_dir(run)[0] == run / "tensorboard"
    assert tracker_note(cfg, run, str(tmp_path / "runs")) == (
        f"trackers write to: wandb -> {run} (the run directory); tensorboard -> {run / 'tensorboard'} (the run "
        f"directory); mlflow -> file:{tmp_path / 'runs' / 'mlruns'} (beside the runs)")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "w"))
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(tmp_path / "tb"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")
    assert tracker_note(cfg, run, str(tmp_path / "runs")) == (
        f"trackers write to: wandb -> {tmp_path / 'w'} (WANDB_DIR); tensorboard -> {tmp_path / 'tb' / 'r1'} "
        f"(TENSORBOARD_LOGGING_DIR); mlflow -> http://127.0.0.1:5000 (MLFLOW_TRACKING_URI)")
    assert tracker_note(MonitorConfig(report_to=[]), run, str(tmp_path)) is None


def test_the_tensorboard_sink_writes_under_tensorboard_logging_dir(tmp_path, monkeypatch):
    from scaletrain.config.schema import MonitorConfig
    from scaletrain.metrics.monitor import RunMonitor

    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(tmp_path / "tb"))
    run = tmp_path / "runs" / "r2"
    run.mkdir(parents=True)
    monitor = RunMonitor(run, MonitorConfig(report_to=["tensorboard"]))
    monitor.sinks[0].write({"kind": "train", "step": 1, "train/loss": 1.5})
    monitor.sinks[0].close()
    assert list((tmp_path / "tb" / "r2").glob("events.out.tfevents.*")) and not (run / "tensorboard").exists()
