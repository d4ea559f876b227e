"""Preference tuning side by side with TRL (issue #32): the same tiny LoRA DPO job on the same generated pairs,
scaletrain (`train.stage: dpo`, Ray launcher) vs TRL's DPOTrainer (its own launch: one process, or torchrun with
two), 1 and 2 processes, seeds alternating within one invocation.

    .venv/bin/python benchmarks/preference.py --seeds 3 --steps 40

The job: builtin:tiny-llama (random init, the same weights on both sides: built by scaletrain from the seed),
LoRA r=8 alpha=16 on every linear layer, dropout 0, DPO sigmoid beta 0.1, lr 5e-3 linear decay, 8 pairs per
device per step, chatml (scaletrain: a .jinja whose trained span ends as TRL's completion does, with the
newline after <|im_end|>), 512 demo preference pairs (benchmarks and tests share `demo_data.preference_rows`).
Throughput is each run's own (pairs/s over its training steps: TRL's train_runtime, scaletrain's train time),
shown as completion tokens/s (pairs/s x the pairs' mean completion tokens, both sides, from the tokenized data:
the same for both tools); memory is what training added to each process at its peak, measured the same way on
both sides (scaletrain's PeakMemory: the kernel's VmHWM reset after the imports, minus file-backed pages; it is
summary.json's memory/peak_bytes_per_rank), and TRL's whole-process ru_maxrss beside it. The final loss is the
mean train loss of the last 10 steps (TRL logs every step, as scaletrain does here).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STEPS, BATCH, LR, BETA, PAIRS = 40, 8, 5e-3, 0.1, 512


def _pairs(work: Path) -> tuple[Path, Path]:
    from scaletrain.data.demo import preference_rows

    rows = preference_rows(PAIRS, seed=2)
    ours = work / "pairs.jsonl"
    ours.write_text("".join(json.dumps(r) + "\n" for r in rows))
    theirs = work / "trl.jsonl"
    theirs.write_text("".join(json.dumps({
        "prompt": [{"role": "user", "content": f"{r['instruction']}\n{r['input']}"}],
        "chosen": [{"role": "assistant", "content": r["chosen"]}],
        "rejected": [{"role": "assistant", "content": r["rejected"]}]}) + "\n" for r in rows))
    return ours, theirs


# ChatML whose trained span ends with the newline after <|im_end|>, as TRL's completion does (TRL takes the
# completion as the text after the prompt's generation prompt; scaletrain's built-ins train what the model emits,
# which stops at <|im_end|>): so both sides optimise the same tokens and the final losses compare.
TRL_CHATML = ("{% for message in messages %}{% if message['role'] == 'assistant' %}{{ '<|im_start|>assistant\n' }}"
              "{% generation %}{{ message['content'] + '<|im_end|>\n' }}{% endgeneration %}"
              "{% else %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
              "{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def trl_worker(args) -> None:
    """One TRL process (torchrun starts two): train, then rank 0 writes the metrics and every rank its peak RSS."""
    import torch
    from datasets import load_dataset
    from peft import LoraConfig
    from trl import DPOConfig, DPOTrainer

    from scaletrain.config.schema import ModelConfig
    from scaletrain.memory.measure import PeakMemory
    from scaletrain.model.build import build_model
    from scaletrain.model.tokenizer import Vocab, load_tokenizer
    from scaletrain.worker.trainer import seed_everything

    memory = PeakMemory("cpu")  # where scaletrain's workers start theirs: after the imports, before the model
    tok = load_tokenizer("builtin:tiny-llama")
    seed_everything(args.seed)
    model = build_model(ModelConfig(name_or_path="builtin:tiny-llama", task="causal-lm"), Vocab.of(tok), None)
    data = load_dataset("json", data_files=args.data, split="train")
    config = DPOConfig(output_dir=args.out, per_device_train_batch_size=BATCH, max_steps=args.steps, learning_rate=LR,
                       beta=BETA, use_cpu=True, report_to=[], logging_steps=1, save_strategy="no", max_length=64,
                       seed=args.seed, dataloader_num_workers=0, disable_tqdm=True)
    peft = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM")
    trainer = DPOTrainer(model=model, args=config, train_dataset=data, processing_class=tok, peft_config=peft)
    out = trainer.train()
    rank = int(os.environ.get("RANK", 0))
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    Path(args.out, f"rss-{rank}").write_text(str(memory.peak_bytes()))
    Path(args.out, f"maxrss-{rank}").write_text(str(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024))
    if rank == 0:
        Path(args.out, "result.json").write_text(json.dumps({
            "pairs_per_s": args.steps * BATCH * int(os.environ.get("WORLD_SIZE", 1)) / out.metrics["train_runtime"],
            "losses": losses}))
    del torch


def run_trl(work: Path, data: Path, procs: int, seed: int, steps: int) -> dict:
    out = work / f"trl-{procs}-{seed}-{time.time_ns()}"
    out.mkdir()
    me = [str(Path(__file__).resolve()), "--trl-worker", "--data", str(data), "--out", str(out), "--seed", str(seed),
          "--steps", str(steps)]
    cmd = ([sys.executable, *me] if procs == 1 else
           [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(procs), "--master_port",
            str(29500 + seed), *me])
    subprocess.run(cmd, check=True, capture_output=True, text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    result = json.loads((out / "result.json").read_text())
    result["rss"] = [int((out / f"rss-{r}").read_text()) for r in range(procs)]
    result["maxrss"] = [int((out / f"maxrss-{r}").read_text()) for r in range(procs)]
    return result


def run_scaletrain(work: Path, data: Path, procs: int, seed: int, steps: int) -> dict:
    from scaletrain.config import validate
    from scaletrain.launch.job import run_job
    from scaletrain.metrics.records import read_jsonl

    cfg = validate({
        "model": {"name_or_path": "builtin:tiny-llama", "task": "causal-lm", "finetuning_type": "lora",
                  "lora_rank": 8, "lora_alpha": 16, "lora_dropout": 0.0, "lora_target": "all-linear"},
        "data": {"train_file": str(data), "template": str(work / "trl_chatml.jinja"), "max_length": 64,
                 "eval_ratio": 0.0},
        "train": {"stage": "dpo", "pref_beta": BETA, "per_device_train_batch_size": BATCH, "max_steps": steps,
                  "learning_rate": LR, "logging_steps": 1, "seed": seed},
        "scaling": {"num_workers": procs},
        "monitor": {"report": False},
        "output": {"output_dir": str(work / "runs"), "run_name": f"st-{procs}-{seed}-{time.time_ns()}"},
    })
    run = run_job(cfg, work / "c.yaml", show_progress=False).run_dir
    summary = json.loads((run / "summary.json").read_text())
    losses = [r["train/loss"] for r in read_jsonl(run / "metrics.jsonl") if r["kind"] == "train"]
    return {"pairs_per_s": summary["throughput/samples_per_s"], "losses": losses,
            "rss": summary["memory/peak_bytes_per_rank"], "data": str(run / "data")}


def completion_tokens_per_pair(prepared: str) -> float:
    import datasets

    source = json.loads((Path(prepared) / "source.json").read_text())
    train = datasets.load_from_disk(source["train"])
    total = sum(sum(1 for y in ex["chosen_labels"] if y != -100) + sum(1 for y in ex["rejected_labels"] if y != -100)
                for ex in train)
    return total / len(train)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=STEPS)
    ap.add_argument("--trl-worker", action="store_true")
    ap.add_argument("--data"), ap.add_argument("--out"), ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.trl_worker:
        return trl_worker(args)
    work = Path(tempfile.mkdtemp(prefix="scaletrain-pref-"))
    ours, theirs = _pairs(work)
    (work / "trl_chatml.jinja").write_text(TRL_CHATML)
    results: dict[tuple[str, int], list[dict]] = {}
    tokens = None
    for seed in range(args.seeds):
        order = [("scaletrain", 1), ("trl", 1), ("scaletrain", 2), ("trl", 2)]
        for tool, procs in (order if seed % 2 == 0 else order[::-1]):
            r = (run_scaletrain(work, ours, procs, seed, args.steps) if tool == "scaletrain"
                 else run_trl(work, theirs, procs, seed, args.steps))
            if tokens is None and tool == "scaletrain":
                tokens = completion_tokens_per_pair(r["data"])
            results.setdefault((tool, procs), []).append(r)
            whole = f" (whole process {max(r['maxrss']) / 2**20:.0f} MiB)" if "maxrss" in r else ""
            print(f"seed {seed} {tool} x{procs}: {r['pairs_per_s']:.1f} pairs/s, final loss "
                  f"{statistics.mean(r['losses'][-10:]):.4f}, training peak {max(r['rss']) / 2**20:.0f} MiB{whole}",
                  flush=True)
    print(f"\ncompletion tokens per pair: {tokens:.1f}\n")
    print("| tool | processes | completion tokens/s (median) | training peak per process MiB (median) | final loss "
          "(mean of last 10 steps, per seed) |\n|---|---|---|---|---|")
    for (tool, procs), rs in sorted(results.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        tps = statistics.median(r["pairs_per_s"] for r in rs) * tokens
        rss = statistics.median(max(r["rss"]) for r in rs) / 2**20
        finals = ", ".join(f"{statistics.mean(r['losses'][-10:]):.3f}" for r in rs)
        print(f"| {tool} | {procs} | {tps:.0f} | {rss:.0f} | {finals} |")
    for procs in (1, 2):
        a = statistics.median(r["pairs_per_s"] for r in results[("scaletrain", procs)])
        b = statistics.median(r["pairs_per_s"] for r in results[("trl", procs)])
        print(f"\n{procs} process(es): scaletrain / TRL tokens/s = {a / b:.2f}x")


if __name__ == "__main__":
    main()
