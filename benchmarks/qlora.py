"""bf16 LoRA against NF4 QLoRA (issue #63): the base's bytes, the peak memory and tokens/s, side by side.

The same LoRA SFT job (rank 16 on every linear layer, alpaca rows of 1 to 12 sentences, cutoff 256, batch 4, bf16
compute on CPU: `model.torch_dtype: bfloat16` with `train.bf16: true`, the GPU precision policy) on the shapes of
`builtin:llama-100m` (12 x d768) and `builtin:llama-1b` (16 x d2048), saved in bf16 first as a hub checkpoint
arrives (benchmarks/gpu_models.py's way: loaded in bf16, not built in fp32), one process, with the base stored in
bf16 and in NF4 (`model.quantization_bit: 4`, torchao), alternating, medians over --rounds. The worker's allocator
returns freed memory (MALLOC_MMAP_THRESHOLD_=65536, comm.env), so its peak resident-set growth is the live peak.

Measured per run: the parameters' bytes the worker held (summary.json `memory/param_bytes_per_rank`, NF4 counted
by its stored tensors), its peak memory growth (`memory/peak_bytes`), the plan's predicted peak, and steady tokens/s
(the median of the train records after the first 2).

    .venv/bin/python benchmarks/qlora.py --rounds 2
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

MODELS = {"100m": ("builtin:llama-100m", 12), "1b": ("builtin:llama-1b", 4)}  # path, steps
GIB = 2**30


def save_bf16(work: Path, name: str) -> Path:
    """The built-in's shape saved in bf16 with its tokenizer (random init from seed 0), once."""
    import torch

    from scaletrain.config.schema import ModelConfig
    from scaletrain.model.build import build_model
    from scaletrain.model.tokenizer import Vocab, load_tokenizer

    out = work / name.split(":")[-1]
    if not out.exists():
        tok = load_tokenizer(name)
        torch.manual_seed(0)
        build_model(ModelConfig(name_or_path=name, task="causal-lm"), Vocab.of(tok)).to(torch.bfloat16) \
            .save_pretrained(out)
        tok.save_pretrained(out)
    return out


def run(work: Path, model: str, nf4: bool, tag: str) -> dict:
    name, steps = MODELS[model]
    m = {"name_or_path": str(save_bf16(work, name)), "task": "causal-lm", "finetuning_type": "lora",
         "lora_rank": 16, "lora_alpha": 32, "dropout": 0.0, "torch_dtype": "bfloat16"}
    if nf4:
        m.update(quantization_bit=4, quantization_method="torchao")
    cfg = {"model": m,
           "data": {"train_file": str(work / "data.jsonl"), "template": "alpaca", "max_length": 256,
                    "eval_ratio": 0},
           "train": {"per_device_train_batch_size": 4, "max_steps": steps, "learning_rate": 1e-4,
                     "logging_steps": 1, "bf16": True},
           "comm": {"env": {"MALLOC_MMAP_THRESHOLD_": "65536"}},
           "scaling": {"num_workers": 1, "launcher": "local"},
           "output": {"output_dir": str(work / "runs"), "run_name": tag}, "monitor": {"report": False}}
    path = work / f"{tag}.json"
    path.write_text(json.dumps(cfg))
    out = subprocess.run([sys.executable, "-m", "scaletrain", "train", str(path), "--no-progress"],
                         capture_output=True, text=True, timeout=3600,
                         env={k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"})
    if out.returncode:
        raise SystemExit(f"{tag} failed:\n{out.stderr[-3000:]}")
    run_dir = work / "runs" / tag
    summary = json.loads((run_dir / "summary.json").read_text())
    train = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    train = [r for r in train if r["kind"] == "train"]
    return {"param_gib": summary["memory/param_bytes_per_rank"][0] / GIB,
            "peak_gib": summary["memory/peak_bytes"] / GIB,
            "predicted_peak_gib": summary["memory/predicted_peak_bytes"] / GIB,
            "tokens_per_s": statistics.median(r["throughput/tokens_per_s"] for r in train[2:]),
            "loss_first": train[0]["train/loss"], "loss_last": train[-1]["train/loss"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--models", default="100m,1b")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="qlora-bench-"))
    (work / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows(400)))
    results: dict[tuple, list[dict]] = {}
    for rnd in range(args.rounds):
        for model in args.models.split(","):
            for nf4 in ((False, True) if rnd % 2 == 0 else (True, False)):
                tag = f"{model}-{'nf4' if nf4 else 'bf16'}-r{rnd}"
                r = run(work, model, nf4, tag)
                results.setdefault((model, nf4), []).append(r)
                print(tag, json.dumps(r), flush=True)
    print("\n| model | base | parameters held (GiB) | peak growth (GiB) | plan's peak (GiB) | tokens/s |")
    print("|---|---|---|---|---|---|")
    for model in args.models.split(","):
        for nf4 in (False, True):
            rs = results[(model, nf4)]
            med = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
            print(f"| {model} | {'NF4' if nf4 else 'bf16'} | {med['param_gib']:.3f} | {med['peak_gib']:.3f} | "
                  f"{med['predicted_peak_gib']:.3f} | {med['tokens_per_s']:,.0f} |")


if __name__ == "__main__":
    main()
