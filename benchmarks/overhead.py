"""scaletrain's steady-state throughput vs a hand-written torch DDP loop, where a step's time goes under each
launcher, and 2-worker scaling efficiency.

Part 1, overhead: builtin:minilm classification (full fine-tuning), world size 2, gloo, 1 thread per worker: a
hand-written DDP loop with the fused AdamW scaletrain uses (as a user writes it, and with its threads bound to a
core each as scaletrain binds its workers: comm/cores.py) vs scaletrain's worker loop alone ("loop": ``train()``
in processes started like the hand-written loop's, so the launcher's share of any gap shows), the torchrun
launcher and the Ray launcher as shipped, and the Ray launcher with ``scaling.bind_cores=false``. It prints each
variant's samples/s over the rounds (median, range, coefficient of variation: the noise each path shows alone)
and each one's per-round ratio to the hand-written loop, and Ray's to torchrun's, with the 95% bootstrap
interval of the median.

Part 2, breakdown: one run under each launcher with ``monitor.breakdown_every=5``: a step's phases (data wait,
forward+backward, exposed gradient sync, optimizer), and, while the workers train, the CPU of each worker's
training thread (its share in the kernel, its page faults, how often it is preempted) and of its other threads,
and the CPU of every other process on the node (psutil and /proc, sampled every 0.5 s).

Part 3, efficiency: the scale benchmark config (examples/scale_lora.yaml: LoRA, ~64-token reviews) at 1 and 2
workers, for the hand-written loop and both launchers.

Every variant trains on the same tokenized data in the same sample order (DistributedSampler with the config's
seed is scaletrain's order) and reports global samples/s over the measured steps after a warm-up: total samples /
total time. Variants alternate within each round, in reverse order every other round (so none always runs first
or last). No Ray is running while the hand-written loop and the torchrun launcher are timed; each Ray-launcher
run starts its own embedded Ray, as `scaletrain train` does, so the Ray runtime's CPU is part of what it measures.

Usage: .venv/bin/python benchmarks/overhead.py [--rounds 5] [--warmup 5] [--steps 30]
                                                [--part overhead|breakdown|efficiency|all]
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import statistics
import sys
import tempfile
import threading
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
           steps: int, *extra: str) -> Config:
    os.environ["DEMO_DATA"] = str(data_dir)
    return load_config(path, [f"train.max_steps={warmup + steps}", f"train.logging_steps={warmup}",
                              "train.eval_steps=0", "checkpoint.save_steps=0", f"scaling.num_workers={workers}",
                              f"scaling.launcher={launcher}", "monitor.report=false",
                              f"output.output_dir={out}", f"output.run_name={name}", *extra])


def _bare_worker(rank, world, store, out, cfg_json, train_path, pad, vocab, warmup, steps, fused=False,
                 agree=False, bound=False):
    """The hand-written loop: DDP, AdamW (torch's default, or fused as scaletrain uses), gradient clipping.

    With ``agree``, a blocking 2-float MAX all-reduce after every step (benchmarks/step_check_cost.py); with
    ``bound``, its threads on a core of their own as scaletrain binds its workers (comm/cores.py)."""
    torch.set_num_threads(1)
    if bound:
        from scaletrain.comm.cores import bind_process, core_block, usable_cores

        bind_process(core_block(usable_cores(), rank, world, 1))
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
         agree: bool = False, bound: bool = False) -> float:
    train_path, pad, vocab = prepared
    return spawn(_bare_worker, world, cfg.model_dump(mode="json"), train_path, pad, vocab, warmup, steps, fused,
                 agree, bound)


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
                total_steps=warmup + steps, learning_rate=cfg.train.learning_rate, bind_cores=True)
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


OVERHEAD_VARIANTS = ("bare-fused", "bare-fused-bound", "loop", "torchrun", "ray", "ray-unbound")


def overhead_runs(cfg, prepared: tuple, work: Path, i: int, w: int, s: int) -> list[tuple[str, Callable[[], float]]]:
    """One round of the overhead part: the hand-written loop (as written, and with scaletrain's core binding),
    scaletrain's loop alone, and both launchers as shipped, plus Ray without the binding."""
    o = {v: cfg(OVERHEAD_CONFIG, f"o-{v}{i}", 2, v.split("-")[0], *(["scaling.bind_cores=false"] if "unbound" in v
                                                                  else []))
         for v in ("ray", "ray-unbound", "torchrun")}
    return [("overhead/bare-fused", partial(bare, o["ray"], prepared, w, s, 2, fused=True)),
            ("overhead/bare-fused-bound", partial(bare, o["ray"], prepared, w, s, 2, fused=True, bound=True)),
            ("overhead/loop", partial(loop_only, o["ray"], prepared, w, s, work / f"o-loop{i}")),
            ("overhead/torchrun", partial(ours, o["torchrun"], w)),
            ("overhead/ray", partial(ours, o["ray"], w)),
            ("overhead/ray-unbound", partial(ours, o["ray-unbound"], w))]


def spread(values: list[float]) -> str:
    """median, range and coefficient of variation of a list of per-round values."""
    cv = statistics.stdev(values) / statistics.mean(values) if len(values) > 1 else 0.0
    return f"median {statistics.median(values):.3f}, range {min(values):.3f}-{max(values):.3f}, CV {cv:.1%}"


def median_interval(values: list[float], draws: int = 2000, seed: int = 0) -> tuple[float, float]:
    """95% bootstrap interval of the median of ``values``."""
    import random

    rng = random.Random(seed)
    meds = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(draws))
    return meds[int(0.025 * draws)], meds[int(0.975 * draws) - 1]


def report_overhead(results: dict[str, list[float]]) -> None:
    print("\noverhead, samples/s of each variant alone over the rounds (the noise each path shows):")
    for v in OVERHEAD_VARIANTS:
        print(f"  {v:>17}: {spread(results[f'overhead/{v}'])}")
    base = results["overhead/bare-fused"]
    print("overhead, per-round ratios to the hand-written DDP loop (fused AdamW, as scaletrain), 2 workers, full "
          "MiniLM:")
    for v in OVERHEAD_VARIANTS[1:]:
        ratios = [x / y for x, y in zip(results[f"overhead/{v}"], base)]
        lo, hi = median_interval(ratios)
        print(f"  {v:>17}: {spread(ratios)}, 95% interval of the median {lo:.3f}-{hi:.3f} "
              f"(rounds {', '.join(f'{r:.3f}' for r in ratios)}; target >= 0.98)")
    ratios = [x / y for x, y in zip(results["overhead/ray"], results["overhead/torchrun"])]
    lo, hi = median_interval(ratios)
    print(f"  ray / torchrun: {spread(ratios)}, 95% interval of the median {lo:.3f}-{hi:.3f} (target >= 0.98)")


def breakdown(cfg, w: int, s: int) -> None:
    """Where a step goes under each launcher: the phases of scaletrain's breakdown probe, the CPU of each worker's
    training thread and of its other threads, how often the training thread is preempted, and the CPU of every
    other process on the node while the workers train (psutil, sampled every 0.5 s)."""
    from scaletrain.launch.job import run_job

    for launcher in ("torchrun", "ray"):
        c = cfg(OVERHEAD_CONFIG, f"b-{launcher}", 2, launcher, "monitor.breakdown_every=5")
        metrics = Path(c.output.output_dir) / c.output.run_name / "metrics.jsonl"
        samples: list[tuple[float, int, dict]] = []
        stop = threading.Event()
        sampler = threading.Thread(target=sample_processes, args=(metrics, samples, stop), daemon=True)
        sampler.start()
        run_dir = run_job(c, f"{c.output.run_name}.yaml", show_progress=False).run_dir
        stop.set()
        sampler.join()
        window = [x for x in samples if 1 <= x[1] < (w + s) // c.train.logging_steps]  # steady training
        (t0, _, a), (t1, _, b) = window[0], window[-1]
        seconds = t1 - t0
        probes = [r for r in read_jsonl(run_dir / "metrics.jsonl") if r["kind"] == "breakdown"]
        phases = {k: statistics.median(r[f"time/{k}_s"] for r in probes)
                  for k in ("data_wait", "compute", "exposed_comm", "optimizer")}
        print(f"\nbreakdown, {launcher}: {seconds:.1f} s of training; a step's phases (medians of {len(probes)} "
              f"probes): " + ", ".join(f"{k} {v * 1000:.1f} ms" for k, v in phases.items()))
        other = 0.0
        for pid, (name, cpu, threads) in sorted(b.items(), key=lambda kv: -kv[1][1]):
            used = cpu - a[pid][1] if pid in a else 0.0
            if used < 0.002 * seconds:
                continue
            line = f"  {100 * used / seconds:5.1f}% of a core  {name}"
            if threads:  # a worker: its training thread (the busiest) and the rest
                d = sorted(([x - y for x, y in zip(v, a[pid][2].get(tid, (0, 0, 0, 0)))] for tid, v in threads.items()),
                           reverse=True)
                cpu_s, sys_s, faults, preempted = d[0]
                kernel = 100 * sys_s / max(cpu_s, 1e-9)
                line += (f": training thread {100 * cpu_s / seconds:.1f}% ({kernel:.0f}% of it in the kernel, "
                         f"{faults / seconds:,.0f} page faults/s), preempted {preempted / seconds:.0f}/s; its "
                         f"{len(d) - 1} other threads {100 * sum(x[0] for x in d[1:]) / seconds:.1f}%")
            else:
                other += used
            print(line)
        print(f"  {100 * other / seconds:5.1f}% of a core in all the node's other processes")


def sample_processes(metrics: Path, samples: list, stop) -> None:
    """Every 0.5 s until ``stop``: (time, train records written so far, ``snapshot``)."""
    me = threading.get_native_id()
    while not stop.is_set():
        trains = sum(1 for line in metrics.open() if '"train"' in line) if metrics.exists() else 0
        samples.append((time.perf_counter(), trains, snapshot(me)))
        stop.wait(0.5)


def short_name(cmdline: str) -> str:
    """``ray::TrainController.run``, ``raylet``, ``log_monitor.py``, ``torchrun_agent``: a process's own name."""
    if cmdline.startswith("ray::"):
        return cmdline.split()[0]
    words = cmdline.split()
    if words and "python" not in words[0].split("/")[-1]:  # a program of its own: raylet, gcs_server
        return words[0].split("/")[-1]
    for i, w in enumerate(words):
        if w.endswith(".py") or (w == "-m" and i + 1 < len(words)):
            return w.split("/")[-1] if w != "-m" else words[i + 1].split(".")[-1]
    return words[0].split("/")[-1] if words else "?"


def snapshot(sampler_tid: int) -> dict[int, tuple[str, float, dict]]:
    """Every process's (name, CPU seconds, {thread: (CPU s, kernel CPU s, page faults, involuntary switches)} for
    workers); this
    process (the driver: run_job runs here) less the sampling thread's own CPU."""
    import psutil

    out = {}
    for q in psutil.process_iter(["cmdline", "name"]):
        try:
            name = " ".join(q.info["cmdline"] or [q.info["name"] or ""])
            t = q.cpu_times()
            if q.pid == os.getpid():
                mine = next((x for x in q.threads() if x.id == sampler_tid), None)
                out[q.pid] = ("the driver (scaletrain train)", t.user + t.system
                              - (mine.user_time + mine.system_time if mine else 0.0), {})
                continue
            threads = {}
            worker = "RayTrainWorker" in name or ("torchrun_entry" in name and "torchrun_agent" not in name)
            if worker:
                for tid in os.listdir(f"/proc/{q.pid}/task"):
                    with open(f"/proc/{q.pid}/task/{tid}/stat") as f:
                        stat = f.read().rsplit(")", 1)[1].split()
                    with open(f"/proc/{q.pid}/task/{tid}/status") as f:
                        inv = next(int(x.split()[1]) for x in f if x.startswith("nonvoluntary_ctxt_switches"))
                    tick = os.sysconf("SC_CLK_TCK")
                    utime, stime, faults = int(stat[11]), int(stat[12]), int(stat[7])
                    threads[int(tid)] = ((utime + stime) / tick, stime / tick, faults, inv)
            short = "torchrun worker" if worker and not name.startswith("ray::") else short_name(name)
            out[q.pid] = (short, t.user + t.system, threads)
        except (psutil.Error, OSError, StopIteration):
            continue
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--part", choices=("overhead", "efficiency", "breakdown", "all"), default="all")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="scaletrain-overhead-"))
    data_dir = write_demo_data(work / "data", n_sentiment=4000, n_reviews=4000)  # enough for --steps 100
    w, s = args.warmup, args.steps
    cfg = lambda path, name, n, launcher="ray", *extra: config(path, data_dir, work, name, n, launcher, w, s, *extra)
    if args.part in ("breakdown", "all"):
        breakdown(cfg, w, s)
        if args.part == "breakdown":
            return
    results: dict[str, list[float]] = {}

    def record(key: str, value: float) -> None:
        results.setdefault(key, []).append(value)

    parts = ("overhead", "efficiency") if args.part == "all" else (args.part,)
    prepared = {p: prepare(cfg(OVERHEAD_CONFIG if p == "overhead" else EFFICIENCY_CONFIG, f"prep-{p}", 2),
                           work / f"prep-{p}") for p in parts}
    for i in range(args.rounds):
        runs: list[tuple[str, Callable[[], float]]] = []
        if "overhead" in parts:
            runs += overhead_runs(cfg, prepared["overhead"], work, i, w, s)
        if "efficiency" in parts:
            for n in (1, 2):
                # one thread a worker at both sizes: one worker alone would otherwise take both cores
                e = {launcher: cfg(EFFICIENCY_CONFIG, f"e{n}-{launcher}{i}", n, launcher,
                                   "scaling.resources_per_worker={CPU: 1}") for launcher in ("ray", "torchrun")}
                runs += [(f"efficiency/bare/{n}", partial(bare, e["ray"], prepared["efficiency"], w, s, n)),
                         (f"efficiency/torchrun/{n}", partial(ours, e["torchrun"], w)),
                         (f"efficiency/ray/{n}", partial(ours, e["ray"], w))]
        for key, run in runs if i % 2 == 0 else runs[::-1]:  # no variant always runs first or last
            record(key, run())
        print(f"round {i}: " + ", ".join(f"{k} {v[-1]:.2f}" for k, v in results.items()), flush=True)
    med = {k: statistics.median(v) for k, v in results.items()}
    print("\nsamples/s, medians over rounds:", json.dumps({k: round(v, 2) for k, v in med.items()}))
    if "overhead" in parts:
        report_overhead(results)
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
