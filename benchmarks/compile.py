"""Eager against `train.compile` (issue #63): steady tokens/s and the compile time, side by side.

The same SFT job both ways (full fine-tuning of an alpaca file with answers of 1 to 12 sentences, batch 4 per
process, padded), on the tiny Llama and the ~80M-parameter one (`builtin:llama-100m`, 12 x d768), 1 process and 2
(torchrun), eager and compiled alternating within each round, medians over --rounds. Each compiled run gets a fresh
inductor cache directory (TORCHINDUCTOR_CACHE_DIR), so its compile time is a cold one, as a first run on a machine.

Measured per run from its metrics.jsonl: steady tokens/s (the median of the train records' throughput after the
first --warmup steps; a record's step time already leaves the compile out) and the compile time (the sum of
`time/compile_s`, the slowest rank's).

    .venv/bin/python benchmarks/compile.py --rounds 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from vs_llamafactory import rows  # noqa: E402 - the same spread of answer lengths

MODELS = {"tiny": ("builtin:tiny-llama", 256, 30), "100m": ("builtin:llama-100m", 256, 12)}  # path, max_length, steps


def run(work: Path, model: str, workers: int, compiled: bool, tag: str, warmup: int) -> dict:
    name, max_length, steps = MODELS[model]
    cfg = {"model": {"name_or_path": name, "task": "causal-lm", "finetuning_type": "full", "dropout": 0.0},
           "data": {"train_file": str(work / "data.jsonl"), "template": "alpaca", "max_length": max_length,
                    "eval_ratio": 0},
           "train": {"per_device_train_batch_size": 4, "max_steps": steps, "learning_rate": 1e-4,
                     "logging_steps": 1, "compile": compiled},
           "scaling": {"num_workers": workers, "launcher": "torchrun" if workers > 1 else "local"},
           "output": {"output_dir": str(work / "runs"), "run_name": tag}, "monitor": {"report": False}}
    path = work / f"{tag}.json"
    path.write_text(json.dumps(cfg))
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="inductor-", dir=work)  # a cold compile each run
    out = subprocess.run([sys.executable, "-m", "scaletrain", "train", str(path), "--no-progress"],
                         capture_output=True, text=True, env=env, timeout=3600)
    if out.returncode:
        raise SystemExit(f"{tag} failed:\n{out.stderr[-3000:]}")
    records = [json.loads(line) for line in (work / "runs" / tag / "metrics.jsonl").open()]
    train = [r for r in records if r["kind"] == "train"]
    log = (work / "runs" / tag / "logs" / "main.log").read_text()
    return {"tokens_per_s": statistics.median(r["throughput/tokens_per_s"] for r in train[warmup:]),
            "compile_s": sum(r.get("time/compile_s", 0.0) for r in train),
            "eager_parts": "run eager" in log, "loss_last": train[-1]["train/loss"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=3, help="train records left out of the steady rate")
    ap.add_argument("--models", default="tiny,100m")
    ap.add_argument("--workers", default="1,2")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="compile-bench-"))
    (work / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows(400)))
    results: dict[tuple, list[dict]] = {}
    for rnd in range(args.rounds):
        for model in args.models.split(","):
            for workers in map(int, args.workers.split(",")):
                order = (False, True) if rnd % 2 == 0 else (True, False)  # alternating which goes first
                for compiled in order:
                    tag = f"{model}-w{workers}-{'compiled' if compiled else 'eager'}-r{rnd}"
                    r = run(work, model, workers, compiled, tag, args.warmup)
                    results.setdefault((model, workers, compiled), []).append(r)
                    print(tag, json.dumps(r), flush=True)
    print("\n| model | processes | eager tokens/s | compiled tokens/s | compiled / eager | compile time (s) |")
    print("|---|---|---|---|---|---|")
    for model in args.models.split(","):
        for workers in map(int, args.workers.split(",")):
            eager = statistics.median(r["tokens_per_s"] for r in results[(model, workers, False)])
            comp = statistics.median(r["tokens_per_s"] for r in results[(model, workers, True)])
            cold = statistics.median(r["compile_s"] for r in results[(model, workers, True)])
            print(f"| {model} | {workers} | {eager:,.0f} | {comp:,.0f} | {comp / eager:.2f} | {cold:.1f} |")


if __name__ == "__main__":
    main()
