"""A real 2-worker run: system records for every rank, the report with every plot, NaN stopping the run, a slowed
rank named. What the workers record does not depend on the launcher: these run under torchrun (its workers forked
pre-imported, beside the shared Ray's tests under make test); Ray's own runs are test_train_ray.py's and
test_reliability.py's."""

import json

import pytest
from PIL import Image

from scaletrain.config import validate
from scaletrain.errors import TrainingError
from scaletrain.launch.job import run_job
from scaletrain.metrics.records import read_jsonl
from scaletrain.report.plots import DPI, FIGSIZE

pytestmark = pytest.mark.slow


def _cfg(classify_cfg, tmp_path, name, **train):
    cfg = json.loads(json.dumps(classify_cfg))
    cfg["scaling"].update(num_workers=2, launcher="torchrun")
    cfg["train"].update(max_steps=30, logging_steps=2, eval_steps=10, **train)
    cfg["monitor"] = {"interval_s": 0.2}
    cfg["output"] = {"output_dir": str(tmp_path / "runs"), "run_name": name}
    return validate(cfg)


def test_report_and_system_metrics_of_a_real_run(classify_cfg, tmp_path):
    result = run_job(_cfg(classify_cfg, tmp_path, "obs"), tmp_path / "c.yaml", show_progress=False)
    run = result.run_dir
    records = read_jsonl(run / "metrics.jsonl")
    system = [r for r in records if r["kind"] == "system"]
    assert {r["rank"] for r in system} == {0, 1}
    cores = __import__("os").cpu_count()
    assert all(r["memory/rss_gib"] > 0 and 0 <= r["system/cpu_pct"] <= 100 * cores for r in system)
    train = [r for r in records if r["kind"] == "train"]
    assert all(len(r["ranks/step_s"]) == 2 and len(r["ranks/rss_gib"]) == 2 for r in train)
    report = (run / "report.md").read_text()  # `train` wrote it at the end
    assert "Status: **finished**" in report and "| world size | 2 |" in report
    for png in ("loss", "throughput", "ranks", "utilization"):
        assert f"![{png}]({png}.png)" in report
        with Image.open(run / f"{png}.png") as img:
            assert img.format == "PNG" and img.size == (FIGSIZE[0] * DPI, FIGSIZE[1] * DPI)
    assert "## Errors and warnings in worker logs" in report and "[driver] start" in report


def test_nan_loss_stops_the_run_with_the_alert(classify_cfg, tmp_path, monkeypatch):
    monkeypatch.setenv("SCALETRAIN_FAULTS", "nan:1:7")
    cfg = _cfg(classify_cfg, tmp_path, "nan")
    cfg.checkpoint.save_steps = 5
    with pytest.raises(TrainingError, match=r"loss is not finite at step 7.*the last checkpoint, step-5, is intact"):
        run_job(cfg, tmp_path / "c.yaml", show_progress=False)
    run = tmp_path / "runs" / "nan"
    alerts = [json.loads(ln) for ln in (run / "alerts.jsonl").read_text().splitlines()]
    nan = [a for a in alerts if a["rule"] == "non_finite_loss"]
    assert len(nan) == 1 and nan[0]["step"] == 7 and nan[0]["severity"] == "error"
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-5"]  # nothing saved after the NaN
    assert "alert: non_finite_loss" in (run / "logs" / "main.log").read_text()
    assert "Status: **failed**" in (run / "report.md").read_text()
    steps = [r["step"] for r in read_jsonl(run / "metrics.jsonl") if r["kind"] == "train"]
    assert max(steps) <= 6


def test_a_slowed_rank_is_named_with_its_node_and_cause_within_20_steps(classify_cfg, tmp_path, monkeypatch):
    """One rank's device made slow (SCALETRAIN_FAULTS slow: 250 ms more per step from step 3): in synchronous
    training every rank's step time becomes the slow one's, yet the alert names rank 1, its node, what the
    others wait and the device as the cause, by step 23."""
    monkeypatch.setenv("SCALETRAIN_FAULTS", "slow:1:3:250")
    cfg = _cfg(classify_cfg, tmp_path, "slow")
    cfg.train.max_steps, cfg.train.logging_steps = 24, 1
    run_job(cfg, tmp_path / "c.yaml", show_progress=False)
    alerts = [a for a in read_jsonl(tmp_path / "runs" / "slow" / "alerts.jsonl") if a["rule"] == "straggler"]
    assert alerts and alerts[0]["rank"] == 1 and alerts[0]["step"] <= 23, alerts
    message = alerts[0]["message"]
    assert "rank 1 on node " in message and "the other ranks wait" in message and "cause: device" in message
    train = [r for r in read_jsonl(tmp_path / "runs" / "slow" / "metrics.jsonl") if r["kind"] == "train"]
    late = train[-1]["ranks/ready_s"]
    assert late[1] - late[0] > 0.2  # the slow rank reaches the sync 250 ms later; its step time is everyone's
