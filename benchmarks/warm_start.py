"""Time to the first optimizer step, the same tiny job (MiniLM classification, 2 CPU workers), alternating in one
invocation: cold `scaletrain train` (embedded Ray), `scaletrain train` on the cluster `scaletrain up` started, and
bare Ray Train cold. Each variant is a fresh process (a user's command); medians of --rounds. "warm" is the first
run after `up`, "warm-again" the next one on the same cluster.
Target (issue: clusters the way teams run them): warm <= 0.5x bare cold.

    .venv/bin/python benchmarks/warm_start.py --rounds 3
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling benchmark scripts
from launch_time import demo_job, first_step_bare, first_step_scaletrain


def cli(*args: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "scaletrain", *args], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="scaletrain-warm-"))
    data, cfg = demo_job(work)
    results = {k: [] for k in ("cold", "warm", "warm-again", "bare-cold")}
    cli("down")
    for i in range(args.rounds):
        order = ["bare-cold", "cold", "warm"] if i % 2 == 0 else ["warm", "cold", "bare-cold"]
        for name in order:
            if name == "bare-cold":
                results[name].append(first_step_bare("ray", data, work / f"bare{i}"))
            elif name == "cold":
                results[name].append(first_step_scaletrain(cfg, work / f"cold{i}", "ray"))
            else:
                cli("up", "--num-cpus", "2")  # started before the clock: that is the point of `up`
                try:  # the first run on the new cluster, then the next one (Ray's detached helpers are up)
                    results[name].append(first_step_scaletrain(cfg, work / f"warm{i}", "ray"))
                    results["warm-again"].append(first_step_scaletrain(cfg, work / f"warm-again{i}", "ray"))
                finally:
                    cli("down")
        print({k: round(v[-1], 1) for k, v in results.items() if v}, flush=True)
    med = {k: statistics.median(v) for k, v in results.items()}
    print(f"\n| variant | time to first step s (median of {args.rounds}) | vs bare cold |\n|---|---|---|")
    for k, v in med.items():
        print(f"| {k} | {v:.1f} | {v / med['bare-cold']:.2f}x |")
    for k in ("warm", "warm-again"):
        print(f"{k} / bare cold = {med[k] / med['bare-cold']:.2f} (target <= 0.5)")


if __name__ == "__main__":
    main()
