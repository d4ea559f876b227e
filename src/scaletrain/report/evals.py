"""Evaluation results kept in a run directory: lm-evaluation-harness's (``RUN_DIR/eval/lm_eval-*.json``, written by
harness.py) and the generation eval's (``generate-*.json``, gen_eval.py, in lm-eval's results shape), read back for
the run's report and the side-by-side comparison of runs."""

from __future__ import annotations

import json
import time
from pathlib import Path

from scaletrain.errors import ConfigError

EVAL_DIR = "eval"


def write_new(results: dict, directory: Path, prefix: str) -> Path:
    """``directory/PREFIX-TIME.json``, a new file each time (exclusive create): an earlier evaluation is never
    overwritten."""
    directory.mkdir(exist_ok=True)
    stem = f"{prefix}-{time.strftime('%Y%m%d-%H%M%S')}"
    for n in range(1000):
        path = directory / (f"{stem}.json" if n == 0 else f"{stem}-{n}.json")
        try:
            with open(path, "x") as f:
                json.dump(results, f, indent=1, default=str, ensure_ascii=False)
            return path
        except FileExistsError:
            continue
    raise ConfigError(f"{directory}: no free name for {stem}.json")


def metric_rows(results: dict) -> list[tuple[str, str, float, float | None]]:
    """(task, metric, value, stderr) for each task's metrics, as lm-eval reports them ("acc,none" ...)."""
    rows = []
    for task, metrics in sorted(results.get("results", {}).items()):
        for key, value in metrics.items():
            name, _, filt = key.partition(",")
            if not filt or name.endswith("_stderr") or not isinstance(value, (int, float)):  # "sample_len", ...
                continue
            stderr = metrics.get(f"{name}_stderr,{filt}")
            rows.append((task, name, float(value), float(stderr) if isinstance(stderr, (int, float)) else None))
    return rows


def latest_metrics(run_root: Path) -> dict[tuple[str, str], tuple[float, float | None, str]]:
    """(task, metric) -> (value, stderr, file) of the run's evaluations, the newest file's value where a task was
    evaluated more than once (files in the order written: their names carry the time)."""
    out: dict[tuple[str, str], tuple[float, float | None, str]] = {}
    files = [*(Path(run_root) / EVAL_DIR).glob("lm_eval-*.json"), *(Path(run_root) / EVAL_DIR).glob("generate-*.json")]
    for path in sorted(files, key=lambda p: p.stat().st_mtime_ns):
        try:
            results = json.loads(path.read_text())
        except (OSError, ValueError):  # a file being written, or not lm-eval's: the report says what it has
            continue
        for task, metric, value, stderr in metric_rows(results):
            out[(task, metric)] = (value, stderr, path.name)
    return out


def eval_section(run_root: Path) -> list[str]:
    """The report's lm-eval section (none when the run was not evaluated)."""
    metrics = latest_metrics(run_root)
    if not metrics:
        return []
    lines = ["", "## lm-evaluation-harness (scaletrain eval)", "", "| task | metric | value | stderr | file |",
             "|---|---|---|---|---|"]
    return lines + [f"| {task} | {metric} | {value:.4f} | {'-' if err is None else f'{err:.4f}'} | {file} |"
                    for (task, metric), (value, err, file) in sorted(metrics.items())]
