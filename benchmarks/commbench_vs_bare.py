"""commbench's all_reduce busbw vs a bare torch.distributed loop, same sizes and iterations, one invocation.

Target (issue: preflight and communication): within 5% at >= 16 MB. Both run inside the same 2 Ray Train
workers (gloo), alternating round by round (bare, commbench, bare, ...), so process start-up and placement
cannot favour either side; medians per size are compared.

Usage: .venv/bin/python benchmarks/commbench_vs_bare.py [--rounds 5] [--iters 20]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import tempfile
import time
from pathlib import Path

SIZES = (16 * 1024**2, 32 * 1024**2, 64 * 1024**2)


def _bare_busbw(size: int, iters: int, warmup: int) -> float:
    import torch
    import torch.distributed as dist

    from scaletrain.comm.bench import bandwidths

    t = torch.ones(size // 4)
    for _ in range(warmup):
        dist.all_reduce(t)
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(t)
    us = (time.perf_counter() - t0) / iters * 1e6
    us_all = torch.tensor([us], dtype=torch.float64)
    dist.all_reduce(us_all)
    return bandwidths("all_reduce", size, us_all.item() / dist.get_world_size(), dist.get_world_size())[1]


def _entry(config: dict) -> None:
    from scaletrain.comm.bench import BenchParams, run_benchmark
    from scaletrain.comm.context import context_from_ray

    ctx = context_from_ray("gloo")
    params = BenchParams(("all_reduce",), SIZES, "float32", config["warmup"], config["iters"], check=False)
    out = {"bare": {s: [] for s in SIZES}, "commbench": {s: [] for s in SIZES}}
    for _ in range(config["rounds"]):
        for s in SIZES:
            out["bare"][s].append(_bare_busbw(s, config["iters"], config["warmup"]))
        for row in run_benchmark(params, ctx.world_rank, ctx.world_size, ctx.device):
            out["commbench"][row.size].append(row.oop_busbw)
    if ctx.is_main:
        Path(config["result"]).write_text(json.dumps(out))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    args = ap.parse_args()
    os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")
    import ray

    from scaletrain.config.schema import CommConfig, ScalingConfig
    from scaletrain.launch import ray_launcher
    from scaletrain.launch.plan import plan_scaling

    ray.init(num_cpus=2, log_to_driver=False, include_dashboard=False, logging_level=logging.WARNING)
    out = Path(tempfile.mkdtemp(prefix="scaletrain-cb-"))
    scaling, comm = ScalingConfig(num_workers=2), CommConfig(backend="gloo")
    plan = plan_scaling(scaling, comm, ray_launcher.cluster_resources(), "cpu")
    ray_launcher.run_on_workers(_entry, {"rounds": args.rounds, "iters": args.iters, "warmup": args.warmup,
                                         "result": str(out / "r.json")}, scaling, plan,
                                {"OMP_NUM_THREADS": "1"}, str(out), 300)
    res = json.loads((out / "r.json").read_text())
    print(f"{'size':>10}  {'bare busbw':>11}  {'commbench':>10}  ratio   (GB/s, median of {args.rounds} alternating "
          f"rounds)")
    for s in SIZES:
        b, o = statistics.median(res["bare"][str(s)]), statistics.median(res["commbench"][str(s)])
        print(f"{s:>10}  {b:11.3f}  {o:10.3f}  {o / b:5.3f}")
    ray.shutdown()


if __name__ == "__main__":
    main()
