"""GRPO side by side with TRL (issue #61): the same tiny model, prompts, num_generations, completion length and
steps, scaletrain (`train.stage: grpo`, rollout engine `hf` colocated; 1 process: the local launcher in this
process, 2: `scaletrain train` under torchrun) and TRL's GRPOTrainer (transformers' generate too; 2 processes:
torchrun, DDP over gloo as accelerate sets it up), alternating within one invocation, medians.

    .venv/bin/python benchmarks/grpo.py --rounds 3 --steps 20 --processes 1 2

The job: builtin:tiny-llama (random init, the same weights on both sides: built by scaletrain from seed 0 and saved),
full fine-tuning, 96 prompts "What is a+b?" (messages), 16 completions per step in groups of 8 (2 processes: 8 each), 16
completion tokens at most, sampling at temperature 1, DAPO's loss (TRL's default), beta 0, lr 5e-3; the reward is
the share of vowels in the completion (a TRL-signature function both sides call). Throughput: completion tokens
generated per second over the run's training time (TRL's train_runtime; scaletrain's train time), and the step time.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

G, PER_DEVICE, MAX_NEW, LR = 8, 16, 16, 5e-3


def vowels(prompts, completions, **kwargs):
    texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
    return [sum(ch in "aeiou" for ch in t) / max(1, len(t)) for t in texts]


def setup(work: Path) -> tuple[Path, Path, list[dict]]:
    from scaletrain.config.schema import ModelConfig
    from scaletrain.model.build import build_model
    from scaletrain.model.files import TINY_LLAMA
    from scaletrain.model.tokenizer import Vocab, load_tokenizer
    from scaletrain.worker.trainer import seed_everything

    model_dir = work / "tiny-llama"
    tok = load_tokenizer(TINY_LLAMA)
    seed_everything(0)
    build_model(ModelConfig(name_or_path=TINY_LLAMA, task="causal-lm"), Vocab.of(tok), None).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    rng = random.Random(0)
    rows = [{"prompt": [{"role": "user", "content": f"What is {a}+{b}?"}], "answer": str(a + b)}
            for a, b in ((rng.randint(0, 9), rng.randint(0, 9)) for _ in range(96))]
    data = work / "prompts.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (work / "bench_rewards.py").write_text(
        "def vowels(prompts, completions, **kwargs):\n"
        "    texts = [c[0]['content'] if isinstance(c, list) else c for c in completions]\n"
        "    return [sum(ch in 'aeiou' for ch in t) / max(1, len(t)) for t in texts]\n")
    return model_dir, data, rows


def run_scaletrain(work: Path, model_dir: Path, data: Path, steps: int, tag: str, processes: int = 1) -> dict:
    from scaletrain.metrics.records import read_jsonl

    cfg = {"model": {"name_or_path": str(model_dir), "task": "causal-lm", "finetuning_type": "full", "dropout": 0.0},
           "data": {"train_file": str(data), "formatting": "messages", "max_length": 64, "eval_ratio": 0},
           "train": {"stage": "grpo", "per_device_train_batch_size": PER_DEVICE // processes, "max_steps": steps,
                     "learning_rate": LR, "logging_steps": 1},
           "rl": {"reward_funcs": [f"{work / 'bench_rewards.py'}:vowels"], "num_generations": G,
                  "max_completion_length": MAX_NEW, "loss_type": "dapo", "beta": 0.0},
           "scaling": {"num_workers": 1, "launcher": "local"}, "monitor": {"report": False}}
    if processes == 1:
        from scaletrain.launch.local import run_in_process
        from tests.conftest import local_spec

        run = work / f"st-{tag}"
        _, _, spec = local_spec(cfg, run)
        summary = run_in_process(spec)
    else:  # as a user runs it: `scaletrain train` under torchrun
        from tests.conftest import cli_train

        run = cli_train(cfg, work, f"st-{tag}-{processes}", workers=processes)
        summary = json.loads((run / "summary.json").read_text())
    train = [r for r in read_jsonl(run / "metrics.jsonl") if r["kind"] == "train"]
    tokens = sum(r["completions/mean_length"] * PER_DEVICE for r in train)  # the global batch's completions
    return {"tokens_per_s": tokens / summary["train_time_s"], "step_s": summary["train_time_s"] / steps,
            "reward_first": train[0]["reward"], "reward_last": statistics.mean(r["reward"] for r in train[-5:])}


def run_trl(work: Path, model_dir: Path, rows: list[dict], steps: int, tag: str, processes: int = 1) -> dict:
    if processes > 1:  # this script again, as a TRL worker under torchrun (accelerate reads torchrun's variables)
        import os
        import subprocess

        out = work / f"trl-{tag}-{processes}.json"
        import socket

        with socket.socket() as sock:  # a free port (torchrun's --master_port=0 hangs its static rendezvous)
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={processes}", f"--master_port={port}",
               str(Path(__file__).resolve()), "--trl-worker", str(work), str(model_dir), str(steps), tag, str(out)]
        subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=900,
                       env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)})
        return json.loads(out.read_text())
    import datasets
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    import torch.distributed as dist

    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else int(
        __import__("os").environ.get("WORLD_SIZE", "1"))
    args = GRPOConfig(output_dir=str(work / f"trl-{tag}"), per_device_train_batch_size=PER_DEVICE // world,
                      num_generations=G,
                      max_completion_length=MAX_NEW, max_steps=steps, learning_rate=LR, logging_steps=1,
                      report_to=[], use_cpu=True, save_strategy="no", loss_type="dapo", beta=0.0, seed=42,
                      temperature=1.0, disable_tqdm=True)
    trainer = GRPOTrainer(model=model, reward_funcs=[vowels], args=args, processing_class=tok,
                          train_dataset=datasets.Dataset.from_list(rows))
    t0 = time.perf_counter()
    out = trainer.train()
    runtime = out.metrics.get("train_runtime", time.perf_counter() - t0)
    logs = [h for h in trainer.state.log_history if "reward" in h]
    tokens = sum(h.get("completions/mean_length", MAX_NEW) * PER_DEVICE for h in logs)  # the global batch's
    return {"tokens_per_s": tokens / runtime, "step_s": runtime / steps, "reward_first": logs[0]["reward"],
            "reward_last": statistics.mean(h["reward"] for h in logs[-5:])}


def trl_worker(argv: list[str]) -> int:
    """One process of TRL's 2-process run: rank 0 writes the result."""
    import os

    work, model_dir, steps, tag, out = Path(argv[0]), Path(argv[1]), int(argv[2]), argv[3], Path(argv[4])
    rows = [json.loads(line) for line in (work / "prompts.jsonl").read_text().splitlines()]
    res = run_trl(work, model_dir, rows, steps, f"{tag}-w")
    if os.environ.get("RANK", "0") == "0":
        out.write_text(json.dumps(res))
    return 0


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--trl-worker":
        return trl_worker(sys.argv[2:])
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--processes", type=int, nargs="+", default=[1])
    args = p.parse_args()
    results: dict[tuple[str, int], list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="grpo-bench-") as tmp:
        work = Path(tmp)
        model_dir, data, rows = setup(work)
        for r in range(args.rounds):
            order = ("scaletrain", "trl") if r % 2 == 0 else ("trl", "scaletrain")  # alternating
            for n in args.processes:
                for tool in order:
                    res = (run_scaletrain(work, model_dir, data, args.steps, str(r), n) if tool == "scaletrain"
                           else run_trl(work, model_dir, rows, args.steps, str(r), n))
                    results.setdefault((tool, n), []).append(res)
                    print(f"round {r} {tool} x{n}: {json.dumps({k: round(v, 4) for k, v in res.items()})}",
                          flush=True)
    print("| tool | processes | completion tokens/s (median) | step s | reward first -> last 5 |")
    print("|---|---|---|---|---|")
    for (tool, n), rs in results.items():
        m = {k: statistics.median(x[k] for x in rs) for k in rs[0]}
        print(f"| {tool} | {n} | {m['tokens_per_s']:.1f} | {m['step_s']:.3f} | {m['reward_first']:.3f} -> "
              f"{m['reward_last']:.3f} |")
    for n in args.processes:
        ratios = [s["tokens_per_s"] / t["tokens_per_s"]
                  for s, t in zip(results[("scaletrain", n)], results[("trl", n)])]
        print(f"{n} process(es): scaletrain / TRL completion tokens/s: median {statistics.median(ratios):.2f} "
              f"(rounds: {', '.join(f'{x:.2f}' for x in ratios)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
