"""commbench's all_reduce busbw vs a bare torch.distributed loop, same sizes and iterations, one invocation.

Target (issue: preflight and communication): within 5% at >= 16 MB. The bare loop runs in 2 processes started
with torch.multiprocessing (gloo, FileStore); commbench runs on 2 Ray Train workers. Rounds alternate
(bare, commbench, bare, ...) so machine noise hits both; the medians are compared.

Usage: .venv/bin/python benchmarks/commbench_vs_bare.py [--rounds 3] [--iters 20]
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from scaletrain.comm.bench import BenchParams, bandwidths
from scaletrain.launch.commbench import run_commbench

SIZES = (16 * 1024**2, 32 * 1024**2, 64 * 1024**2)


def _bare(rank: int, world: int, store: str, iters: int, warmup: int, out) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    times = {}
    for size in SIZES:
        t = torch.ones(size // 4)
        for _ in range(warmup):
            dist.all_reduce(t)
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(t)
        times[size] = (time.perf_counter() - t0) / iters * 1e6
    if rank == 0:
        out.put(times)
    dist.destroy_process_group()


def bare_round(iters: int, warmup: int) -> dict[int, float]:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    store = tempfile.mktemp(prefix="bare-store-")
    procs = [ctx.Process(target=_bare, args=(r, 2, store, iters, warmup, q)) for r in range(2)]
    for p in procs:
        p.start()
    times = q.get(timeout=600)
    for p in procs:
        p.join()
    return {s: bandwidths("all_reduce", s, t, 2)[1] for s, t in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    args = ap.parse_args()
    os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")
    import ray

    ray.init(num_cpus=2, log_to_driver=False, include_dashboard=False, logging_level=logging.WARNING)
    params = BenchParams(("all_reduce",), SIZES, "float32", args.warmup, args.iters, check=False)
    bare, ours = {s: [] for s in SIZES}, {s: [] for s in SIZES}
    for _ in range(args.rounds):
        for s, bw in bare_round(args.iters, args.warmup).items():
            bare[s].append(bw)
        rows = run_commbench(params, 2, "gloo", None, {"OMP_NUM_THREADS": "1"}, None, 300,
                             __import__("pathlib").Path(tempfile.mkdtemp()))
        for r in rows:
            ours[r.size].append(r.oop_busbw)
    print(f"{'size':>10}  {'bare busbw':>11}  {'commbench':>10}  ratio   (GB/s, median of {args.rounds} alternating rounds)")
    for s in SIZES:
        b, o = statistics.median(bare[s]), statistics.median(ours[s])
        print(f"{s:>10}  {b:11.3f}  {o:10.3f}  {o / b:5.3f}")
    ray.shutdown()


if __name__ == "__main__":
    main()
