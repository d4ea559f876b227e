"""Padded (as before) vs balanced ranks vs packed: a Llama-architecture causal LM (4 layers, d=256) at cutoff 512,
2 workers on the local Ray, the same examples with instruction-data lengths (most under 256 tokens, a long tail).

    .venv/bin/python benchmarks/packing.py --seeds 3 --steps 60

Per variant: target (non-padding) tokens/s, the padding share, the spread of the ranks' tokens (what makes ranks
wait at the sync), the peak RSS per worker, and the eval loss after the same number of target tokens.
"packed" keeps the batch shape (4 rows per device, as torchtune's ladder does), so its full 512-token rows
hold ~2.2x the tokens of a padded step and it takes fewer, larger steps: a different optimisation at the same
learning rate. "packed, matched" takes as many rows as hold about a padded step's tokens (2) and as many target
tokens in total: its loss is the one to compare. Each seed (`train.seed`: the initial weights and the sample
order) runs every variant, alternating (forward, then reverse); a variant's loss is within noise when its gap
to the padded run of the same seed is no larger than the seed-to-seed spread of either. Speeds are medians.
Targets: packed >= 2x and balanced >= 1.15x the padded target tokens/s; the losses within noise.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
from pathlib import Path

import yaml

WORDS = ("the a of to and in is that for it as was with be by on not this are or from at which but have an they "
         "you were one all we can has there been if more when will would who so explain write list describe "
         "summarize translate code function data model answer question example number time people").split()


def write_data(path: Path, n: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    with open(path, "w") as f:
        for _ in range(n):
            reply = max(1, int(rng.lognormvariate(0, 1.0) * 40))  # median ~40 words, a tail to ~400
            f.write(json.dumps({"instruction": " ".join(rng.choices(WORDS, k=rng.randint(4, 30))),
                                "output": " ".join(rng.choices(WORDS, k=min(reply, 450)))}) + "\n")


def write_model(out: Path) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from scaletrain.model.tokenizer import load_tokenizer

    tok = load_tokenizer("builtin:tiny-llama")
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=256, num_hidden_layers=4,
                                         num_attention_heads=4, num_key_value_heads=4, intermediate_size=688,
                                         max_position_embeddings=1024, pad_token_id=tok.pad_token_id,
                                         tie_word_embeddings=True))
    model.save_pretrained(str(out))
    tok.save_pretrained(str(out))
    return out


def config(model: Path, data: Path, out: Path, name: str, steps: int, seed: int, rows: int, **data_keys) -> dict:
    held_out = data.with_name("eval.jsonl")  # one eval set for every run and seed
    return {"model": {"name_or_path": str(model), "task": "causal-lm", "dropout": 0.0},
            "data": {"train_file": str(data), "eval_file": str(held_out), "template": "alpaca", "cutoff_len": 512,
                     **data_keys},
            "train": {"per_device_train_batch_size": rows, "learning_rate": 1e-3, "max_steps": steps,
                      "logging_steps": 2, "seed": seed, "warmup_steps": 0, "lr_scheduler_type": "constant"},
            "scaling": {"num_workers": 2}, "monitor": {"report": False},
            "output": {"output_dir": str(out), "run_name": name}}


def measure(run: Path, warmup_records: int = 1) -> dict:
    from scaletrain.metrics.records import read_jsonl

    records = read_jsonl(run / "metrics.jsonl")
    train = [r for r in records if r["kind"] == "train"][warmup_records:]
    evals = [r for r in records if r["kind"] == "eval"]
    system = [r for r in records if r["kind"] == "system"]
    return {"target_tokens_per_s": statistics.median(r["throughput/tokens_per_s"] for r in train),
            "padding_pct": statistics.median(r["data/padding_pct"] for r in train),
            # step times are equal across ranks (each waits for the others at the gradient sync): the imbalance
            # that makes them wait is the spread of the ranks' tokens, (max - min) / mean
            "rank_token_spread": statistics.median(r["data/tokens_per_rank_spread"] for r in train),
            "peak_rss_gib": max((r["memory/rss_gib"] for r in system), default=None),
            "eval_loss": evals[-1].get("eval/loss") if evals else None,
            "steps": json.loads((run / "summary.json").read_text())["steps"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=3, help="seeds (rounds): each runs every variant")
    ap.add_argument("--steps", type=int, default=60, help="steps of the padded and balanced runs")
    ap.add_argument("--examples", type=int, default=3000)
    args = ap.parse_args()
    import ray

    from scaletrain.config import validate
    from scaletrain.launch.job import run_job
    from scaletrain.model.tokenizer import load_tokenizer

    work = Path(tempfile.mkdtemp(prefix="scaletrain-packing-"))
    data = work / "sft.jsonl"
    write_data(data, args.examples)
    write_data(data.with_name("eval.jsonl"), 150, seed=99)
    model = write_model(work / "llama-4x256")
    tok = load_tokenizer("builtin:tiny-llama")
    lengths = [len(tok(json.loads(line)["instruction"] + json.loads(line)["output"])["input_ids"]) + 12
               for line in data.read_text().splitlines()]
    mean_len = statistics.mean(min(n, 512) for n in lengths)
    rows = 4  # per device, padded, balanced and packed
    # packed rows hold ~512 x fill tokens: about a padded step's tokens in fewer rows, and as many target tokens
    # in total in proportionally fewer steps
    tokens = args.steps * rows * mean_len
    matched_rows = max(1, round(rows * mean_len / (512 * 0.95)))
    plan = {"padded": (args.steps, rows), "balanced": (args.steps, rows),
            "packed": (max(2, round(tokens / (rows * 512 * 0.95))), rows),
            "packed, matched": (max(2, round(tokens / (matched_rows * 512 * 0.95))), matched_rows)}
    print(f"{args.examples} examples, median {statistics.median(lengths)} tokens, mean {mean_len:.0f}, "
          f"{sum(n > 256 for n in lengths) / len(lengths):.0%} over 256; (steps, rows per device): {plan}")
    ray.init(num_cpus=2, log_to_driver=False, include_dashboard=False)
    variants = {"padded": {"balance_ranks": False}, "balanced": {"balance_ranks": True}, "packed": {"packing": True},
                "packed, matched": {"packing": True}}
    results: dict[str, list[dict]] = {k: [] for k in variants}
    for r in range(args.seeds):
        seed = r + 1
        for name in (list(variants) if r % 2 == 0 else list(variants)[::-1]):
            steps, n = plan[name]
            cfg = config(model, data, work / "runs", f"{name.replace(', ', '-')}-{seed}", steps, seed, n,
                         **variants[name])
            (work / f"{name}.yaml").write_text(yaml.safe_dump(cfg))
            result = run_job(validate(cfg), work / f"{name}.yaml", show_progress=False)
            results[name].append(measure(result.run_dir))
            print(f"seed {seed} {name:>8}: {results[name][-1]}", flush=True)
    ray.shutdown()
    med = {k: {m: statistics.median(x[m] for x in v if x[m] is not None) for m in v[0]} for k, v in results.items()}
    base = med["padded"]["target_tokens_per_s"]
    print("\n| variant | target tokens/s | vs padded | padding | rank token spread | peak RSS GiB | eval loss "
          "(per seed) | steps |\n|---|---|---|---|---|---|---|---|")
    for k, m in med.items():
        losses = ", ".join(f"{x['eval_loss']:.4f}" for x in results[k])
        print(f"| {k} | {m['target_tokens_per_s']:.0f} | {m['target_tokens_per_s'] / base:.2f}x | "
              f"{m['padding_pct']:.1f}% | {m['rank_token_spread']:.3f} | {m['peak_rss_gib']:.2f} | "
              f"{losses} | {m['steps']:.0f} |")
    # noise: how far one variant's loss moves with the seed; the gaps to the padded run are compared with it
    spread = {k: max(x["eval_loss"] for x in v) - min(x["eval_loss"] for x in v) for k, v in results.items()}
    print("seed-to-seed spread of the eval loss: " + ", ".join(f"{k} {v:.4f}" for k, v in spread.items()))
    for k in ("balanced", "packed, matched", "packed"):
        gaps = [abs(a["eval_loss"] - b["eval_loss"]) for a, b in zip(results[k], results["padded"])]
        noise = max(spread[k], spread["padded"])
        print(f"{k}: eval loss gap to padded, same seed: {', '.join(f'{g:.4f}' for g in gaps)} (median "
              f"{statistics.median(gaps):.4f}; noise {noise:.4f}): "
              f"{'within' if statistics.median(gaps) <= noise else 'NOT within'} noise")
    print("targets: packed >= 2x, balanced >= 1.15x the padded target tokens/s; losses within noise")


if __name__ == "__main__":
    main()
