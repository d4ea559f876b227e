"""What every end-to-end run must leave, on any launcher: the run directory, its logs, metrics, summary and goodput
account, and every rank's eval equal."""

import json
import re
from pathlib import Path

import pytest
import yaml

from scaletrain.config import validate
from scaletrain.launch.job import run_job
from scaletrain.metrics.goodput import CATEGORIES
from scaletrain.metrics.records import read_jsonl


def run(cfg_dict, tmp_path, name, launcher: str | None = None):
    """``cfg_dict`` as run ``name`` under tmp_path/runs; ``launcher`` sets scaling.launcher (else auto: the shared
    Ray where the test runs with it)."""
    scaling = {**cfg_dict.get("scaling", {}), **({"launcher": launcher} if launcher else {})}
    cfg_dict = {**cfg_dict, "scaling": scaling,
                "output": {**cfg_dict.get("output", {}), "output_dir": str(tmp_path / "runs"), "run_name": name}}
    return run_job(validate(cfg_dict), tmp_path / f"{name}.yaml", show_progress=False)


def rank_evals(run_dir: Path, world: int) -> list[dict]:
    out = []
    for r in range(world):
        text = (run_dir / "logs" / f"worker-{r}.log").read_text()
        out.append(json.loads(re.findall(r"eval step \d+: (\{.*\})", text)[-1]))
    return out


def check_run_dir(run_dir: Path, world: int, total_steps: int):
    cfg = yaml.safe_load((run_dir / "config.resolved.yaml").read_text())
    assert cfg["scaling"]["num_workers"] == world
    main_log = (run_dir / "logs" / "main.log").read_text()
    for event in ("[driver] start", "workers up", "eval", "finish"):
        assert event in main_log, event
    assert sorted(p.name for p in (run_dir / "logs").glob("worker-*.log")) == [f"worker-{r}.log" for r in range(world)]
    records = read_jsonl(run_dir / "metrics.jsonl")
    train = [r for r in records if r["kind"] == "train"]
    assert train[-1]["step"] == total_steps
    for key in ("train/loss", "train/lr", "throughput/samples_per_s", "throughput/tokens_per_s", "time/step_s",
                "time/data_wait_s", "memory/rss_gib", "system/cpu_pct", "epoch"):
        assert all(key in r for r in train), key
    assert all(r["throughput/samples_per_s"] > 0 and r["scaling/workers"] == world for r in train)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["world_size"] == world and summary["steps"] == total_steps
    assert summary["train_time_s"] > 0 and summary["eval_time_s"] > 0 and summary["final"]["eval/loss"] > 0
    parts = [v for k, v in summary.items() if k.startswith("goodput/") and k.endswith("_s") and k != "goodput/wall_s"]
    assert len(parts) == len(CATEGORIES) and summary["goodput/interruptions"] == 0  # every category, adding up to
    # the wall time
    assert sum(parts) == pytest.approx(summary["goodput/wall_s"], rel=0.01) and summary["goodput/other_s"] >= 0
    assert summary["goodput/productive_s"] > 0 and summary["goodput/cluster_start_s"] > 0
    return summary
