"""Goodput under failures (issue #34): where the wall time of the demo job went with 0, 1 and 3 random worker
kills (fault_tolerance.chaos), and the checkpoint interval swept against Young/Daly's optimum.

    .venv/bin/python benchmarks/goodput.py --rounds 1 --steps 300

The job: builtin:tiny-bert classification on the demo sentiment data, 2 Ray workers on this machine, a checkpoint
every 20 steps (the sweep: 5, 20, 80). Each run's account is its summary.json's goodput/* (metrics/goodput.py).
Young/Daly: the interval that maximises goodput is about sqrt(2 x C x MTBF) for a checkpoint cost C and a mean
time between failures MTBF (Young 1974, Daly 2006); with kills every MTBF steps and a step of s seconds, in steps
it is sqrt(2 x C x MTBF_steps x s) / s.
"""

from __future__ import annotations

import argparse
import math
import statistics
import tempfile
from pathlib import Path


def run(work: Path, name: str, steps: int, kills: int, save_steps: int, seed: int) -> dict:
    from scaletrain.config import validate
    from scaletrain.launch.job import run_job

    chaos = {"chaos": {"kills": kills, "mtbf_steps": steps / (kills + 1), "seed": seed}} if kills else {}
    cfg = validate({
        "model": {"name_or_path": "builtin:tiny-bert", "num_labels": 2},
        "data": {"train_file": str(work / "data" / "sentiment.jsonl"), "eval_ratio": 0.05, "max_length": 32},
        "train": {"per_device_train_batch_size": 16, "max_steps": steps, "logging_steps": 5, "seed": 1},
        "checkpoint": {"save_steps": save_steps, "save_total_limit": 2},
        "fault_tolerance": {"max_failures": max(kills, 0), **chaos},
        "scaling": {"num_workers": 2},
        "monitor": {"report": False},
        "output": {"output_dir": str(work / "runs"), "run_name": name},
    })
    summary = run_job(cfg, work / "c.yaml", show_progress=False).summary
    return {k.removeprefix("goodput/"): v for k, v in summary.items() if k.startswith(("goodput/", "restarts/"))}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--steps", type=int, default=300)
    args = ap.parse_args()
    from scaletrain.data.demo import write_demo_data

    work = Path(tempfile.mkdtemp(prefix="scaletrain-goodput-"))
    write_demo_data(work / "data")
    results: dict[str, list[dict]] = {}
    plan = [(f"{k} kill(s), every 20 steps", k, 20) for k in (0, 1, 3)]
    plan += [(f"3 kills, every {n} steps", 3, n) for n in (5, 80)]
    for r in range(args.rounds):
        for i, (name, kills, save) in enumerate(plan if r % 2 == 0 else plan[::-1]):
            g = run(work, f"r{r}-{i}-{kills}-{save}", args.steps, kills, save, seed=r)
            results.setdefault(name, []).append(g)
            print(f"round {r} {name}: goodput {g['ratio']:.1%} of {g['wall_s']:.1f} s, {g['interruptions']} "
                  f"interruption(s), restart {g['restart_s']:.1f} s, lost work {g['lost_work_s']:.1f} s", flush=True)
    print("\n| variant | wall s | goodput | productive s | start-up s | restarts s (detect / workers / restore) | "
          "lost work s | checkpoint s | finish + other s | runs |\n|---|---|---|---|---|---|---|---|---|---|")
    med = lambda rs, k: statistics.median(x[k] for x in rs)  # a one-line helper of this table
    for name, rs in results.items():
        start = sum(med(rs, f"{k}_s") for k in ("data_prep", "cluster_start", "worker_start", "model_load"))
        print(f"| {name} | {med(rs, 'wall_s'):.1f} | {med(rs, 'ratio'):.1%} | {med(rs, 'productive_s'):.1f} | "
              f"{start:.1f} | {med(rs, 'restart_s'):.1f} ({med(rs, 'restarts/detect_s'):.1f} / "
              f"{med(rs, 'restarts/worker_start_s'):.1f} / {med(rs, 'restarts/restore_s'):.1f}) | "
              f"{med(rs, 'lost_work_s'):.1f} | "
              f"{med(rs, 'checkpoint_s'):.1f} | {med(rs, 'finish_s') + med(rs, 'other_s'):.1f} | {len(rs)} |")
    three = results["3 kill(s), every 20 steps"]
    step_s = med(three, "productive_s") / args.steps
    cost = med(three, "checkpoint_s") / (args.steps / 20)
    mtbf_steps = args.steps / 4
    optimum = math.sqrt(2 * cost * mtbf_steps * step_s) / step_s if step_s else float("nan")
    swept = {20: med(three, "ratio"), 5: med(results["3 kills, every 5 steps"], "ratio"),
             80: med(results["3 kills, every 80 steps"], "ratio")}
    best = max(swept, key=swept.get)
    print(f"\nYoung/Daly: checkpoint {cost:.3f} s, step {step_s:.4f} s, a kill every {mtbf_steps:.0f} steps -> "
          f"interval {optimum:.0f} steps; measured best of {sorted(swept)}: every {best} steps "
          f"({swept[best]:.1%})")


if __name__ == "__main__":
    main()
