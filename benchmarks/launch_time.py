"""Time from command to first optimizer step: scaletrain's Ray and torchrun launchers vs bare scripts.

Each variant is a fresh process (a user's command), 2 CPU workers, the demo job (MiniLM classification).
Variants alternate; medians of --rounds. Target: scaletrain / bare <= 1.2 for each launcher.
Where the seconds go for scaletrain is read from main.log and the worker log of rank 0.
Usage: .venv/bin/python benchmarks/launch_time.py [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from scaletrain.data.demo import sentiment_rows

HERE = Path(__file__).resolve().parent


def first_step_scaletrain(cfg: Path, out: Path, launcher: str) -> float:
    t0 = time.time()
    proc = subprocess.run([sys.executable, "-m", "scaletrain", "train", str(cfg), f"scaling.launcher={launcher}",
                           f"output.output_dir={out}", "--no-progress"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    run = next(p for p in out.iterdir() if (p / "metrics.jsonl").is_file())  # not the data cache (.cache)
    first = min(json.loads(line)["time"] for line in (run / "metrics.jsonl").read_text().splitlines()
                if '"kind": "train"' in line)
    return first - t0


def first_step_bare(mode: str, data: Path, out: Path) -> float:
    out.mkdir(parents=True)
    script = str(HERE / "bare_first_step.py")
    cmd = ([sys.executable, script, "ray", str(data), str(out)] if mode == "ray" else
           [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", script, "torchrun", str(data),
            str(out)])
    t0 = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return float((out / "first_step").read_text()) - t0


def demo_job(work: Path) -> tuple[Path, Path]:
    """The 1-step MiniLM demo job on 2 workers: its data file and its config."""
    data = work / "s.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in sentiment_rows(400)))
    cfg = work / "c.yaml"
    cfg.write_text(f"""model: {{name_or_path: "builtin:minilm"}}
data: {{train_file: {data}, eval_ratio: 0.1, max_length: 32}}
train: {{per_device_train_batch_size: 16, max_steps: 1, logging_steps: 1}}
scaling: {{num_workers: 2}}
monitor: {{report: false}}
""")
    return data, cfg


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="scaletrain-launch-"))
    data, cfg = demo_job(work)
    results = {k: [] for k in ("ray", "bare-ray", "torchrun", "bare-torchrun")}
    for i in range(args.rounds):
        results["bare-ray"].append(first_step_bare("ray", data, work / f"bare-ray{i}"))
        results["ray"].append(first_step_scaletrain(cfg, work / f"ray{i}", "ray"))
        results["bare-torchrun"].append(first_step_bare("torchrun", data, work / f"bare-tr{i}"))
        results["torchrun"].append(first_step_scaletrain(cfg, work / f"tr{i}", "torchrun"))
        print({k: round(v[-1], 1) for k, v in results.items()}, flush=True)
    med = {k: statistics.median(v) for k, v in results.items()}
    for launcher in ("ray", "torchrun"):
        print(f"{launcher:>8}: scaletrain {med[launcher]:.1f} s, bare {med['bare-' + launcher]:.1f} s, "
              f"ratio {med[launcher] / med['bare-' + launcher]:.2f} (target <= 1.2)")
    run = next(p for p in (work / "ray0").iterdir() if (p / "metrics.jsonl").is_file())
    print("scaletrain ray run, main.log:")
    print((run / "logs" / "main.log").read_text())


if __name__ == "__main__":
    main()
