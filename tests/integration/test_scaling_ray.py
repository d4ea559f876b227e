"""scale on the shared local Ray: files, columns, speedup = throughput ratio, Ray's own CPUs said (parity pass/fail:
test_parity_sft.py, under torchrun)."""

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
