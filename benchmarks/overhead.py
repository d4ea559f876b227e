"""scaletrain's steady-state throughput vs a hand-written torch DDP loop, and its 2-worker scaling efficiency.

Part 1, overhead: builtin:minilm classification (full fine-tuning), world size 2, gloo, 1 thread per worker:
a hand-written DDP loop (with torch's default AdamW, and with the fused AdamW scaletrain uses) vs scaletrain
with the Ray launcher, with the torchrun launcher, and its worker loop alone ("loop": ``train()`` in processes
started like the hand-written loop's, so the launcher's share of any gap shows). Part 2,
efficiency: the scale benchmark config (examples/scale_lora.yaml: LoRA, ~64-token reviews) at 1 and 2
workers, for the hand-written loop and both launchers. Every variant trains on the same tokenized data in the
same sample order (DistributedSampler with the config's seed is scaletrain's order) and reports global
samples/s over the measured steps after a warm-up: total samples / total time. Variants alternate within
each round, in reverse order every other round (so none always runs first or last); the script prints
per-round numbers and medians.

No Ray is running while the hand-written loop and the torchrun launcher are timed: an idle local Ray takes
~6% of a core here, which a 2-worker run on 2 cores feels. Each Ray-launcher run starts its own embedded Ray,
as `scaletrain train` does, so the Ray runtime's CPU (controller and helper actors, raylet, GCS) is part of
what it measures.

Usage: .venv/bin/python benchmarks/overhead.py [--rounds 3] [--warmup 5] [--steps 20] [--part overhead|efficiency|all]
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scaletrain.config import load_config  # noqa: E402
from scaletrain.config.schema import Config  # noqa: E402
from scaletrain.data.demo import write_demo_data  # noqa: E402
from scaletrain.metrics.records import read_jsonl  # noqa: E402

OVERHEAD_CONFIG = ROOT / "examples" / "classify.yaml"
EFFICIENCY_CONFIG = ROOT / "examples" / "scale_lora.yaml"


def config(path: Path, data_dir: Path, out: Path, name: str, workers: int, launcher: str, warmup: int,
           steps: int) -> Config:
    os.environ["DEMO_DATA"] = str(data_dir)
    return load_config(path, [f"train.max_steps={warmup + steps}", f"train.logging_steps={warmup}",
                              "train.eval_steps=0", "checkpoint.save_steps=0", f"scaling.num_workers={workers}",
                              f"scaling.launcher={launcher}", "monitor.report=false",
                              f"output.output_dir={out}", f"output.run_name={name}"])


def _bare_worker(rank, world, store, out, cfg_json, train_path, pad, vocab, warmup, steps, fused=False,
                 agree=False):
    """The hand-written loop: DDP, AdamW (torch's default, or fused as scaletrain uses), gradient clipping.

    With ``agree``, a blocking 2-float MAX all-reduce after every step (benchmarks/step_check_cost.py)."""
    torch.set_num_threads(1)
    if world > 1:
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    from scaletrain.data import Collator, load_split
    from scaletrain.model.build import build_model
    from scaletrain.model.tokenizer import Vocab

    cfg = Config.model_validate(cfg_json)
    t = cfg.train
    torch.manual_seed(t.seed)
    model = build_model(cfg.model, Vocab(vocab, pad))
    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model, broadcast_buffers=False)
    model.train()  # from_pretrained returns eval mode: dropout off would make this loop do less work
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=t.learning_rate, weight_decay=t.weight_decay,
                            **({"fused": True} if fused else {}))
    data = load_split(train_path)
    sampler = torch.utils.data.DistributedSampler(data, world, rank, seed=t.seed, drop_last=True)
    loader = iter(torch.utils.data.DataLoader(data, t.per_device_train_batch_size, sampler=sampler,
                                              collate_fn=Collator(pad), drop_last=True))
    samples = 0
    for i in range(warmup + steps):
        if i == warmup:
            if world > 1:
                dist.barrier()
            t0 = time.perf_counter()
        batch = next(loader)
        loss = model(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, t.max_grad_norm)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if agree:  # [loss is not finite, stop file seen], MAX over ranks, waited for at once
            flags = torch.tensor([0.0 if torch.isfinite(loss).item() else 1.0, 0.0])
            dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        samples += batch["input_ids"].shape[0] * world if i >= warmup else 0
    if world > 1:
        dist.barrier()
    if rank == 0:
        out.put(samples / (time.perf_counter() - t0))
    if world > 1:
        dist.destroy_process_group()


def bare(cfg: Config, prepared: tuple, warmup: int, steps: int, world: int, fused: bool = False,
         agree: bool = False) -> float:
    train_path, pad, vocab = prepared
    return spawn(_bare_worker, world, cfg.model_dump(mode="json"), train_path, pad, vocab, warmup, steps, fused,
                 agree)


def spawn(target, world: int, *args) -> float:
    """Run ``target(rank, world, store, queue, *args)`` in ``world`` fresh processes; the value rank 0 puts."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    store = tempfile.mktemp(prefix="bare-ddp-")
    procs = [ctx.Process(target=target, args=(r, world, store, q, *args)) for r in range(world)]
    for p in procs:
        p.start()
    while True:  # a worker that dies (e.g. its data runs out) fails the benchmark instead of hanging it
        try:
            value = q.get(timeout=5)
            break
        except queue.Empty:
            if any(p.exitcode not in (None, 0) for p in procs):
                for p in procs:
                    p.kill()
                raise RuntimeError(f"{target.__name__}: a worker exited with {[p.exitcode for p in procs]}") from None
    for p in procs:
        p.join()
    return value


def ours(cfg: Config, warmup: int) -> float:
    """scaletrain through a launcher: global samples/s over the steps after the warm-up."""
    from scaletrain.launch.job import run_job

    return measured(run_job(cfg, f"{cfg.output.run_name}.yaml", show_progress=False).run_dir, cfg, warmup)


def _loop_worker(rank, world, store, out, spec):
    """scaletrain's worker loop in a plain process: the launcher's share of the overhead left out."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    from scaletrain.comm.context import DistContext
    from scaletrain.worker.loop import train
    from scaletrain.worker.spec import JobSpec

    ctx = DistContext(world_rank=rank, local_rank=rank, world_size=world, local_world_size=world, node_rank=0,
                      device="cpu", backend="gloo", node_id="local")
    train(ctx, JobSpec(**spec))
    dist.destroy_process_group()
    if rank == 0:
        out.put(0.0)


def loop_only(cfg: Config, prepared: tuple, warmup: int, steps: int, run_dir: Path) -> float:
    train_path, pad, vocab = prepared
    run_dir.mkdir(parents=True)
    spec = dict(config=cfg.model_dump(mode="json"), run_dir=str(run_dir), train_path=train_path,
                eval_path=train_path, pad_token_id=pad, vocab_size=vocab, backend="gloo",
                total_steps=warmup + steps, learning_rate=cfg.train.learning_rate)
    spawn(_loop_worker, 2, spec)
    return measured(run_dir, cfg, warmup)


def measured(run_dir: Path, cfg: Config, warmup: int) -> float:
    """Global samples/s over the steps after the warm-up, from a run's metric records."""
    train = [r for r in read_jsonl(run_dir / "metrics.jsonl") if r["kind"] == "train" and r["step"] > warmup]
    seconds = sum(r["time/step_s"] * cfg.train.logging_steps for r in train)
    samples = sum(r["throughput/samples_per_s"] * r["time/step_s"] * cfg.train.logging_steps for r in train)
    return samples / seconds


def prepare(cfg: Config, out: Path) -> tuple:
    from scaletrain.data import prepare_data
    from scaletrain.model.tokenizer import load_tokenizer

    tok = load_tokenizer(cfg.model.name_or_path)
    prepared = prepare_data(cfg, tok)
    train_path, _ = prepared.save(out)
    return train_path, prepared.pad_token_id, len(tok)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--part", choices=("overhead", "efficiency", "all"), default="all")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="scaletrain-overhead-"))
    data_dir = write_demo_data(work / "data", n_sentiment=4000, n_reviews=4000)  # enough for --steps 100
    w, s = args.warmup, args.steps
    cfg = lambda path, name, n, launcher="ray": config(path, data_dir, work, name, n, launcher, w, s)
    results: dict[str, list[float]] = {}

    def record(key: str, value: float) -> None:
        results.setdefault(key, []).append(value)

    parts = ("overhead", "efficiency") if args.part == "all" else (args.part,)
    prepared = {p: prepare(cfg(OVERHEAD_CONFIG if p == "overhead" else EFFICIENCY_CONFIG, f"prep-{p}", 2),
                           work / f"prep-{p}") for p in parts}
    for i in range(args.rounds):
        runs: list[tuple[str, Callable[[], float]]] = []
        if "overhead" in parts:
            o = {launcher: cfg(OVERHEAD_CONFIG, f"o-{launcher}{i}", 2, launcher) for launcher in ("ray", "torchrun")}
            runs += [("overhead/bare", partial(bare, o["ray"], prepared["overhead"], w, s, 2)),
                     ("overhead/bare-fused", partial(bare, o["ray"], prepared["overhead"], w, s, 2, fused=True)),
                     ("overhead/loop", partial(loop_only, o["ray"], prepared["overhead"], w, s, work / f"o-loop{i}")),
                     ("overhead/ray", partial(ours, o["ray"], w)),
                     ("overhead/torchrun", partial(ours, o["torchrun"], w))]
        if "efficiency" in parts:
            for n in (1, 2):
                e = {launcher: cfg(EFFICIENCY_CONFIG, f"e{n}-{launcher}{i}", n, launcher)
                     for launcher in ("ray", "torchrun")}
                runs += [(f"efficiency/bare/{n}", partial(bare, e["ray"], prepared["efficiency"], w, s, n)),
                         (f"efficiency/torchrun/{n}", partial(ours, e["torchrun"], w)),
                         (f"efficiency/ray/{n}", partial(ours, e["ray"], w))]
        for key, run in runs if i % 2 == 0 else runs[::-1]:  # no variant always runs first or last
            record(key, run())
        print(f"round {i}: " + ", ".join(f"{k} {v[-1]:.2f}" for k, v in results.items()), flush=True)
    med = {k: statistics.median(v) for k, v in results.items()}
    print("\nsamples/s, medians over rounds:", json.dumps({k: round(v, 2) for k, v in med.items()}))
    if "overhead" in parts:
        for base, what in (("bare", "torch's default AdamW"), ("bare-fused", "fused AdamW, as scaletrain")):
            for launcher in ("ray", "torchrun", "loop"):
                ratios = [x / y for x, y in zip(results[f"overhead/{launcher}"], results[f"overhead/{base}"])]
                print(f"overhead: scaletrain ({launcher}) / hand-written DDP with {what}, 2 workers, full MiniLM: "
                      f"median ratio {statistics.median(ratios):.3f} (rounds {', '.join(f'{r:.3f}' for r in ratios)}; "
                      f"target >= 0.97)")
    if "efficiency" in parts:
        effs = {variant: [two / (2 * one) for one, two in zip(results[f"efficiency/{variant}/1"],
                                                              results[f"efficiency/{variant}/2"])]
                for variant in ("bare", "torchrun", "ray")}
        for variant, e in effs.items():
            print(f"efficiency: {variant:>8}, scale_lora 1 -> 2 workers: median {statistics.median(e):.1%} "
                  f"(rounds {', '.join(f'{x:.1%}' for x in e)}; target >= 92%)")
        for variant in ("torchrun", "ray"):  # on a noisy day the machine moves every variant's efficiency
            rel = [x / y for x, y in zip(effs[variant], effs["bare"])]
            print(f"efficiency: {variant:>8} / hand-written in the same round: median {statistics.median(rel):.3f} "
                  f"(rounds {', '.join(f'{x:.3f}' for x in rel)})")


if __name__ == "__main__":
    main()
