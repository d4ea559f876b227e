"""Data preparation: the per-row reader and tokenizer scaletrain had before (a faithful copy below) against the
datasets layer, cold (``data.preprocessing_num_workers=2``) and cached, on a generated alpaca-like JSONL with
instruction-data lengths, MiniLM's tokenizer; then a worker's RSS after it loads its split, 20k vs 200k rows.

    .venv/bin/python benchmarks/data_prep.py --rows 200000 --rounds 2

Variants alternate within a round; medians over rounds. Targets: cold >= 5x faster than before, cached >= 50x
faster than before's cold, worker RSS of the 200k split within 10% of the 20k one.

``--chat`` measures instead the tokenization of multi-turn conversations through a real chat template (Qwen2.5's,
tests/fixtures/chat_templates; data.template: auto, every assistant turn trained): records/s per core with one
process and with every core (the default for a large source), alternating, and the driver's peak RSS growth
(target >= 300 records/s per core, issue #46).

``--stream`` measures data.streaming (data/stream.py): the same conversations in 8 JSON Lines shards, read by one
rank of 1 and of 2 (every rank reads the stream and keeps its every N-th record): records/s read, parsed and
tokenized by the rank, alternating; then a resume's restore of a mid-epoch position (its time, the shards read
again, the position's size in the checkpoint).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WORDS = ("the a of to and in is that for it as was with be by on not he this are or his from at which but have an "
         "they you were their one all we can her has there been if more when will would who so no explain write list "
         "describe summarize translate code function data model answer question example number time people").split()


def generate(path: Path, rows: int, seed: int = 0) -> None:
    """Alpaca rows whose lengths follow instruction data: most prompts short, replies log-normal with a long tail."""
    rng = random.Random(seed)

    def text(median_words: float, sigma: float) -> str:
        n = max(1, int(rng.lognormvariate(0, sigma) * median_words))
        return " ".join(rng.choice(WORDS) for _ in range(n))

    with open(path, "w") as f:
        for _ in range(rows):
            f.write(json.dumps({"instruction": text(12, 0.6), "input": text(8, 1.0) if rng.random() < 0.4 else "",
                                "output": text(60, 0.9)}) + "\n")


# --- before: scaletrain's data path until the datasets layer (src/scaletrain/data.py at a87110e) ----------------
ALPACA_PROMPT = "### Instruction:\n{instruction}\n\n### Response:\n"
ALPACA_PROMPT_WITH_INPUT = "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n"


def before(path: Path, tokenizer, max_length: int, out: Path) -> None:
    import torch

    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    order = list(range(len(rows)))
    random.Random(42).shuffle(order)
    n_eval = int(round(len(rows) * 0.1))
    eval_rows, rows = [rows[i] for i in order[:n_eval]], [rows[i] for i in order[n_eval:]]
    eos = tokenizer.sep_token_id

    def example(row):
        extra = str(row.get("input") or "").strip()
        template = ALPACA_PROMPT_WITH_INPUT if extra else ALPACA_PROMPT
        prompt = template.format(instruction=row["instruction"], input=extra)
        prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        answer_ids = tokenizer(str(row["output"]), add_special_tokens=False)["input_ids"] + [eos]
        return {"input_ids": (prompt_ids + answer_ids)[:max_length],
                "labels": ([-100] * len(prompt_ids) + answer_ids)[:max_length]}

    torch.save([example(r) for r in rows], out / "train.pt")
    torch.save([example(r) for r in eval_rows], out / "eval.pt")


def after(path: Path, tokenizer, max_length: int, out: Path, cold: bool):
    from scaletrain.config import validate
    from scaletrain.data import prepare_data

    cfg = validate({"model": {"name_or_path": "builtin:tiny-llama", "task": "causal-lm"},
                    "data": {"train_file": str(path), "max_length": max_length, "template": "alpaca",
                             "preprocessing_num_workers": 2, "overwrite_cache": cold, "cache_dir": str(out)},
                    "output": {"output_dir": str(out)}})
    return prepare_data(cfg, tokenizer)


RSS_PROBE = """
import os, random, sys, psutil
proc = psutil.Process()
import datasets, torch  # what a worker has imported before it loads its split
from scaletrain.data import Collator, load_split
base = proc.memory_info().rss
ds = load_split(sys.argv[1])
rng = random.Random(0)
batch = Collator(0)([ds[rng.randrange(len(ds))] for _ in range(64)])
print(len(ds), base, proc.memory_info().rss)
"""


def worker_rss(split: str) -> tuple[int, float, float]:
    out = subprocess.run([sys.executable, "-c", RSS_PROBE, split], capture_output=True, text=True, check=True)
    n, base, rss = out.stdout.split()
    return int(n), int(base) / 2**20, int(rss) / 2**20


CHAT_PROBE = """
import json, os, sys, threading, time
import psutil
from scaletrain.config import validate
from scaletrain.data import prepare_data
from scaletrain.model.tokenizer import tiny_llama_tokenizer
path, template, workers, cache = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
tok = tiny_llama_tokenizer()
tok.chat_template = open(template).read()
proc, peak, done = psutil.Process(), [0], threading.Event()
def watch():
    while not done.is_set():
        peak[0] = max(peak[0], proc.memory_info().rss)
        time.sleep(0.01)
