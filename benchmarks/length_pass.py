"""The driver's length pass and packing over a large prepared cache (issue #46: bounded driver memory).

A synthetic cache of ROWS token rows (lengths 16..LONGEST, mean ~ (16 + LONGEST) / 2, int32 ids, written once
with pyarrow and reopened memory-mapped as the workers and the driver open it) is measured two ways, alternating,
each in a fresh process: the Arrow pass scaletrain runs (``data/prepare.py:example_lengths``: list lengths read
batch by batch) and the Python-list pass it replaced (``[len(ids) for ids in ds["input_ids"]]``, on a 10% slice,
extrapolated linearly). Each prints its wall time and its peak resident-set growth (psutil, sampled every 5 ms)
over the process's RSS just before the pass. ``--pack N`` also packs the whole cache into rows of N tokens
(``data/packing.py``: a plan from the lengths, rows built with Arrow and written to a file) and prints its time,
its RSS growth and the anonymous (heap) part of it: the memory-mapped cache's pages the packer reads count in RSS
(the packer hands them back past ``MAPPED_BUDGET``, so they do not grow with the cache).

    python benchmarks/length_pass.py --rows 2000000 --rounds 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

PASS = r"""
import json, sys, threading, time
import psutil, datasets
from scaletrain.data.prepare import example_lengths
ds = datasets.load_from_disk(sys.argv[1])
how, share = sys.argv[2], float(sys.argv[3])
def anon():
    return next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("RssAnon"))
if share < 1:
    ds = ds.select(range(int(len(ds) * share)))
proc, peak, peak_anon, done = psutil.Process(), [0], [0], threading.Event()
def watch():
    while not done.is_set():
        peak[0] = max(peak[0], proc.memory_info().rss)
        peak_anon[0] = max(peak_anon[0], anon())
        time.sleep(0.005)
before, before_anon = proc.memory_info().rss, anon()
t = threading.Thread(target=watch); t.start()
start = time.perf_counter()
if how.startswith("pack"):
    import tempfile
    from scaletrain.data.packing import pack
    with tempfile.TemporaryDirectory(dir="/tmp") as out:
        n = len(ds)
        rows = len(pack(ds, int(how[4:]), 0, out))
else:
    n = len(example_lengths(ds)) if how == "arrow" else len([len(ids) for ids in ds["input_ids"]])
took = time.perf_counter() - start
done.set(); t.join()
print(json.dumps({"rows": n, "s": took, "rss_growth_mb": (peak[0] - before) / 1e6,
                  "anon_growth_mb": (peak_anon[0] - before_anon) / 1e6}))
"""


def build(path: Path, rows: int, longest: int, seed: int = 0) -> int:
    """The synthetic cache; returns its token count."""
    import datasets
    import numpy as np
    import pyarrow as pa

    datasets.disable_progress_bars()
    rng = np.random.default_rng(seed)
    lengths = rng.integers(16, longest + 1, size=rows, dtype=np.int32)
    offsets = np.zeros(rows + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    values = rng.integers(0, 32000, size=int(offsets[-1]), dtype=np.int32)
    ids = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))
    datasets.Dataset(pa.table({"input_ids": ids, "labels": ids})).save_to_disk(str(path))
    return int(offsets[-1])


def measure(path: Path, how: str, share: float) -> dict:
    out = subprocess.run([sys.executable, "-c", PASS, str(path), how, str(share)], capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    from scaletrain.data.packing import MAPPED_BUDGET

    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--longest", type=int, default=240)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--list-share", type=float, default=0.1, help="the Python-list pass runs on this slice")
    ap.add_argument("--pack", type=int, default=0, help="also pack the cache into rows of this many tokens")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir="/tmp") as tmp:
        path = Path(tmp) / "cache"
        tokens = build(path, args.rows, args.longest)
        results: dict[str, list[dict]] = {"arrow": [], "python lists": []}
        if args.pack:
            results["packing"] = []
        for _ in range(args.rounds):  # alternating
            results["arrow"].append(measure(path, "arrow", 1.0))
            results["python lists"].append(measure(path, "lists", args.list_share))
            if args.pack:
                results["packing"].append(measure(path, f"pack{args.pack}", 1.0))
    print(f"{args.rows:,} rows, {tokens:,} tokens ({tokens * 4 / 1e9:.1f} GB of int32 ids), medians of "
          f"{args.rounds} rounds")
    for how, runs in results.items():
        scale = args.rows / runs[0]["rows"]
        s = statistics.median(r["s"] for r in runs) * scale
        mb = statistics.median(r["rss_growth_mb"] for r in runs) * scale
        heap = statistics.median(r["anon_growth_mb"] for r in runs) * scale
        note = "" if scale == 1 else f" (measured on {runs[0]['rows']:,} rows, x{scale:.0f})"
        grows = (f"+{mb * 1e7 / args.rows / 1e3:.2f} GB" if how != "packing" else
                 f"RSS bounded: the cache's pages held to {MAPPED_BUDGET >> 20} MiB, plus a batch's heap")
        print(f"{how:>13}: {s:8.2f} s, driver RSS +{mb:8.1f} MB (heap +{heap:.1f} MB){note}; 10M rows: "
              f"{s * 1e7 / args.rows:.1f} s, {grows}")


if __name__ == "__main__":
    main()
