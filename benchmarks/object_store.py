"""A run directory on object storage vs a local disk, measured side by side (rounds alternate, medians).

Part ``checkpoint``: one process (a gloo group of 1) saves a ~25M-parameter model with its AdamW states (~300 MB
a checkpoint) through the Checkpointer, to the local disk (LocalStorage) and to an S3 API server on loopback
(moto in server mode: ObjectStorage), sync and async. The stall is what the training step waits (save() until it
returns); the total is until the checkpoint is committed (its manifest written).

Part ``relay``: the demo classification job (2 Ray workers, builtin:tiny-bert) with its run directory local and on
the S3 server; the median step time from metrics.jsonl; the difference is what the forwarder (workers' files to
the driver through Ray each second) and the mirror's uploads cost a step. Target: < 1% of the step time.

    python benchmarks/object_store.py --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def s3_server():
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    os.environ.update(AWS_ACCESS_KEY_ID="AKIABENCHMARKBENCH01", AWS_SECRET_ACCESS_KEY="b" * 40,
                      AWS_DEFAULT_REGION="us-east-1")
    endpoint = "http://127.0.0.1:%d" % server._server.server_address[1]
    import fsspec

    fsspec.filesystem("s3", endpoint_url=endpoint, skip_instance_cache=True).mkdir("bench")
    return server, endpoint


def checkpoint_part(rounds: int, endpoint: str, tmp: Path) -> dict:
    import torch
    import torch.distributed as dist

    from scaletrain.checkpoint import Checkpointer, checkpoints_of
    from scaletrain.comm.context import DistContext
    from scaletrain.config.schema import CheckpointConfig
    from scaletrain.storage.uri import Store

    dist.init_process_group("gloo", init_method=f"file://{tmp / 'pg'}", rank=0, world_size=1)
    ctx = DistContext(0, 0, 1, 1, 0, "cpu", "gloo")
    model = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(24)])  # 25.2M parameters
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(4, 1024)).sum().backward()
    optimizer.step()
    results: dict = {}
    step = 0
    for _ in range(rounds):
        for where in ("local", "s3"):
            for mode in ("sync", "async"):
                store = Store.of(f"s3://bench/{mode}", endpoint) if where == "s3" else None
                root, storage = checkpoints_of(tmp / f"{where}-{mode}", store)
                ckpt = Checkpointer(root, ctx, CheckpointConfig(save_total_limit=1, async_save=mode == "async"),
                                    model, optimizer, trainable_only=False, states={}, storage=storage)
                step += 1
                t0 = time.perf_counter()
                ckpt.save(step, {"world_size": 1, "accumulation": 1})
                stall = time.perf_counter() - t0
                ckpt.flush()
                total = time.perf_counter() - t0
                results.setdefault(f"{where} {mode}", []).append((stall, total))
    dist.destroy_process_group()
    return {k: {"stall_s": statistics.median(s for s, _ in v), "total_s": statistics.median(t for _, t in v)}
            for k, v in results.items()}


def relay_part(rounds: int, endpoint: str, tmp: Path, steps: int) -> dict:
    import ray

    from scaletrain.config import validate
    from scaletrain.data.demo import sentiment_rows
    from scaletrain.launch.job import run_job
    from scaletrain.metrics.records import read_jsonl

    data = tmp / "sentiment.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in sentiment_rows(2000, seed=1)))
    ray.init(num_cpus=2, log_to_driver=False, include_dashboard=False)
    times: dict[str, list[float]] = {"local": [], "s3": []}
    busy: list[float] = []
    for r in range(rounds):
        for where in ("local", "s3"):
            out = f"s3://bench/runs{r}" if where == "s3" else str(tmp / f"runs{r}")
            cfg = validate({
                "model": {"name_or_path": "builtin:tiny-bert", "task": "sequence-classification", "num_labels": 2},
                "data": {"train_file": str(data), "eval_ratio": 0.05, "max_length": 64},
                "train": {"per_device_train_batch_size": 16, "max_steps": steps, "logging_steps": 1, "seed": 7},
                "scaling": {"num_workers": 2}, "checkpoint": {"save_steps": 0}, "monitor": {"report": False},
                "output": {"output_dir": out, "run_name": where},
                "storage": {"endpoint_url": endpoint, "mirror_dir": str(tmp / "mirror"),
                            "node_dir": str(tmp / "nodes"), "sync_interval_s": 30}})
            run = run_job(cfg, tmp / "bench.yaml", show_progress=False).run_dir
            step_s = [rec["time/step_s"] for rec in read_jsonl(Path(run) / "metrics.jsonl")
                      if rec.get("kind") == "train" and rec["step"] > 5]  # past the first steps' warm-up
            times[where].append(statistics.median(step_s))
            if where == "s3":  # the forwarder's own time: what it takes from the worker, directly
                for log in sorted((Path(run) / "logs").glob("worker-*.log")):
                    busy.extend(float(m) for m in re.findall(r"forwarder: .*\(([\d.]+)% of", log.read_text()))
    ray.shutdown()
    local, s3 = statistics.median(times["local"]), statistics.median(times["s3"])
    return {"local_step_s": local, "s3_step_s": s3, "overhead_pct": 100 * (s3 / local - 1), "rounds": times,
            "forwarder_pct": statistics.median(busy) if busy else float("nan")}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--part", choices=("checkpoint", "relay", "both"), default="both")
    args = p.parse_args()
    server, endpoint = s3_server()
    try:
        with tempfile.TemporaryDirectory() as d:
            if args.part in ("checkpoint", "both"):
                for name, r in checkpoint_part(args.rounds, endpoint, Path(d)).items():
                    print(f"CHECKPOINT {name:12s} stall {r['stall_s']:.2f} s, committed after {r['total_s']:.2f} s")
            if args.part in ("relay", "both"):
                r = relay_part(args.rounds, endpoint, Path(d), args.steps)
                print(f"RELAY step local {r['local_step_s'] * 1000:.1f} ms, s3 {r['s3_step_s'] * 1000:.1f} ms: "
                      f"{r['overhead_pct']:+.2f}%; the forwarder busy {r['forwarder_pct']:.3f}% of a worker's wall "
                      f"time (rounds {r['rounds']})")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
