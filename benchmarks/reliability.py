"""Reliability numbers for benchmarks/RESULTS.md (issue: reliability), measured on a local Ray with gloo.

- time from a worker's SIGKILL to training resumed (first metric record after the restart)
- time from a rank hanging before a collective to the driver's error (comm.timeout_s=10)
- bit-exact comparison of final weights: uninterrupted vs killed-and-restarted

Usage: .venv/bin/python benchmarks/reliability.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch
from safetensors.torch import load_file

from scaletrain.config import validate
from scaletrain.data.demo import sentiment_rows
from scaletrain.errors import TrainingError
from scaletrain.launch.job import run_job
from scaletrain.metrics.records import read_jsonl


def config(data: Path, out: Path, name: str, **extra) -> dict:
    cfg = {"model": {"name_or_path": "builtin:tiny-bert"},
           "data": {"train_file": str(data), "eval_ratio": 0.2, "max_length": 32},
           "train": {"per_device_train_batch_size": 8, "learning_rate": 1e-3, "max_steps": 40, "logging_steps": 1},
           "scaling": {"num_workers": 2}, "checkpoint": {"save_steps": 5, "save_total_limit": 2},
           "output": {"output_dir": str(out), "run_name": name}}
    for section, values in extra.items():
        cfg.setdefault(section, {}).update(values)
    return cfg


def run(cfg: dict):
    return run_job(validate(cfg), "bench.yaml", show_progress=False)


def kill_and_resume(data: Path, out: Path, name: str) -> tuple[float, Path]:
    run_dir = out / name
    marks = {}

    def killer():
        while True:
            recs = [r for r in read_jsonl(run_dir / "metrics.jsonl") if r.get("kind") == "train"]
            if recs and recs[-1]["step"] >= 12:
                marks["kill"] = time.time()
                os.kill(int((run_dir / "pids" / "rank-1.pid").read_text()), signal.SIGKILL)
                return
            time.sleep(0.02)

    threading.Thread(target=killer, daemon=True).start()
    run(config(data, out, name, fault_tolerance={"max_failures": 1}))
    after = [r["time"] for r in read_jsonl(run_dir / "metrics.jsonl")
             if r.get("kind") == "train" and r["time"] > marks["kill"]]
    return after[0] - marks["kill"], run_dir


def hang_to_error(data: Path, out: Path, name: str) -> float:
    os.environ["SCALETRAIN_FAULTS"] = "hang:1:6"
    try:
        run(config(data, out, name, comm={"timeout_s": 10}, fault_tolerance={"hang_retries": 0}))
    except TrainingError:
        failed = time.time()
    finally:
        os.environ.pop("SCALETRAIN_FAULTS", None)
    hung = json.loads((out / name / "heartbeat" / "rank-1.json").read_text())["since"]
    return failed - hung


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")
    import ray

    ray.init(num_cpus=2, log_to_driver=False, include_dashboard=False, logging_level=logging.WARNING)
    work = Path(tempfile.mkdtemp(prefix="scaletrain-bench-"))
    data = work / "s.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in sentiment_rows(400, seed=1)))
    ref = load_file(run(config(data, work, "ref")).run_dir / "final" / "model.safetensors")
    resume_s, hang_s, exact = [], [], []
    for i in range(args.repeats):
        seconds, run_dir = kill_and_resume(data, work, f"kill{i}")
        resume_s.append(seconds)
        got = load_file(run_dir / "final" / "model.safetensors")
        exact.append(all(torch.equal(ref[k], got[k]) for k in ref))
        hang_s.append(hang_to_error(data, work, f"hang{i}"))
    print(f"worker SIGKILL -> training resumed: median {statistics.median(resume_s):.1f} s  runs "
          f"{[round(s, 1) for s in resume_s]}")
    print(f"rank hang -> driver error (comm.timeout_s=10): median {statistics.median(hang_s):.1f} s  runs "
          f"{[round(s, 1) for s in hang_s]}")
    print(f"final weights bit-identical to the uninterrupted run: {sum(exact)}/{len(exact)}")
    ray.shutdown()
    sys.exit(0 if all(exact) else 1)


if __name__ == "__main__":
    main()
