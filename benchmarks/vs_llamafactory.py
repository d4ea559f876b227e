"""scaletrain vs LLaMA-Factory on the same LoRA SFT job, side by side (the cold-start issue's table).

One LLaMA-Factory training YAML is the job for both: LLaMA-Factory runs it (`llamafactory-cli train`, with
FORCE_TORCHRUN=1 NPROC_PER_NODE=2 for 2 processes, as its docs say); scaletrain runs what
`scaletrain import llamafactory` makes of it, as a user would (the default launcher). The model is the tiny Llama
of scaletrain's tests saved as a local HF directory (random init, built from its seed: no download), its tokenizer
with the ChatML template, and LLaMA-Factory's `chatml` template on both sides; the data an alpaca file of --rows
generated examples (instruction, input, output of 1-12 sentences: 30-400 tokens), cutoff 512, batch 4 per process,
--epochs epochs. Variants padded and packed (LLaMA-Factory `packing` + `neat_packing`, scaletrain `data.packing` with
per-example attention), 1 and 2 processes, alternating, medians of --rounds.

Measured per run: examples/s (the examples trained over the trainer's own training time: LLaMA-Factory trains every
row, over its `train_runtime`; scaletrain's `throughput/samples_per_s` counts the examples it trained, a packed
epoch leaving out the rows that do not fill a global batch), start-up (the command's wall time minus that training
time), and the process tree's peak RSS (the command and every descendant, summed, every 0.2 s; cold_start.py's sampler).

LLaMA-Factory lives in a venv of its own (other transformers/accelerate/trl pins), made by
`bash benchmarks/llamafactory_env.sh /tmp/lf-venv`:

    python benchmarks/vs_llamafactory.py --llamafactory /tmp/lf-venv --rounds 3 --epochs 3
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from cold_start import run_tree

from scaletrain.data.demo import NEGATIVE, POSITIVE, SUBJECTS, alpaca_rows

BATCH = 4


def rows(n: int, seed: int = 0) -> list[dict]:
    """alpaca rows whose answers run from one sentence to twelve (a spread of lengths, as real data has)."""
    rng = random.Random(seed)
    out = []
    for r in alpaca_rows(n, seed):
        extra = " ".join(f"{rng.choice(SUBJECTS)} was {rng.choice(POSITIVE + NEGATIVE)}." for _ in
                         range(rng.randint(0, 11)))
        out.append({**r, "output": f"{r['output']} {extra}".strip()})
    return out


def setup(work: Path, n: int, epochs: int) -> dict[str, Path]:
    import torch  # noqa: F401  (the model is built here, once)

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
    data = work / "data"
    data.mkdir()
    (data / "bench.json").write_text(json.dumps(rows(n)))
    (data / "dataset_info.json").write_text(json.dumps({"bench": {"file_name": "bench.json"}}))
    configs = {}
    for packed in (False, True):
        name = "packed" if packed else "padded"
        lf = work / f"lf-{name}.yaml"
        lf.write_text("\n".join([
            f"model_name_or_path: {model_dir}", "stage: sft", "do_train: true", "finetuning_type: lora",
            "lora_rank: 8", "lora_alpha: 16", "lora_target: all", "dataset: bench", f"dataset_dir: {data}",
            "template: chatml", "cutoff_len: 512", "overwrite_cache: true", f"per_device_train_batch_size: {BATCH}",
            "gradient_accumulation_steps: 1", "learning_rate: 1.0e-4", f"num_train_epochs: {epochs}.0",
            "lr_scheduler_type: cosine", "logging_steps: 10", "save_strategy: 'no'", "report_to: none",
            "overwrite_output_dir: true", "dataloader_num_workers: 0",
            *(["packing: true", "neat_packing: true"] if packed else []), ""]))
        st = work / f"st-{name}.yaml"
        subprocess.run([sys.executable, "-m", "scaletrain", "import", "llamafactory", str(lf), "-o", str(st)],
                       check=True, capture_output=True)
        configs[name] = lf
        configs[f"st-{name}"] = st
    return configs


def llamafactory(venv: Path, cfg: Path, workers: int, out: Path, work: Path, examples: int) -> dict:
    env = {**os.environ, "PATH": f"{venv / 'bin'}:{os.environ['PATH']}", "DISABLE_VERSION_CHECK": "1",
           "HF_HUB_OFFLINE": "1", "WANDB_DISABLED": "true",
           **({"FORCE_TORCHRUN": "1", "NPROC_PER_NODE": str(workers)} if workers > 1 else {})}
    env.pop("PYTHONPATH", None)
    r = run_tree([str(venv / "bin" / "llamafactory-cli"), "train", str(cfg), f"output_dir={out}"], env=env,
                 cwd=work)
    train_s = json.loads((out / "train_results.json").read_text())["train_runtime"]
    return {**r, "train_s": train_s, "examples_per_s": examples / train_s}


def scaletrain(cfg: Path, workers: int, out: Path, work: Path, examples: int) -> dict:
    r = run_tree([sys.executable, "-m", "scaletrain", "train", str(cfg), f"scaling.num_workers={workers}",
                  f"output.output_dir={out}", "--no-progress"], cwd=work)
    run = next(p for p in out.iterdir() if (p / "summary.json").is_file())
    summary = json.loads((run / "summary.json").read_text())
    return {**r, "train_s": summary["train_time_s"] + summary.get("eval_time_s", 0.0),
            "examples_per_s": summary["throughput/samples_per_s"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--llamafactory", type=Path, required=True, help="the venv benchmarks/llamafactory_env.sh made")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--rows", type=int, default=1000)
    ap.add_argument("--epochs", type=int, default=3)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="scaletrain-vs-lf-"))
    configs = setup(work, args.rows, args.epochs)
    results: dict[tuple, list[dict]] = {}
    for i in range(args.rounds):
        for layout in ("padded", "packed"):
            for workers in (1, 2):
                runs = [("LLaMA-Factory", llamafactory, (args.llamafactory, configs[layout], workers)),
                        ("scaletrain", scaletrain, (configs[f"st-{layout}"], workers))]
                for side, fn, fn_args in (runs if i % 2 == 0 else runs[::-1]):
                    r = fn(*fn_args, work / f"{side[:2]}-{layout}-{workers}-{i}", work, args.rows * args.epochs)
                    r["startup_s"] = r["wall_s"] - r["train_s"]
                    results.setdefault((layout, workers, side), []).append(r)
                    print(f"round {i} {layout} x{workers} {side}: {r['examples_per_s']:.1f} examples/s, start-up "
                          f"{r['startup_s']:.1f} s, wall {r['wall_s']:.1f} s, tree {r['tree_peak_gib']:.2f} GiB",
                          flush=True)
    print("| variant | examples/s LF / st | ratio | start-up LF / st | ratio | tree peak RSS LF / st | ratio | "
          "examples/s ratio per round |")
    print("|---|---|---|---|---|---|---|---|")
    for layout in ("padded", "packed"):
        for workers in (1, 2):
            m = {side: {k: statistics.median(r[k] for r in results[(layout, workers, side)])
                        for k in ("examples_per_s", "startup_s", "tree_peak_gib")}
                 for side in ("LLaMA-Factory", "scaletrain")}
            lf, st = m["LLaMA-Factory"], m["scaletrain"]
            ratio = {k: st[k] / lf[k] for k in lf}
            pairs = zip(results[(layout, workers, "LLaMA-Factory")], results[(layout, workers, "scaletrain")])
            rounds = ", ".join(f"{b['examples_per_s'] / a['examples_per_s']:.2f}" for a, b in pairs)
            print(f"| {layout}, {workers} process(es) | {lf['examples_per_s']:.1f} / {st['examples_per_s']:.1f} | "
                  f"{ratio['examples_per_s']:.2f}x | {lf['startup_s']:.1f} / {st['startup_s']:.1f} s | "
                  f"{ratio['startup_s']:.2f}x | {lf['tree_peak_gib']:.2f} / {st['tree_peak_gib']:.2f} GiB | "
                  f"{ratio['tree_peak_gib']:.2f}x | {rounds} |")

if __name__ == "__main__":
    main()
