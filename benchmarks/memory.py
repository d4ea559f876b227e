"""Peak memory per worker, side by side: a ~80M-parameter Llama (builtin:llama-100m, 12 x d768) full fine-tune at
cutoff 512 on 2 CPU workers of the local Ray: DDP vs FSDP, gradient checkpointing off vs on; checkpoint save time
(the time the step waits) and size, sync vs async (DCP async_save).

    .venv/bin/python benchmarks/memory.py --rounds 1 --steps 4
    .venv/bin/python benchmarks/memory.py --part vocab --rounds 3 --steps 4   # plain vs chunked loss, 128k vocab

Each run's summary.json holds its measured peak (the worker's resident-set high-water mark over its start, with
glibc's mmap threshold fixed by comm.env, so that freed tensors leave it: envvars.py) and the plan's prediction
with its breakdown. Variants alternate within a round; medians. Targets (issue: fitting big models): FSDP's
weights+gradients+optimizer share per rank <= 0.55x DDP's; checkpointing cuts activation memory by >= 50% for <=
40% more step time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling benchmark scripts
from packing import write_data

VARIANTS = {"ddp": {"strategy": "ddp"}, "fsdp": {"strategy": "fsdp"},
            "ddp+ckpt": {"strategy": "ddp", "gradient_checkpointing": True},
            "fsdp+async-save": {"strategy": "fsdp", "async_save": True}}


from scaletrain.envvars import CPU_MMAP_THRESHOLD_BYTES, MALLOC_MMAP_THRESHOLD  # noqa: E402


def config(data: Path, out: Path, name: str, steps: int, async_save: bool = False, **train) -> dict:
    return {"model": {"name_or_path": "builtin:llama-100m", "task": "causal-lm", "dropout": 0.0},
            "data": {"train_file": str(data), "template": "alpaca", "cutoff_len": 512, "eval_ratio": 0.01,
                     "packing": True},
            "train": {"per_device_train_batch_size": 1, "per_device_eval_batch_size": 1, "learning_rate": 1e-4,
                      "max_steps": steps, "logging_steps": 1, "seed": 1, **train},
            "checkpoint": {"save_steps": max(1, steps // 2), "save_total_limit": 2, "async_save": async_save},
            "scaling": {"num_workers": 2}, "monitor": {"report": False},
            "comm": {"env": {MALLOC_MMAP_THRESHOLD: CPU_MMAP_THRESHOLD_BYTES}},  # the live peak, not glibc's heap
            "output": {"output_dir": str(out), "run_name": name}}


def measure(run: Path) -> dict:
    from scaletrain.metrics.records import read_jsonl

    s = json.loads((run / "summary.json").read_text())
    records = read_jsonl(run / "metrics.jsonl")
    steps = [r["time/step_s"] for r in records if r["kind"] == "train"][1:]
    saves = [r["time/checkpoint_s"] for r in records if r["kind"] == "checkpoint"]
    ckpt = sorted((run / "checkpoints").glob("step-*"))[-1]
    p = s["memory/predicted"]
    return {"peak_mib": s["memory/peak_bytes"] / 2**20, "predicted_mib": s["memory/predicted_peak_bytes"] / 2**20,
            "state_mib": (p["parameters"] + p["optimizer"] + p["buffers"]) / 2**20 + _grads(s) / 2**20,
            "activations_mib": p["activations"] / 2**20, "step_s": statistics.median(steps),
            "save_s": statistics.median(saves),
            "checkpoint_mib": sum(f.stat().st_size for f in ckpt.rglob("*") if f.is_file()) / 2**20}


def _grads(summary: dict) -> int:
    """The gradients a rank holds at the end of backward (sharded under FSDP), from the run's own model size."""
    trainable = summary.get("parameters/trainable", 0)
    return trainable * 4 // (summary["world_size"] if summary.get("strategy") == "fsdp" else 1)


