"""What the loop's per-step rank agreement costs: a hand-written DDP loop with and without it.

scaletrain's loop all-reduces two floats after every optimizer step (`step_flags`: some rank's loss is NaN,
some rank saw the stop file) so that every rank takes the same decision at the same step. This script runs the
hand-written loop of benchmarks/overhead.py (MiniLM full fine-tuning, fused AdamW, 2 workers, gloo, 1 thread
each) plain and with that one extra all-reduce, alternating, and prints the median throughput ratio.

Usage: .venv/bin/python benchmarks/step_check_cost.py [--rounds 4]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))
import overhead as ov  # noqa: E402
from scaletrain.demo_data import write_demo_data  # noqa: E402


def worker(rank, world, store, out, cfg_json, train_path, pad, vocab, warmup, steps, flags):
    """overhead.py's hand-written loop with fused AdamW; with ``flags``, step_flags' all-reduce after each step."""
    from scaletrain.config.schema import Config
    from scaletrain.data import Collator, load_split
    from scaletrain.model import build_model

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    cfg = Config.model_validate(cfg_json)
    t = cfg.train
    torch.manual_seed(t.seed)
    model = torch.nn.parallel.DistributedDataParallel(build_model(cfg.model, vocab, pad), broadcast_buffers=False)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=t.learning_rate, weight_decay=t.weight_decay, fused=True)
    data = load_split(train_path)
    sampler = torch.utils.data.DistributedSampler(data, world, rank, seed=t.seed, drop_last=True)
    loader = iter(torch.utils.data.DataLoader(data, t.per_device_train_batch_size, sampler=sampler,
                                              collate_fn=Collator(pad), drop_last=True))
    for i in range(warmup + steps):
        if i == warmup:
            dist.barrier()
            t0 = time.perf_counter()
        loss = model(**next(loader)).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, t.max_grad_norm)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if flags:  # what step_flags does: [loss is not finite, stop file seen], MAX over ranks
            agree = torch.tensor([0.0 if torch.isfinite(loss).item() else 1.0, 0.0])
            dist.all_reduce(agree, op=dist.ReduceOp.MAX)
    dist.barrier()
    if rank == 0:
        out.put(steps * world * t.per_device_train_batch_size / (time.perf_counter() - t0))
    dist.destroy_process_group()


def run(cfg, prepared, warmup: int, steps: int, flags: bool) -> float:
    train_path, pad, vocab = prepared
    return ov.spawn(worker, 2, cfg.model_dump(mode="json"), train_path, pad, vocab, warmup, steps, flags)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=4)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="scaletrain-step-check-"))
    data_dir = write_demo_data(work / "data", n_sentiment=2000)
    cfg = ov.config(ov.OVERHEAD_CONFIG, data_dir, work, "x", 2, "torchrun", 5, 20)
    prepared = ov.prepare(cfg, work / "prep")
    r = {True: [], False: []}
    for i in range(args.rounds):
        for with_flags in (False, True):
            r[with_flags].append(run(cfg, prepared, 5, 20, with_flags))
        print(f"round {i}: samples/s without {r[False][-1]:.2f}, with {r[True][-1]:.2f}", flush=True)
    ratios = [a / b for a, b in zip(r[True], r[False])]
    print(f"with the per-step 2-float all-reduce / without: median ratio {statistics.median(ratios):.3f} "
          f"(rounds {', '.join(f'{x:.3f}' for x in ratios)})")


if __name__ == "__main__":
    main()
