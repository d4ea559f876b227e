"""Cost of the per-worker system sampler (issue: observability; target < 1% of step time).

Runs the same 1-worker loop in-process, alternating a sampler every 0.1 s (50x the default rate) with a
sampler that never fires, and compares the median step time; also prints the sampler's own busy time.
Usage: .venv/bin/python benchmarks/sampler_overhead.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scaletrain.data.demo import sentiment_rows
from scaletrain.launch.local import run_in_process
from scaletrain.metrics.records import read_jsonl
from tests.conftest import local_spec


def one(data: Path, out: Path, interval: float) -> tuple[float, float]:
    cfg = {"model": {"name_or_path": "builtin:minilm"}, "data": {"train_file": str(data), "max_length": 32},
           "train": {"per_device_train_batch_size": 16, "max_steps": 40, "logging_steps": 10},
           "monitor": {"interval_s": interval}}
    _, _, spec = local_spec(cfg, out)
    run_in_process(spec)
    steps = [r["time/step_s"] for r in read_jsonl(out / "metrics.jsonl") if r["kind"] == "train"][1:]
    busy = re.findall(r"system sampler: (\d+) samples, ([\d.]+) s", (out / "logs" / "worker-0.log").read_text())
    return statistics.median(steps), float(busy[-1][1]) if busy else 0.0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp())
    data = work / "s.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in sentiment_rows(800)))
    on, off, busy = [], [], []
    for i in range(args.rounds):
        t, b = one(data, work / f"on{i}", 0.1)
        on.append(t)
        busy.append(b)
        off.append(one(data, work / f"off{i}", 1e6)[0])
    m_on, m_off = statistics.median(on), statistics.median(off)
    print(f"median step time: sampler every 0.1 s {m_on:.4f} s, no sampling {m_off:.4f} s, "
          f"ratio {m_on / m_off:.3f} ({(m_on / m_off - 1) * 100:+.1f}%)")
    print(f"sampler busy time per run: median {statistics.median(busy):.4f} s "
          f"(~{statistics.median(busy) / (40 * m_on) * 100:.2f}% of the 40 steps at 10 samples/s)")


if __name__ == "__main__":
    main()