def vocab_config(model: Path, data: Path, out: Path, name: str, steps: int, chunk: int | None) -> dict:
    """A 128k-vocabulary Llama with 2 small layers (the logits dominate) at cutoff 2048, one worker in-process."""
    return {"model": {"name_or_path": str(model), "task": "causal-lm", "dropout": 0.0},
            "data": {"train_file": str(data), "template": "alpaca", "cutoff_len": 2048, "eval_ratio": 0.01,
                     "packing": True, "max_truncated_ratio": 1.0},
            "train": {"per_device_train_batch_size": 1, "per_device_eval_batch_size": 1, "learning_rate": 1e-4,
                      "max_steps": steps, "logging_steps": 1, "seed": 1, "loss_chunk_tokens": chunk},
            "monitor": {"report": False}, "output": {"output_dir": str(out), "run_name": name}}


def vocab_one_run(config_path: str) -> None:
    """One variant in this (fresh) process: the driver's preflight, then the worker loop in-process."""
    from scaletrain.config import load_config
    from scaletrain.launch.job import build_spec
    from scaletrain.launch.local import run_in_process
    from scaletrain.launch.preflight import preflight
    from scaletrain.rundir import check_output_dir, create_run_dir

    cfg = load_config(config_path)
    check_output_dir(cfg.output.output_dir, cfg.output.run_name)
    pre = preflight(cfg)
    run = create_run_dir(cfg.output.output_dir, cfg.output.run_name, config_path)
    run_in_process(build_spec(pre, run, "gloo"))


def vocab_main(rounds: int, steps: int) -> None:
    """Plain vs chunked loss on the 128k-vocabulary model, alternating, each run a fresh process (its own peak):
    peak per worker, the share of it that is not the model's states (the logits/loss term: the layers are few),
    step time, and the plan's prediction against the measured peak."""
    import os
    import subprocess

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from scaletrain.model.tokenizer import tiny_llama_tokenizer

    work = Path(tempfile.mkdtemp(prefix="scaletrain-vocab-"))
    model = work / "llama-128k"
    LlamaForCausalLM(LlamaConfig(vocab_size=128256, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                                 tie_word_embeddings=False)).to(torch.bfloat16).save_pretrained(model)
    tiny_llama_tokenizer().save_pretrained(model)
    data = work / "sft.jsonl"
    write_data(data, 600)
    env = {**os.environ, MALLOC_MMAP_THRESHOLD: CPU_MMAP_THRESHOLD_BYTES}  # the live peak, not glibc's heap
    variants = {"plain": 0, "chunked": None}
    results: dict[str, list[dict]] = {k: [] for k in variants}
    for r in range(rounds):
        for name in (list(variants) if r % 2 == 0 else list(variants)[::-1]):
            cfg = work / f"{name}-{r}.yaml"
            cfg.write_text(yaml.safe_dump(vocab_config(model, data, work / "runs", f"{name}-{r}", steps,
                                                       variants[name])))
            subprocess.run([sys.executable, __file__, "--one-vocab-run", str(cfg)], env=env, check=True)
            results[name].append(vocab_measure(work / "runs" / f"{name}-{r}"))
            print(f"round {r} {name:>8}: {results[name][-1]}", flush=True)
    med = {k: {m: statistics.median(x[m] for x in v) for m in v[0]} for k, v in results.items()}
    print("\n| variant | measured peak MiB | of it beyond the states (logits/loss) MiB | predicted MiB | "
          "predicted/measured | step s |\n|---|---|---|---|---|---|")
    for k, m in med.items():
        print(f"| {k} | {m['peak_mib']:.0f} | {m['beyond_mib']:.0f} | {m['predicted_mib']:.0f} | "
              f"{m['predicted_mib'] / m['peak_mib']:.2f} | {m['step_s']:.2f} |")
    plain, chunked = med["plain"], med["chunked"]
    print(f"logits/loss share of the peak: {plain['beyond_mib'] / chunked['beyond_mib']:.1f}x smaller (target >= 4x); "
          f"step time {chunked['step_s'] / plain['step_s'] - 1:+.0%} (target <= +10%)")


