"""`scaletrain scale`: the same config at several world sizes, measured after a warm-up, as a table.

Each world size is a normal run (its own run directory under the sweep's directory) with
``max_steps = warmup + measured`` and ``logging_steps = warmup``, so the first metric window is the
warm-up and is left out. The per-device batch stays fixed (weak scaling) unless ``fixed_global_batch``.
"""

from __future__ import annotations

import csv
import json
import statistics
from pathlib import Path

from scaletrain.config.schema import Config
from scaletrain.errors import ConfigError
from scaletrain.metrics.records import read_jsonl
from scaletrain.rundir import RunDir

COLUMNS = ["workers", "samples_per_s", "tokens_per_s", "speedup", "efficiency", "step_time_s", "train_time_s",
           "eval_time_s", "peak_memory_gib", "memory_pct", "exposed_comm_share", "wait_share", "comm_wait_share",
           "data_wait_share", "padding_pct", "tokens_per_rank_spread", "mfu", "note"]


def check_sweep(cfg: Config, sizes: list[int], warmup: int, measured: int, fixed_global_batch: bool,
                breakdown_every: int) -> None:
    """Every bad flag fails here, before Ray starts, a run directory exists or a world size has run."""
    if warmup < 1 or measured < 1:
        raise ConfigError("--warmup and --steps must be >= 1")
    if breakdown_every < 0:
        raise ConfigError(f"--breakdown-every {breakdown_every}: give a step interval >= 1, or 0 to time no phases")
    for n in sizes:
        per_device_batch(cfg, n, fixed_global_batch)


def per_device_batch(cfg: Config, workers: int, fixed_global_batch: bool) -> int:
    b = cfg.train.per_device_train_batch_size
    if not fixed_global_batch:
        return b
    base = b * cfg.scaling.num_workers
    if base % workers:
        raise ConfigError(f"--fixed-global-batch: the global batch {base} does not divide by {workers} workers; "
                          f"choose world sizes that divide it")
    return base // workers


