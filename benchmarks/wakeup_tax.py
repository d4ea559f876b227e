"""What idle processes that wake on a timer cost two compute-bound workers on this machine, without Ray.

Every Ray actor process's core-worker loop wakes every 10 ms (a hard-coded signal check); a Ray Train run has
seven of them (two trainers, the controller, four helper actors). This benchmark reproduces that load with
plain processes so the cost can be told apart from Ray itself:

1. the CPU one timer wake-up costs (a process that only waits 10 ms in epoll, over and over);
2. ``--part matmul``: the throughput of two single-thread torch matmul processes on two cores with 0 vs N
   such processes, alternating in one invocation (median ratio over rounds, 95% bootstrap interval);
3. ``--part loop``: overhead.py's hand-written DDP loop (MiniLM full fine-tuning, fused AdamW, 2 workers)
   alone and beside N such processes, against scaletrain with the Ray launcher, alternating in one invocation.

    python benchmarks/wakeup_tax.py --part matmul --wakers 7 --period-ms 10 --rounds 10
    python benchmarks/wakeup_tax.py --part loop --rounds 7 --steps 30
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import random
import resource
import select
import statistics
import sys
import tempfile
import time
from functools import partial
from pathlib import Path


def wake_cost(period_s: float, seconds: float = 5.0) -> tuple[float, float]:
    """(% of a core, microseconds per wake-up) of a loop that only sleeps ``period_s`` in epoll."""
    ep = select.epoll()
    r0, t0, n = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter(), 0
    while time.perf_counter() - t0 < seconds:
        ep.poll(period_s)
        n += 1
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    return 100 * cpu / seconds, 1e6 * cpu / n


def waker(stop, period_s: float) -> None:
    ep = select.epoll()
    while not stop.is_set():
        ep.poll(period_s)


def matmul_worker(seconds: float, out) -> None:
    import torch

    torch.set_num_threads(1)
    a, b = torch.randn(384, 384), torch.randn(384, 384)
    for _ in range(20):
        a @ b
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        a @ b
        n += 1
    out.put(n / seconds)


def matmul_pair(seconds: float) -> float:
    """Matmuls per second of two single-thread workers together."""
    out = mp.Queue()
    workers = [mp.Process(target=matmul_worker, args=(seconds, out)) for _ in range(2)]
    for p in workers:
        p.start()
    total = sum(out.get() for _ in workers)
    for p in workers:
        p.join()
    return total


def beside_wakers(fn, wakers: int, period_s: float) -> float:
    """``fn()`` while ``wakers`` timer processes run (none: just ``fn()``)."""
    stop = mp.Event()
    bg = [mp.Process(target=waker, args=(stop, period_s)) for _ in range(wakers)]
    for p in bg:
        p.start()
    time.sleep(0.5 if bg else 0)  # let them settle into their loop
    try:
        return fn()
    finally:
        stop.set()
        for p in bg:
            p.join()


def loop_part(args, period: float) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import overhead as ov

    from scaletrain.data.demo import write_demo_data

    w, s = 5, args.steps
    work = Path(tempfile.mkdtemp(prefix="scaletrain-wakeup-"))
    data = write_demo_data(work / "data", n_sentiment=4000, n_reviews=4000)
    prepared = ov.prepare(ov.config(ov.OVERHEAD_CONFIG, data, work, "prep", 2, "ray", w, s), work / "prep")
    results: dict[str, list[float]] = {}
    beside = f"hand-written + {args.wakers} timers"
    for i in range(args.rounds):
        cfg = ov.config(ov.OVERHEAD_CONFIG, data, work, f"ray{i}", 2, "ray", w, s)
        hand = partial(ov.bare, cfg, prepared, w, s, 2, fused=True)
        runs = [("hand-written", hand), (beside, partial(beside_wakers, hand, args.wakers, period)),
                ("scaletrain Ray", partial(ov.ours, cfg, w))]
        for key, run in runs if i % 2 == 0 else runs[::-1]:
            results.setdefault(key, []).append(run())
        print(f"round {i}: " + ", ".join(f"{k} {v[-1]:.2f}" for k, v in results.items()) + " samples/s", flush=True)
    for num, den in ((beside, "hand-written"), ("scaletrain Ray", "hand-written"), ("scaletrain Ray", beside)):
        ratios = [x / y for x, y in zip(results[num], results[den])]
        print(f"{num} / {den}: median {statistics.median(ratios):.3f} "
              f"(rounds {', '.join(f'{r:.3f}' for r in ratios)})")


def bootstrap(values: list[float], n: int = 5000) -> tuple[float, float]:
    rng = random.Random(0)
    meds = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(n))
    return meds[int(0.025 * n)], meds[int(0.975 * n) - 1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--wakers", type=int, default=7, help="timer processes (a 2-worker Ray Train run has 7 actors)")
    ap.add_argument("--period-ms", type=float, default=10.0, help="their wake-up period (Ray's is 10 ms)")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--seconds", type=float, default=12.0, help="measured seconds per matmul trial")
    ap.add_argument("--part", choices=("matmul", "loop"), default="matmul")
    ap.add_argument("--steps", type=int, default=30, help="measured steps per loop run (after 5 warm-up steps)")
    args = ap.parse_args()
    mp.set_start_method("spawn")
    period = args.period_ms / 1000
    share, us = wake_cost(period)
    print(f"one process waking every {args.period_ms:g} ms: {share:.2f}% of a core, {us:.0f} us per wake-up")
    if args.part == "loop":
        loop_part(args, period)
        return
    ratios = []
    for r in range(args.rounds):
        order = [0, args.wakers] if r % 2 == 0 else [args.wakers, 0]  # neither always first
        rate = {k: beside_wakers(partial(matmul_pair, args.seconds), k, period) for k in order}
        ratios.append(rate[args.wakers] / rate[0])
        print(f"round {r}: 0 wakers {rate[0]:.1f} matmul/s, {args.wakers} wakers {rate[args.wakers]:.1f} matmul/s, "
              f"ratio {ratios[-1]:.3f}", flush=True)
    lo, hi = bootstrap(ratios)
    print(f"throughput with {args.wakers} processes waking every {args.period_ms:g} ms / without: median "
          f"{statistics.median(ratios):.3f} (95% bootstrap {lo:.3f}-{hi:.3f}) over {args.rounds} rounds")


if __name__ == "__main__":
    main()
