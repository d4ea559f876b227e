"""A cold `scaletrain train` (no warm cluster) against the floor: a plain torchrun script of the same loop.

Each variant is a fresh process tree (a user's command): the MiniLM demo job, 20 optimizer steps, 1 and 2 workers;
scaletrain as a user runs it (the default, scaling.launcher auto: the launcher it chose is printed) and with its
Ray launcher forced; `bare_first_step.py` under torchrun (the floor:
no config checks, no data cache, no checkpoints, no metrics). Measured: the first console line, the first
optimizer step and the whole wall time from the moment the command starts, and the process tree's peak resident
memory (the command and every descendant, sampled every 0.2 s). Variants alternate; medians of --rounds.

LLaMA-Factory beside scaletrain, on a job both run: benchmarks/vs_llamafactory.py (its own venv:
benchmarks/llamafactory_env.sh).

    python benchmarks/cold_start.py --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

from scaletrain.data.demo import sentiment_rows

HERE = Path(__file__).resolve().parent
STEPS = 20


def run_tree(cmd: list[str], env: dict | None = None, cwd: Path | None = None) -> dict:
    """Run ``cmd``; the time of its first stderr/stdout line, its wall time and its tree's peak RSS."""
    t0 = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=cwd)
    peak, first, lines = [0], [None], []

    def sample():
        root = psutil.Process(proc.pid)
        while proc.poll() is None:
            total = 0
            try:
                for p in (root, *root.children(recursive=True)):
                    try:
                        total += p.memory_info().rss
                    except psutil.Error:
                        pass
            except psutil.Error:
                break
            peak[0] = max(peak[0], total)
            time.sleep(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    for line in proc.stdout:
        if first[0] is None and line.strip():
            first[0] = time.time() - t0
        lines.append(line)
    proc.wait()
    sampler.join()
    assert proc.returncode == 0, "".join(lines)[-3000:]
    return {"t0": t0, "first_line_s": first[0], "wall_s": time.time() - t0, "tree_peak_gib": peak[0] / 2**30}


def scaletrain(cfg: Path, out: Path, launcher: str | None, workers: int) -> dict:
    """``launcher`` None: the default (scaling.launcher auto); the one it chose is recorded."""
    r = run_tree([sys.executable, "-m", "scaletrain", "train", str(cfg),
                  *([f"scaling.launcher={launcher}"] if launcher else []),
                  f"scaling.num_workers={workers}", f"output.output_dir={out}", "--no-progress"])
    run = next(p for p in out.iterdir() if (p / "metrics.jsonl").is_file())
    chosen = re.search(r"launcher: (\w+)", (run / "config.resolved.yaml").read_text()).group(1)
    first = min(json.loads(line)["time"] for line in (run / "metrics.jsonl").read_text().splitlines()
                if '"kind": "train"' in line)
    summary = json.loads((run / "summary.json").read_text())
    return {**r, "first_step_s": first - r["t0"], "tree_in_summary_gib": summary["memory/tree_peak_bytes"] / 2**30,
            "launcher": chosen}


def bare(data: Path, out: Path, workers: int) -> dict:
    out.mkdir(parents=True)
    r = run_tree([sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={workers}",
                  str(HERE / "bare_first_step.py"), "torchrun", str(data), str(out)],
                 env={**os.environ, "BARE_STEPS": str(STEPS)})
    return {**r, "first_step_s": float((out / "first_step").read_text()) - r["t0"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="scaletrain-cold-"))
    data = work / "s.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in sentiment_rows(400)))
    cfg = work / "c.yaml"
    cfg.write_text(f"""model: {{name_or_path: "builtin:minilm"}}
data: {{train_file: {data}, eval_ratio: 0.1, max_length: 32}}
train: {{per_device_train_batch_size: 16, max_steps: {STEPS}, logging_steps: 1}}
monitor: {{report: false}}
""")
    results: dict[str, list[dict]] = {}
    for i in range(args.rounds):
        for workers in (1, 2):
            for name, fn, fn_args in ((f"bare torchrun x{workers}", bare, (data, work / f"b{workers}-{i}", workers)),
                                      (f"scaletrain ray x{workers}", scaletrain,
                                       (cfg, work / f"r{workers}-{i}", "ray", workers)),
                                      (f"scaletrain default x{workers}", scaletrain,
                                       (cfg, work / f"t{workers}-{i}", None, workers))):
                results.setdefault(name, []).append(fn(*fn_args))
                r = results[name][-1]
                print(f"round {i} {name}: first line {r['first_line_s']}, first step {r['first_step_s']:.1f} s, "
                      f"wall {r['wall_s']:.1f} s, tree {r['tree_peak_gib']:.2f} GiB"
                      f"{', launcher ' + r['launcher'] if 'launcher' in r else ''}", flush=True)
    print("| variant | first console line | first step | 20-step wall | tree peak RSS | vs the floor (step, wall, "
          "RSS) |")
    print("|---|---|---|---|---|---|")
    med = {name: {k: statistics.median(r[k] for r in rs) for k in ("first_step_s", "wall_s", "tree_peak_gib")}
           | {"first_line_s": statistics.median(r["first_line_s"] or 0 for r in rs)} for name, rs in results.items()}
    for name, m in med.items():
        floor = med[f"bare torchrun x{name[-1]}"]
        print(f"| {name} | {m['first_line_s']:.1f} s | {m['first_step_s']:.1f} s | {m['wall_s']:.1f} s | "
              f"{m['tree_peak_gib']:.2f} GiB | {m['first_step_s'] / floor['first_step_s']:.2f}x, "
              f"{m['wall_s'] / floor['wall_s']:.2f}x, {m['tree_peak_gib'] / floor['tree_peak_gib']:.2f}x |")


if __name__ == "__main__":
    main()
