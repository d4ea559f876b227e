"""scale and parity on the shared local Ray: files, columns, speedup = throughput ratio; parity pass/fail."""

import csv
import json

import pytest
import yaml

from scaletrain import cli

pytestmark = pytest.mark.ray


def _write(cfg, tmp_path):
    cfg = json.loads(json.dumps(cfg))
    cfg["output"] = {"output_dir": str(tmp_path / "runs")}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_scale_1_2_workers_writes_the_table(classify_cfg, tmp_path, ray_local, no_orphans):
    path = _write(classify_cfg, tmp_path)
    assert cli.main(["scale", str(path), "--workers", "1,2,4", "--warmup", "2", "--steps", "6",
                     "--breakdown-every", "2"]) == 0
    out = next((tmp_path / "runs").glob("scale-c-*"))
    for name in ("scaling.md", "scaling.csv", "scaling.json", "scaling.png"):
        assert (out / name).is_file()
    rows = json.loads((out / "scaling.json").read_text())
    one, two, four = rows
    assert four["workers"] == 4 and "skipped" in four["note"]  # the shared instance has 2 CPUs
    # 2 CPU workers take both CPUs: the row says why its efficiency is low; 1 worker leaves a CPU to Ray.
    assert one["note"] == "" and "Ray's processes share the workers' CPUs" in two["note"]
    assert two["speedup"] == pytest.approx(two["samples_per_s"] / one["samples_per_s"])
    assert two["efficiency"] == pytest.approx(two["speedup"] / 2)
    assert one["exposed_comm_share"] == 0.0 and two["exposed_comm_share"] is not None
    assert 0 <= two["data_wait_share"] < 1 and one["mfu"] is None  # CPU: MFU n/a
    with open(out / "scaling.csv") as f:
        header = next(csv.reader(f))
    for col in ("workers", "samples_per_s", "tokens_per_s", "speedup", "efficiency", "step_time_s", "train_time_s",
                "eval_time_s", "peak_memory_gib", "exposed_comm_share", "data_wait_share", "mfu"):
        assert col in header
    breakdown = [json.loads(ln) for ln in (out / "workers-2" / "metrics.jsonl").read_text().splitlines()
                 if '"breakdown"' in ln]
    parts = ("data_wait", "compute", "exposed_comm", "optimizer")
    assert breakdown and all(abs(sum(r[f"share/{k}"] for k in parts) - 1)
                             < 1e-9 for r in breakdown)


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_parity_passes_for_a_correct_config(classify_cfg, tmp_path, ray_local, capsys, strategy, no_orphans):
    classify_cfg["train"].update(strategy=strategy, per_device_train_batch_size=8)
    assert cli.main(["parity", str(_write(classify_cfg, tmp_path)), "--workers", "2", "--steps", "8"]) == 0
    assert "PASS" in capsys.readouterr().err


def test_parity_fails_when_lr_scaling_is_wrong(classify_cfg, tmp_path, ray_local, capsys, no_orphans):
    classify_cfg["train"].update(lr_scaling="linear", per_device_train_batch_size=8)  # doubles the LR at 2 workers
    assert cli.main(["parity", str(_write(classify_cfg, tmp_path)), "--workers", "2", "--steps", "8"]) == 1
    err = capsys.readouterr().err.replace("\n", " ")
    assert "FAIL" in err and "learning rate 0.001 on 1 worker but 0.002 on 2" in err
