"""What the loop's per-step rank agreement costs: a hand-written DDP loop with and without it.

scaletrain's loop all-reduces two floats after every optimizer step (some rank's loss is NaN, some rank saw the
stop file) so that every rank takes the same decision at the same step. This script measures what that costs
when every step waits for it, as the loop once did (it now reads the answer one step later, see
`StepCheck` in worker/loop.py): the hand-written loop of benchmarks/overhead.py (MiniLM full fine-tuning, fused
AdamW, 2 workers, gloo, 1 thread each) plain and with that one blocking all-reduce, alternating, and prints the
median throughput ratio.

Usage: .venv/bin/python benchmarks/step_check_cost.py [--rounds 4]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import overhead as ov

from scaletrain.data.demo import write_demo_data


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
            r[with_flags].append(ov.bare(cfg, prepared, 5, 20, 2, fused=True, agree=with_flags))
        print(f"round {i}: samples/s without {r[False][-1]:.2f}, with {r[True][-1]:.2f}", flush=True)
    ratios = [a / b for a, b in zip(r[True], r[False])]
    print(f"with the per-step 2-float all-reduce / without: median ratio {statistics.median(ratios):.3f} "
          f"(rounds {', '.join(f'{x:.3f}' for x in ratios)})")


if __name__ == "__main__":
    main()
