"""Vision-language fine-tuning (#62, #73): the data step's images per second per core, the cache's bytes an image,
the loaders' images per second per core, and training tokens/s padded vs packed, 1 and 2 processes, with
LLaMA-Factory 0.9.5 side by side where its environment can run the job.

Data step (``--part data``): LLaMA-Factory's ``mllm_demo`` shape with --rows records of photos-sized JPEGs
(640x480 .. 1024x768, one or two a record, a quarter text only), prepared for a tiny Qwen2-VL whose image processor
has Qwen2-VL's own settings (patch 14, merge 2, up to 12,845,056 pixels) and LLaMA-Factory's default bound
(image_max_pixels 589,824): each image's size read from its header, bounded, its tokens counted, rendered,
tokenized and cached (no pixels since #73), with ``data.preprocessing_num_workers`` 1 and 2; then the images of
--sample records decoded, bounded and processed as the data-loading workers do while training.

Training (``--part train``): LoRA SFT (rank 8, the language model; tower and projector frozen), one LLaMA-Factory
YAML for both sides (scaletrain runs what ``scaletrain import llamafactory`` makes of it): tiny Gemma 3 (the family
LLaMA-Factory's benchmark venv can run: its Qwen-VL processors need torchvision, which no release pairs with torch
2.13.0+cpu) padded, 1 and 2 processes, alternating, medians of --rounds; and tiny Qwen2-VL padded vs packed (each
packed example's own M-RoPE), scaletrain only (LLaMA-Factory cannot load Qwen-VL there, and scaletrain does not
pack Gemma 3 yet). Target tokens/s: the trained (label) tokens of an epoch x epochs over the trainer's training time.

    bash benchmarks/llamafactory_env.sh /tmp/lf-venv
    python benchmarks/vision.py --part data --rows 10000 --rounds 2
    python benchmarks/vision.py --part train --llamafactory /tmp/lf-venv --rounds 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/vlm.py: the tiny models and data shapes

from vs_llamafactory import llamafactory, scaletrain

from tests.vlm import ANSWERS, MLLM_INFO, QUESTIONS, image, save_tiny

REAL_QWEN2_VL = {"patch_size": 14, "merge_size": 2, "temporal_patch_size": 2,
                 "size": {"shortest_edge": 56 * 56, "longest_edge": 28 * 28 * 1280}}


def photos(out: Path, n: int, sizes=((640, 480), (800, 600), (1024, 768))) -> int:
    """mllm_demo-shaped records with photo-sized JPEGs; returns the images written."""
    (out / "mllm_demo_data").mkdir(parents=True, exist_ok=True)
    rows, written = [], 0
    for k in range(n):
        count = 0 if k % 4 == 3 else (2 if k % 3 == 2 else 1)
        names = []
        for j in range(count):
            w, h = sizes[(k + j) % len(sizes)]
            name = f"mllm_demo_data/{k}_{j}.jpg"
            image(w // 8, h // 8, seed=k * 10 + j).resize((w, h)).save(out / name, quality=90)
            names.append(name)
        written += count
        answer = " ".join([ANSWERS[k % 4]] * (1 + k % 5))
        rows.append({"messages": [{"role": "user", "content": "<image>" * count + QUESTIONS[k % 4]},
                                  {"role": "assistant", "content": answer}], "images": names})
    (out / "mllm_demo.json").write_text(json.dumps(rows))
    (out / "dataset_info.json").write_text(json.dumps(MLLM_INFO))
    return written


def data_part(args) -> None:
    """The data step (sizes from the headers, tokens; no pixels since #73) 1 and 2 processes alternating, the
    cache's bytes an image, the loaders' images/s per core (decode, bound, process: one process, in order), peak
    RSS, and the projection to 100k and 1M images."""
    import psutil
    from transformers import AutoConfig, Qwen2VLImageProcessorPil

    from scaletrain.config import validate
    from scaletrain.data import prepare_data
    from scaletrain.model.processor import image_text_factory, loader_pixels
    from scaletrain.model.tokenizer import load_tokenizer

    work = Path(tempfile.mkdtemp(prefix="scaletrain-vision-data-"))
    model = save_tiny("qwen2_vl", work / "qwen2-vl")
    Qwen2VLImageProcessorPil(**REAL_QWEN2_VL).save_pretrained(model)
    t0 = time.perf_counter()
    images = photos(work / "data", args.rows)
    print(f"{images} photo-sized JPEGs written in {time.perf_counter() - t0:.0f} s", flush=True)
    tok = load_tokenizer(str(model))
    rates: dict[int, list[float]] = {1: [], 2: []}
    seconds_of: dict[int, list[float]] = {1: [], 2: []}
    data = None
    for r in range(args.rounds):
        for procs in ((1, 2) if r % 2 == 0 else (2, 1)):
            cfg = validate({"model": {"name_or_path": str(model), "task": "causal-lm"},
                            "data": {"dataset_dir": str(work / "data"), "dataset": ["mllm_demo"], "eval_ratio": 0,
                                     "max_length": 4096, "preprocessing_num_workers": procs,
                                     "overwrite_cache": True},
                            "output": {"output_dir": str(work / f"runs-{r}-{procs}")}})
            t0 = time.perf_counter()
            data = prepare_data(cfg, tok, image_text_factory(str(model), tok))
            seconds = time.perf_counter() - t0
            rates[procs].append(images / seconds / procs)
            seconds_of[procs].append(seconds)
            print(f"round {r} x{procs}: data step {seconds:.1f} s for {images} images: "
                  f"{images / seconds:.0f} images/s, {images / seconds / procs:.0f} per core", flush=True)
    table = data.train.with_format("arrow")[:]
    image_bytes = sum(table.column(c).nbytes for c in ("image_refs", "image_tokens", "image_grid_thw"))
    token_bytes = sum(table.column(c).nbytes for c in ("input_ids", "labels"))
    tokens = sum(sum(t) for t in data.train["image_tokens"])
    pixels = loader_pixels(str(model), AutoConfig.from_pretrained(str(model)), 589824, 1024)
    refs = [(w, t) for ex in data.train.select(range(min(len(data.train), args.sample)))
            for w, t in zip(ex["image_refs"], ex["image_tokens"])]
    t0, cpu0 = time.perf_counter(), time.process_time()
    for where, n in refs:
        pixels.image(where, n)
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    per_core = len(refs) / cpu
    rss = psutil.Process().memory_info().rss / 2 ** 30
    step1 = statistics.median(seconds_of[1])
    print(f"\ncache: {image_bytes / images:.0f} bytes an image beyond its tokens (references, counts, grids); the "
          f"tokens {token_bytes / images:.0f} bytes an image (input_ids, labels; {tokens / images:.0f} image tokens "
          f"an image); before #73: ~11 MB an image (float32 patches)")
    for procs, values in rates.items():
        print(f"data step, {procs} process(es): median {statistics.median(seconds_of[procs]):.1f} s, "
              f"{statistics.median(values):.0f} images/s per core ({', '.join(f'{v:.0f}' for v in values)})")
    print(f"loaders: {len(refs)} images decoded, bounded and processed in {wall:.1f} s ({cpu:.1f} CPU-s): "
          f"{per_core:.1f} images/s per core; peak RSS of this process {rss:.2f} GiB")
    for n in (100_000, 1_000_000):
        print(f"projection, {n:,} images: cache {image_bytes / images * n / 2 ** 20:.0f} MiB of references "
              f"+ {token_bytes / images * n / 2 ** 30:.1f} GiB of tokens (~{11 * n / 1e6:.0f} TB of pixels before "
              f"#73); data step ~{step1 / images * n / 60:.0f} min on one core; the loaders need "
              f"{n / per_core / 3600:.1f} core-hours an epoch")


def lf_yaml(path: Path, model: Path, data: Path, template: str, epochs: int, packed: bool) -> Path:
    path.write_text("\n".join([
        f"model_name_or_path: {model}", "image_max_pixels: 262144", "stage: sft", "do_train: true",
        "finetuning_type: lora", "lora_rank: 8", "lora_alpha: 16", "lora_target: all", "dataset: mllm_demo",
        f"dataset_dir: {data}", f"template: {template}", "cutoff_len: 1024", "overwrite_cache: true",
        "per_device_train_batch_size: 4", "gradient_accumulation_steps: 1", "learning_rate: 1.0e-4",
        f"num_train_epochs: {epochs}.0", "lr_scheduler_type: cosine", "logging_steps: 10", "save_strategy: 'no'",
        "report_to: none", "overwrite_output_dir: true", "dataloader_num_workers: 0",
        *(["packing: true", "neat_packing: true"] if packed else []), ""]))
    return path


def target_tokens(model: Path, data: Path) -> int:
    """The trained (label) tokens of one epoch of the data, as scaletrain's data step counts them."""
    from scaletrain.config import validate
    from scaletrain.data import prepare_data
    from scaletrain.model.processor import image_text_factory
    from scaletrain.model.tokenizer import load_tokenizer

    tok = load_tokenizer(str(model))
    with tempfile.TemporaryDirectory() as tmp:
        cfg = validate({"model": {"name_or_path": str(model), "task": "causal-lm"},
                        "data": {"dataset_dir": str(data), "dataset": ["mllm_demo"], "eval_ratio": 0,
                                 "max_length": 1024}, "output": {"output_dir": tmp}})
        labels = prepare_data(cfg, tok, image_text_factory(str(model), tok)).train["labels"]
    return sum(sum(1 for t in row[1:] if t != -100) for row in labels)


def train_part(args) -> None:
    import subprocess

    work = Path(tempfile.mkdtemp(prefix="scaletrain-vision-train-"))
    photos(work / "data", args.rows, sizes=((320, 240), (400, 300), (480, 360)))
    jobs = {}
    for kind, template in (("gemma3", "gemma3"), ("qwen2_vl", "qwen2_vl")):
        model = save_tiny(kind, work / kind)
        per_epoch = target_tokens(model, work / "data")
        for packed in ((False,) if kind == "gemma3" else (False, True)):
            name = f"{kind}-{'packed' if packed else 'padded'}"
            lf = lf_yaml(work / f"lf-{name}.yaml", model, work / "data", template, args.epochs, packed)
            st = work / f"st-{name}.yaml"
            subprocess.run([sys.executable, "-m", "scaletrain", "import", "llamafactory", str(lf), "-o", str(st)],
                           check=True, capture_output=True)
            jobs[name] = (lf, st, per_epoch * args.epochs, kind == "gemma3")
    results: dict[tuple, list[dict]] = {}
    examples = args.rows * args.epochs
    for i in range(args.rounds):
        for name, (lf, st, tokens, with_lf) in jobs.items():
            for workers in (1, 2):
                runs = [("scaletrain", scaletrain, (st, workers))]
                if with_lf and args.llamafactory:
                    runs.append(("LLaMA-Factory", llamafactory, (args.llamafactory, lf, workers)))
                for side, fn, fn_args in (runs if i % 2 == 0 else runs[::-1]):
                    r = fn(*fn_args, work / f"{side[:2]}-{name}-{workers}-{i}", work, examples)
                    r["tokens_per_s"] = tokens / r["train_s"]
                    results.setdefault((name, workers, side), []).append(r)
                    print(f"round {i} {name} x{workers} {side}: {r['tokens_per_s']:.0f} target tokens/s "
                          f"({r['train_s']:.1f} s training, wall {r['wall_s']:.1f} s)", flush=True)
    print("| job | processes | scaletrain target tokens/s | LLaMA-Factory | ratio | per round |")
    print("|---|---|---|---|---|---|")
    for name in jobs:
        for workers in (1, 2):
            st = [r["tokens_per_s"] for r in results[(name, workers, "scaletrain")]]
            lf = [r["tokens_per_s"] for r in results.get((name, workers, "LLaMA-Factory"), [])]
            ratio = f"{statistics.median(st) / statistics.median(lf):.2f}x" if lf else "-"
            rounds = ", ".join(f"{a / b:.2f}" for a, b in zip(st, lf)) if lf else "-"
            print(f"| {name} | {workers} | {statistics.median(st):.0f} | "
                  f"{statistics.median(lf):.0f} | {ratio} | {rounds} |" if lf else
                  f"| {name} | {workers} | {statistics.median(st):.0f} | - | - | - |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--part", choices=("data", "train"), default="data")
    ap.add_argument("--llamafactory", type=Path, help="the venv benchmarks/llamafactory_env.sh made")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--rows", type=int, default=200)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--sample", type=int, default=200, help="records whose images the loaders' rate is timed on")
    args = ap.parse_args()
    data_part(args) if args.part == "data" else train_part(args)


if __name__ == "__main__":
    main()