def vocab_measure(run: Path) -> dict:
    from scaletrain.metrics.records import read_jsonl

    s = json.loads((run / "summary.json").read_text())
    steps = [r["time/step_s"] for r in read_jsonl(run / "metrics.jsonl") if r["kind"] == "train"][1:]
    states = s["memory/param_bytes_per_rank"][0] + s["memory/optimizer_bytes_per_rank"][0] + \
        s["memory/param_bytes_per_rank"][0]  # parameters, optimizer state and the (fp32) gradients
    return {"peak_mib": s["memory/peak_bytes"] / 2**20, "beyond_mib": (s["memory/peak_bytes"] - states) / 2**20,
            "predicted_mib": s["memory/predicted_peak_bytes"] / 2**20, "step_s": statistics.median(steps)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--part", choices=("levers", "vocab"), default="levers",
                    help="levers: DDP/FSDP/checkpointing/async saves; vocab: plain vs chunked loss, 128k vocabulary")
    ap.add_argument("--one-vocab-run", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one_vocab_run:
        return vocab_one_run(args.one_vocab_run)
    if args.part == "vocab":
        return vocab_main(args.rounds, args.steps)
    import ray

    from scaletrain.config import validate
    from scaletrain.launch.job import run_job

    work = Path(tempfile.mkdtemp(prefix="scaletrain-memory-"))
    data = work / "sft.jsonl"
    write_data(data, 600)
    ray.init(num_cpus=2, log_to_driver=False, include_dashboard=False)
    results: dict[str, list[dict]] = {k: [] for k in VARIANTS}
    for r in range(args.rounds):
        for name in (list(VARIANTS) if r % 2 == 0 else list(VARIANTS)[::-1]):
            cfg = config(data, work / "runs", f"{name}-{r}", args.steps, **VARIANTS[name])
            (work / f"{name}.yaml").write_text(yaml.safe_dump(cfg))
            results[name].append(measure(run_job(validate(cfg), work / f"{name}.yaml", show_progress=False).run_dir))
            print(f"round {r} {name:>9}: {results[name][-1]}", flush=True)
    ray.shutdown()
    med = {k: {m: statistics.median(x[m] for x in v) for m in v[0]} for k, v in results.items()}
    print("\n| variant | measured peak MiB/rank | predicted MiB | predicted/measured | weights+grads+optim(+buckets) "
          "MiB | activations MiB | step s | checkpoint save s | checkpoint MiB "
          "|\n|---|---|---|---|---|---|---|---|---|")
    for k, m in med.items():
        print(f"| {k} | {m['peak_mib']:.0f} | {m['predicted_mib']:.0f} | {m['predicted_mib'] / m['peak_mib']:.2f} | "
              f"{m['state_mib']:.0f} | {m['activations_mib']:.0f} | {m['step_s']:.2f} | {m['save_s']:.2f} | "
              f"{m['checkpoint_mib']:.0f} |")
    ddp, fsdp, ckpt, asy = med["ddp"], med["fsdp"], med["ddp+ckpt"], med["fsdp+async-save"]
    print(f"FSDP checkpoint save the step waits for: sync {fsdp['save_s']:.2f} s, async {asy['save_s']:.2f} s; "
          f"step time sync {fsdp['step_s']:.2f} s, async {asy['step_s']:.2f} s")
    print(f"FSDP state share vs DDP (predicted breakdown): {fsdp['state_mib'] / ddp['state_mib']:.2f}x (target <= "
          f"0.55)")
    print(f"checkpointing: measured peak {ckpt['peak_mib'] - ddp['peak_mib']:+.0f} MiB, activations "
          f"{ckpt['activations_mib'] / ddp['activations_mib'] - 1:+.0%} (target <= -50%), step time "
          f"{ckpt['step_s'] / ddp['step_s'] - 1:+.0%} (target <= +40%)")


if __name__ == "__main__":
    main()