def plan_config(cfg: Config, workers: int, warmup: int, measured: int, fixed_global_batch: bool,
                out_dir: Path, breakdown_every: int) -> Config:
    train = cfg.train.model_copy()
    train.per_device_train_batch_size = per_device_batch(cfg, workers, fixed_global_batch)
    measured = -(-measured // warmup) * warmup  # a whole number of metric windows
    train.max_steps, train.logging_steps, train.eval_steps = warmup + measured, warmup, 0
    return cfg.model_copy(update={
        "train": train,
        "scaling": cfg.scaling.model_copy(update={"num_workers": workers}),
        "checkpoint": cfg.checkpoint.model_copy(update={"save_steps": 0}),
        "monitor": cfg.monitor.model_copy(update={"report": False, "breakdown_every": breakdown_every}),
        "output": cfg.output.model_copy(update={"output_dir": str(out_dir), "run_name": f"workers-{workers}"}),
    })


def measure(run_dir: Path, warmup: int, world: int) -> dict:
    """One row of the table from a finished run's records (warm-up window excluded)."""
    records = read_jsonl(RunDir(run_dir).metrics)
    train = [r for r in records if r["kind"] == "train" and r["step"] > warmup]
    if not train:
        raise ConfigError(f"{run_dir}: no measured steps after the warm-up; raise --steps")
    system = [r for r in records if r["kind"] == "system"]
    breakdown = [r for r in records if r["kind"] == "breakdown" and r["step"] > warmup]
    summary = json.loads(RunDir(run_dir).summary.read_text())
    steps = train[-1]["step"] - warmup
    step_time = statistics.median(r["time/step_s"] for r in train)
    gpu = [r for r in system if "memory/peak_gib" in r]
    peak = max((r["memory/peak_gib"] for r in gpu), default=None)
    total = max((r.get("gpu/memory_total_gib", 0) for r in gpu), default=0)
    if peak is None:  # CPU workers: the largest resident set of any rank
        peak = max((r["memory/rss_gib"] for r in system), default=max(max(r["ranks/rss_gib"]) for r in train))
    mfus = [r["perf/mfu"] for r in train if "perf/mfu" in r]
    exposed = statistics.mean(r["share/exposed_comm"] for r in breakdown) if breakdown else None
    # waiting for the slowest rank: its lead over the mean rank at the gradient sync, over the step (ranks/ready_s)
    waits = [(max(r["ranks/ready_s"]) - statistics.fmean(r["ranks/ready_s"])) / r["time/step_s"] for r in train
             if len(r.get("ranks/ready_s") or []) > 1 and r["time/step_s"] > 0]
    wait = statistics.median(waits) if waits else (0.0 if world == 1 else None)
    return {
        "workers": world,
        "samples_per_s": statistics.median(r["throughput/samples_per_s"] for r in train),
        "tokens_per_s": statistics.median(r["throughput/tokens_per_s"] for r in train),
        "step_time_s": step_time,
        "train_time_s": step_time * steps,
        "eval_time_s": summary["eval_time_s"],
        "peak_memory_gib": peak,
        "memory_pct": peak / total * 100 if total else None,
        "exposed_comm_share": exposed,
        "wait_share": wait,
        # the other reading of a "communication share" (the bus bandwidth over the links' peak is commbench's)
        "comm_wait_share": exposed + wait if exposed is not None and wait is not None else None,
        "data_wait_share": (statistics.mean(r["share/data_wait"] for r in breakdown) if breakdown
                            else statistics.median(r["time/data_wait_s"] / r["time/step_s"] for r in train)),
        "padding_pct": _median(train, "data/padding_pct"),
        "tokens_per_rank_spread": _median(train, "data/tokens_per_rank_spread"),
        "mfu": statistics.median(mfus) if mfus else None,
        "note": "",
    }


def _median(records: list[dict], key: str) -> float | None:
    values = [r[key] for r in records if key in r]
    return statistics.median(values) if values else None


def add_speedup(rows: list[dict]) -> list[dict]:
    """speedup = samples/s over the smallest measured world size's, scaled to per-worker ideal."""
    measured = [r for r in rows if r.get("samples_per_s")]
    if not measured:
        return rows
    base = min(measured, key=lambda r: r["workers"])
    for r in measured:
        r["speedup"] = r["samples_per_s"] / base["samples_per_s"] * base["workers"]
        r["efficiency"] = r["speedup"] / r["workers"]
    return rows


def _fmt(v) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"
    return str(v)


def write_outputs(rows: list[dict], out_dir: Path, title: str) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "scaling.json").write_text(json.dumps(rows, indent=1))
    with open(out_dir / "scaling.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    head = "| " + " | ".join(COLUMNS) + " |"
    lines = [f"# {title}", "", head, "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(_fmt(r.get(c)) for c in COLUMNS) + " |" for r in rows]
    lines += ["", "speedup: samples/s relative to the smallest world size measured (x its workers); efficiency = "
              "speedup / workers. Shares come from sampled breakdown steps (exposed_comm = forward+backward with "
              "gradient sync minus the same without it); wait: the slowest rank's lead over the mean rank at the "
              "gradient sync (ranks/ready_s); comm_wait = exposed_comm + wait, the step's share in communication "
              "and waiting (the bus bandwidth reached over the links' peak is commbench's). n/a: not measured or "
              "unknown (MFU needs a known GPU).",
              "", "![speedup](scaling.png)"]
    (out_dir / "scaling.md").write_text("\n".join(lines) + "\n")
    return [out_dir / "scaling.md", out_dir / "scaling.csv", out_dir / "scaling.json", plot_speedup(rows, out_dir)]


def plot_speedup(rows: list[dict], out_dir: Path) -> Path:
    from scaletrain.report.plots import FIGSIZE, plt, save_figure

    measured = [r for r in rows if r.get("speedup")]
    fig, ax = plt.subplots(figsize=FIGSIZE)
    xs = [r["workers"] for r in measured]
    ax.plot(xs, xs, "--", label="ideal")
    ax.plot(xs, [r["speedup"] for r in measured], "o-", label="measured")
    ax.set(xlabel="workers", ylabel="speedup (samples/s)", title="Scaling: measured vs ideal")
    ax.set_xticks(xs)  # the world sizes measured, not 1.5, 2.5, ...
    ax.legend()
    return save_figure(fig, out_dir / "scaling.png")
