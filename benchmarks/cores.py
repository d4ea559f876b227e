"""Every core used (issue: the whole command ahead of LLaMA-Factory): a worker's CPUs at the old fixed 1 vs the
new default (its node's cores / the workers on it), 1 and 2 workers, side by side.

    .venv/bin/python benchmarks/cores.py --rounds 3 --steps 40

The demo classification job (MiniLM, full fine-tuning) with the Ray launcher, a fresh embedded Ray per run as
`scaletrain train` starts one; variants alternate within a round (reversed every other round); median samples/s
of the training steps (the run's own throughput, evaluation and checkpoints kept out).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

VARIANTS = {"1 worker, 1 CPU (before)": (1, {"CPU": 1}), "1 worker, default": (1, None),
            "2 workers, 1 CPU each (before)": (2, {"CPU": 1}), "2 workers, default": (2, None)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=40)
    args = ap.parse_args()
    from scaletrain.config import validate
    from scaletrain.data.demo import write_demo_data
    from scaletrain.launch.job import run_job

    work = Path(tempfile.mkdtemp(prefix="scaletrain-cores-"))
    write_demo_data(work / "data")
    results: dict[str, list[float]] = {k: [] for k in VARIANTS}
    for r in range(args.rounds):
        for name in (list(VARIANTS) if r % 2 == 0 else list(VARIANTS)[::-1]):
            workers, per = VARIANTS[name]
            cfg = validate({
                "model": {"name_or_path": "builtin:minilm", "num_labels": 2},
                "data": {"train_file": str(work / "data" / "sentiment.jsonl"), "eval_ratio": 0.1, "max_length": 32},
                "train": {"per_device_train_batch_size": 16, "max_steps": args.steps, "logging_steps": 5, "seed": 1},
                "scaling": {"num_workers": workers, **({"resources_per_worker": per} if per else {})},
                "monitor": {"report": False},
                "output": {"output_dir": str(work / "runs"), "run_name": f"r{r}-{workers}-{'one' if per else 'all'}"},
            })
            run = run_job(cfg, work / "c.yaml", show_progress=False).run_dir
            results[name].append(json.loads((run / "summary.json").read_text())["throughput/samples_per_s"])
            print(f"round {r} {name}: {results[name][-1]:.1f} samples/s", flush=True)
    med = {k: statistics.median(v) for k, v in results.items()}
    print("\n| variant | samples/s (median) | rounds |\n|---|---|---|")
    for k, v in med.items():
        print(f"| {k} | {v:.1f} | {', '.join(f'{x:.1f}' for x in results[k])} |")
    print(f"1 worker: {med['1 worker, default'] / med['1 worker, 1 CPU (before)']:.2f}x; 2 workers: "
          f"{med['2 workers, default'] / med['2 workers, 1 CPU each (before)']:.2f}x")


if __name__ == "__main__":
    main()