cfg = validate({"model": {"name_or_path": "builtin:tiny-llama", "task": "causal-lm"},
                "data": {"train_file": path, "formatting": "messages", "template": "auto", "max_length": 1024,
                         "preprocessing_num_workers": workers or None, "overwrite_cache": True, "cache_dir": cache},
                "output": {"output_dir": cache}})
before = proc.memory_info().rss
threading.Thread(target=watch, daemon=True).start()
t0 = time.perf_counter()
data = prepare_data(cfg, tok)
took = time.perf_counter() - t0
done.set()
note = next(n for n in data.notes if n.startswith("data: tokenized"))
print(json.dumps({"s": took, "rss_growth_mb": (peak[0] - before) / 1e6, "note": note}))
"""


def conversations(path: Path, rows: int, shards: int = 1) -> None:
    """Multi-turn conversations (1-3 turns) in ``shards`` JSON Lines files (``path`` itself when one)."""
    rng = random.Random(0)
    files = [open(path if shards == 1 else path / f"part-{s:03d}.jsonl", "w") for s in range(shards)]  # noqa: SIM115
    for i in range(rows):
        turns = []
        for _ in range(rng.randint(1, 3)):
            turns += [{"role": "user", "content": " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 30)))},
                      {"role": "assistant",
                       "content": " ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 120)))}]
        files[i % shards].write(json.dumps({"messages": turns}) + "\n")
    for f in files:
        f.close()


def stream(rows: int, rounds: int) -> None:
    import dataclasses

    from scaletrain.config import validate
    from scaletrain.data import stream as st
    from scaletrain.model.tokenizer import load_tokenizer

    root = Path(__file__).resolve().parents[1]
    work = Path(tempfile.mkdtemp(prefix="scaletrain-stream-"))
    shards = work / "shards"
    shards.mkdir()
    conversations(shards, rows, shards=8)
    tok = load_tokenizer("builtin:tiny-llama")
    tok.chat_template = (root / "tests" / "fixtures" / "chat_templates" / "qwen2_5_instruct.jinja").read_text()
    cfg = validate({"model": {"name_or_path": "builtin:tiny-llama", "task": "causal-lm"},
                    "data": {"train_file": str(shards), "formatting": "messages", "max_length": 512,
                             "streaming": True}, "train": {"max_steps": 10}})
    src = st.list_shards(str(shards), "auto", "data.train_file", None, "messages",
                         dataclasses.asdict(st.streamed_source(cfg).columns))
    sample = [json.loads(line) for line in (shards / "part-000.jsonl").read_text().splitlines()[:64]]
    encode = st.StreamEncoder(src, cfg, tok, sample)
    n = min(rows, 20_000)
    rates: dict[int, list[float]] = {1: [], 2: []}
    for r in range(rounds):
        for world in ((1, 2) if r % 2 == 0 else (2, 1)):
            s = st.ShardStream(src, 0, cfg.data.buffer_size)
            t0, kept = time.perf_counter(), 0
            for _ in range(n // (world * 8)):  # micro-batches of 8 records per rank
                mine = [next(s) for _ in range(world * 8)][::world]
                encode([st.parse(src, rid, raw) for rid, raw in mine])
                kept += len(mine)
            rates[world].append(kept / (time.perf_counter() - t0))
    print(f"{rows} conversations in 8 shards, Qwen2.5's template, buffer {cfg.data.buffer_size}, medians of {rounds}")
    for world, rs in rates.items():
        print(f"  one rank of {world}: {statistics.median(rs):,.0f} records/s read, parsed and tokenized")
    s = st.ShardStream(src, 0, cfg.data.buffer_size)
    for _ in range(rows // 2):
        next(s)
    state = json.loads(json.dumps(s.state()))
    t0 = time.perf_counter()
    again = st.ShardStream(src, 0, cfg.data.buffer_size, state)
    took = time.perf_counter() - t0
    assert [next(again)[0] for _ in range(1000)] == [next(s)[0] for _ in range(1000)]
    print(f"  restore at record {rows // 2}: {took:.2f} s, {len({i >> st.ROW_BITS for i in state['buffer']})} of 8 "
          f"shards read again for the buffer's records, position {len(json.dumps(state)) / 1024:.0f} KiB")


def chat(rows: int, rounds: int) -> None:
    import os

    root = Path(__file__).resolve().parents[1]
    template = root / "tests" / "fixtures" / "chat_templates" / "qwen2_5_instruct.jinja"
    work = Path(tempfile.mkdtemp(prefix="scaletrain-chatprep-"))
    data = work / "chat.jsonl"
    conversations(data, rows)
    cores = len(os.sched_getaffinity(0))
    results: dict[int, list[dict]] = {1: [], 0: []}
    for r in range(rounds):
        for workers in ((1, 0) if r % 2 == 0 else (0, 1)):  # 0: the default (every core for a large source)
            out = subprocess.run([sys.executable, "-c", CHAT_PROBE, str(data), str(template), str(workers),
                                  str(work / f"cache-{workers}")], capture_output=True, text=True, check=True)
            results[workers].append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"{rows} conversations (1-3 turns), Qwen2.5's chat template, {cores} cores, medians of {rounds} rounds")
    for workers, runs in results.items():
        s = statistics.median(x["s"] for x in runs)
        mb = statistics.median(x["rss_growth_mb"] for x in runs)
        procs = 1 if workers == 1 else cores
        print(f"{'one process' if workers == 1 else 'every core':>12}: {s:6.1f} s prepare, {rows / s:7.0f} records/s, "
              f"{rows / s / procs:5.0f} per core; driver RSS +{mb:.0f} MB; note: {runs[-1]['note'].split('(')[1]}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--max-length", type=int, default=512)
    ap.add_argument("--chat", action="store_true", help="records/s per core through a real chat template")
    ap.add_argument("--stream", action="store_true", help="data.streaming: a rank's records/s and a resume's restore")
    args = ap.parse_args()
    if args.chat:
        return chat(args.rows, args.rounds)
    if args.stream:
        return stream(args.rows, args.rounds)
    from scaletrain.model.tokenizer import load_tokenizer

    tok = load_tokenizer("builtin:tiny-bert")  # MiniLM's tokenizer (the fast one)
    work = Path(tempfile.mkdtemp(prefix="scaletrain-dataprep-"))
    data = work / "alpaca.jsonl"
    generate(data, args.rows)
    print(f"{args.rows} rows, {data.stat().st_size / 2**20:.1f} MiB in {data}")
    times: dict[str, list[float]] = {"before": [], "cold": [], "cached": []}
    for r in range(args.rounds):
        for variant in (("before", "cold", "cached") if r % 2 == 0 else ("cached", "cold", "before")):
            out = work / f"{variant}-{r}"
            out.mkdir()
            t0 = time.perf_counter()
            if variant == "before":
                before(data, tok, args.max_length, out)
            else:
                cache = work / "cache"  # the same cache for both: cached reads what a cold run wrote
                if variant == "cached" and not (cache.exists() and any(cache.iterdir())):
                    after(data, tok, args.max_length, cache, cold=True)  # a cached run needs a cold one first
                    t0 = time.perf_counter()
                prepared = after(data, tok, args.max_length, cache, cold=variant == "cold")
                assert prepared.cached == (variant == "cached")
            times[variant].append(time.perf_counter() - t0)
            print(f"round {r} {variant:>6}: {times[variant][-1]:.2f} s", flush=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"\nmedian s: before {med['before']:.2f}, datasets cold {med['cold']:.2f}, cached {med['cached']:.3f}")
    print(f"cold speed-up {med['before'] / med['cold']:.1f}x (target >= 5), "
          f"cached speed-up {med['before'] / med['cached']:.0f}x (target >= 50)")
    split_big = prepared.train_path
    small = work / "small.jsonl"
    generate(small, args.rows // 10, seed=1)
    split_small = after(small, tok, args.max_length, work / "cache-small", cold=True).train_path
    (n1, b1, r1), (n2, b2, r2) = worker_rss(split_small), worker_rss(split_big)
    print(f"worker RSS after loading its split: {n1} rows {r1:.0f} MiB (imports {b1:.0f}), {n2} rows {r2:.0f} MiB "
          f"(imports {b2:.0f}): ratio {r2 / r1:.3f} (target <= 1.10)")


if __name__ == "__main__":
    main()
