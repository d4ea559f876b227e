"""scaletrain's steady-state throughput vs a hand-written torch DDP loop (issue: prove the scaling).

Same model (builtin:minilm classification), data, per-device batch, world size 2, gloo, 1 thread per worker.
Rounds alternate (bare, scaletrain, bare, ...); each reports global samples/s over the measured steps after
a warm-up. Prints the median ratio (target >= 0.97) and scaletrain's own 1 -> 2 worker scaling efficiency.

Usage: .venv/bin/python benchmarks/overhead.py [--rounds 3] [--warmup 5] [--steps 20]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scaletrain.config import validate  # noqa: E402
from scaletrain.demo_data import sentiment_rows  # noqa: E402

BATCH, SEQ = 16, 32


def config(data: Path, out: Path, name: str, workers: int, warmup: int, steps: int):
    return validate({"model": {"name_or_path": "builtin:minilm"},
                     "data": {"train_file": str(data), "eval_ratio": 0.05, "max_length": SEQ},
                     "train": {"per_device_train_batch_size": BATCH, "max_steps": warmup + steps,
                               "logging_steps": warmup, "learning_rate": 5e-5, "max_grad_norm": 1.0},
                     "scaling": {"num_workers": workers}, "monitor": {"report": False},
                     "output": {"output_dir": str(out), "run_name": name}})


def _bare_worker(rank, world, store, train_path, pad, warmup, steps, out):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    from scaletrain.data import Collator, load_split
    from scaletrain.model import build_model
    from scaletrain.config.schema import ModelConfig

    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(build_model(ModelConfig(name_or_path="builtin:minilm"), 30522, pad))
    opt = torch.optim.AdamW(model.parameters(), lr=5e-5)
    data = load_split(train_path)
    sampler = torch.utils.data.DistributedSampler(data, world, rank, seed=0, drop_last=True)
    loader = iter(torch.utils.data.DataLoader(data, BATCH, sampler=sampler, collate_fn=Collator(pad), drop_last=True))
    for i in range(warmup + steps):
        if i == warmup:
            dist.barrier()
            t0 = time.perf_counter()
        batch = next(loader)
        loss = model(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
    dist.barrier()
    if rank == 0:
        out.put(steps * BATCH * world / (time.perf_counter() - t0))
    dist.destroy_process_group()


def bare(train_path: str, pad: int, warmup: int, steps: int, world: int = 2) -> float:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    store = tempfile.mktemp(prefix="bare-ddp-")
    procs = [ctx.Process(target=_bare_worker, args=(r, world, store, train_path, pad, warmup, steps, q))
             for r in range(world)]
    for p in procs:
        p.start()
    value = q.get(timeout=900)
    for p in procs:
        p.join()
    return value


def ours(data: Path, out: Path, name: str, workers: int, warmup: int, steps: int) -> float:
    from scaletrain.launch.job import run_job
    from scaletrain.scaling.sweep import measure

    result = run_job(config(data, out, name, workers, warmup, steps), "overhead.yaml", show_progress=False)
    return measure(result.run_dir, warmup, workers)["samples_per_s"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")
    import ray

    ray.init(num_cpus=2, log_to_driver=False, include_dashboard=False, logging_level=logging.WARNING)
    work = Path(tempfile.mkdtemp(prefix="scaletrain-overhead-"))
    data = work / "s.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in sentiment_rows(2000)))
    from scaletrain.data import prepare_data
    from scaletrain.model import load_tokenizer

    cfg = config(data, work, "prep", 2, args.warmup, args.steps)
    prepared = prepare_data(cfg, load_tokenizer("builtin:minilm"))
    train_path, _ = prepared.save(work / "prep")
    b, o, one = [], [], []
    for i in range(args.rounds):
        b.append(bare(train_path, prepared.pad_token_id, args.warmup, args.steps))
        o.append(ours(data, work, f"two{i}", 2, args.warmup, args.steps))
        one.append(ours(data, work, f"one{i}", 1, args.warmup, args.steps))
        print(f"round {i}: bare DDP {b[-1]:.2f} samples/s, scaletrain {o[-1]:.2f}, scaletrain 1 worker {one[-1]:.2f}",
              flush=True)
    ratio = statistics.median(x / y for x, y in zip(o, b))
    eff = statistics.median(o) / (2 * statistics.median(one))
    print(f"scaletrain / bare DDP throughput, 2 workers: median ratio {ratio:.3f} (target >= 0.97)")
    print(f"scaletrain 2-worker scaling efficiency: {eff:.1%} (median 2-worker {statistics.median(o):.2f} vs "
          f"1-worker {statistics.median(one):.2f} samples/s; target >= 92%)")
    ray.shutdown()


if __name__ == "__main__":
    main()
