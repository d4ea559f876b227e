"""Asynchronous GRPO (#74): rollout.max_staleness 1 (the next step's rollouts sampled by the actor while this step
trains) against 0 (the actor samples, then the trainer trains), the same job otherwise: one training worker and one
rollout actor (this machine's two cores), `scaletrain train` with the Ray launcher as a user runs it, alternating
within one invocation, medians. Steps/s in the steady state (the steps after the first, which starts the actor and
sends it the whole model: time/step_s), the whole run's too, and the reward curve of each.

    .venv/bin/python benchmarks/grpo_async.py --rounds 3 --steps 40 --new 8 --lora

The job: builtin:tiny-llama saved once (the same initial weights for both), full fine-tuning, 96 prompts "What is
a+b?", 16 completions per step in groups of 8, --new completion tokens at most (rollout and training of similar
length on this CPU), temperature 1, DAPO's loss, lr 5e-3; the reward is the share of vowels in the completion.
TRL 1.13's AsyncGRPOTrainer (trl.experimental.async_grpo) needs a vLLM server for its rollouts: it does not run on
this CPU-only machine, so it is not in the comparison.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from grpo import LR, PER_DEVICE, G, setup  # noqa: E402 - the same job as the TRL comparison


def run(work: Path, model_dir: Path, data: Path, steps: int, new: int, staleness: int, tag: str,
        lora: bool = False) -> dict:
    import yaml

    from scaletrain.metrics.records import read_jsonl

    tuning = {"finetuning_type": "lora", "lora_rank": 8} if lora else {"finetuning_type": "full"}
    cfg = {"model": {"name_or_path": str(model_dir), "task": "causal-lm", "dropout": 0.0, **tuning},
           "data": {"train_file": str(data), "formatting": "messages", "max_length": 64, "eval_ratio": 0},
           "train": {"stage": "grpo", "per_device_train_batch_size": PER_DEVICE, "max_steps": steps,
                     "learning_rate": LR, "logging_steps": 1},
           "rl": {"reward_funcs": [f"{work / 'bench_rewards.py'}:vowels"], "num_generations": G,
                  "max_completion_length": new, "loss_type": "dapo", "beta": 0.0},
           "rollout": {"placement": "separate", "max_staleness": staleness},
           "scaling": {"num_workers": 1, "launcher": "ray"}, "monitor": {"report": False},
           "output": {"output_dir": str(work / "runs"), "run_name": f"k{staleness}-{tag}"}}
    path = work / f"k{staleness}-{tag}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    done = subprocess.run([sys.executable, "-m", "scaletrain", "train", "--no-progress", str(path)],
                          capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(done.stderr[-3000:])
    run_dir = work / "runs" / f"k{staleness}-{tag}"
    summary = json.loads((run_dir / "summary.json").read_text())
    train = [r for r in read_jsonl(run_dir / "metrics.jsonl") if r["kind"] == "train"]
    steady = [r["time/step_s"] for r in train[1:]]  # the first step starts the actor and sends the whole model
    return {"steps_per_s": len(steady) / sum(steady), "run_steps_per_s": steps / summary["train_time_s"],
            **{f"{part}_s": statistics.mean(r[f"time/{part}_s"] for r in train[1:])
               for part in ("rollout", "sync", "step")},
            "rewards": [r["reward"] for r in train]}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--new", type=int, default=16, help="completion tokens at most")
    p.add_argument("--lora", action="store_true", help="LoRA (rank 8): the sync sends the adapter only")
    args = p.parse_args()
    results: dict[int, list[dict]] = {0: [], 1: []}
    with tempfile.TemporaryDirectory(prefix="grpo-async-bench-") as tmp:
        work = Path(tmp)
        model_dir, data, _ = setup(work)
        for r in range(args.rounds):
            for k in ((0, 1) if r % 2 == 0 else (1, 0)):  # alternating
                res = run(work, model_dir, data, args.steps, args.new, k, str(r), args.lora)
                results[k].append(res)
                print(f"round {r} max_staleness={k}: {res['steps_per_s']:.3f} steps/s; a step {res['step_s']:.3f} s, "
                      f"of it waiting for rollouts {res['rollout_s']:.3f} s and the sync {res['sync_s']:.3f} s; "
                      f"reward first {res['rewards'][0]:.3f}, last 10 {statistics.mean(res['rewards'][-10:]):.3f}",
                      flush=True)
    for k, rs in results.items():
        last = statistics.median(statistics.mean(x["rewards"][-10:]) for x in rs)
        print(f"max_staleness={k}: median {statistics.median(x['steps_per_s'] for x in rs):.3f} steps/s; "
              f"reward last 10 (median of rounds) {last:.3f}")
    ratios = [a["steps_per_s"] / b["steps_per_s"] for a, b in zip(results[1], results[0])]
    print(f"staleness 1 / synchronous steps/s: median {statistics.median(ratios):.2f} "
          f"(rounds: {', '.join(f'{x:.2f}' for x in ratios)})")
    curves = [statistics.mean(x["rewards"][i] for x in results[k]) for k in (0, 1) for i in range(args.steps)]
    half = len(curves) // 2
    print("reward curves (mean of rounds, every 5th step): k=0 " + " ".join(f"{v:.3f}" for v in curves[:half][::5])
          + " | k=1 " + " ".join(f"{v:.3f}" for v in curves[half:][::5]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
