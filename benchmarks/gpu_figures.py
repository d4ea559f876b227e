"""For benchmarks/gpu_check.sh: the figures of one training run, printed and appended to the check's table.

    python benchmarks/gpu_figures.py RUN_DIR PART FIGURES_TSV

Throughput and step time are medians over the logged intervals after the first (warm-up); MFU only where the
device's peak is known (never guessed); the peak memory against the plan's prediction; the precision policy's
dtypes and final/'s dtype.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path


def figures(run: Path) -> dict[str, str]:
    recs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in recs if r["kind"] == "train"][1:]
    out: dict[str, str] = {}
    if train:
        out["tokens/s"] = str(round(statistics.median(r["throughput/tokens_per_s"] for r in train)))
        out["step_s"] = str(round(statistics.median(r["time/step_s"] for r in train), 4))
        mfus = [r["perf/mfu"] for r in train if "perf/mfu" in r]
        out["mfu"] = f"{statistics.median(mfus):.1%}" if mfus else "n/a (unknown device)"
    rl = [r for r in train if "time/rollout_s" in r]
    if rl:  # GRPO: each step's split and the engine's throughput
        for key in ("time/rollout_s", "time/reference_s", "time/sync_s", "throughput/rollout_tokens_per_s",
                    "completions/mean_length", "reward"):
            out[key.split("/")[-1]] = str(round(statistics.median(r[key] for r in rl), 4))
    compiling = [r["time/compile_s"] for r in recs if "time/compile_s" in r]
    if compiling:  # train.compile: the time compiling, kept out of the step time
        out["compile_s"] = str(round(sum(compiling), 1))
    peaks = [r["memory/peak_gib"] for r in recs if "memory/peak_gib" in r]
    out["peak_gib"] = str(round(max(peaks), 2)) if peaks else "n/a (no GPU memory statistics)"
    summary_path = run / "summary.json"
    if summary_path.is_file():
        s = json.loads(summary_path.read_text())
        ratio = s.get("memory/predicted_over_measured")
        out["plan/measured"] = f"{ratio:.3f}" if ratio else "n/a"
        held = s.get("memory/param_bytes_per_rank")
        out["params_gib"] = f"{held[0] / 2**30:.3f}" if held else "n/a"
        out["measured_as"] = str(s.get("memory/measured_as"))
        out["precision"] = ", ".join(f"{k.removeprefix('precision/')} {v}" for k, v in s.items()
                                     if k.startswith("precision/"))
    config = run / "final" / "config.json"
    if config.is_file():
        c = json.loads(config.read_text())
        out["final_dtype"] = str(c.get("dtype") or c.get("torch_dtype"))
    return out


def main(run: Path, part: str, table: Path) -> None:
    found = figures(run)
    for key, value in found.items():
        print(f"{part} {key}: {value}")
    with open(table, "a") as f:
        f.write(f"{part}\tok\t" + "; ".join(f"{k} {v}" for k, v in found.items() if k != "measured_as") + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3]))
