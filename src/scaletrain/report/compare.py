"""`scaletrain report A B [...]`: runs side by side, one column each.

What a reader compares first: the settings that differ between the runs (the resolved configs, flattened; output
paths left out), then how each run went (steps, world size, global batch, time, throughput, goodput, MFU, the last
train loss and the final evaluation), then every lm-evaluation-harness metric any of them has (``scaletrain eval``;
the newest value of each). A run still going shows what it has so far; a value a run lacks is "-".
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from scaletrain.metrics.records import read_jsonl
from scaletrain.report.evals import latest_metrics
from scaletrain.rundir import RunDir

# Settings that name where a run lives, not how it trained.
_NOT_A_SETTING = ("output.", "storage.", "data.cache_dir")


def _flat(tree, prefix: str = "") -> dict[str, object]:
    if not isinstance(tree, dict):
        return {prefix.rstrip("."): tree}
    out: dict[str, object] = {}
    for key, value in tree.items():
        out.update(_flat(value, f"{prefix}{key}."))
    return out


def _fmt(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value).replace("|", "\\|")


def _run_rows(rd: RunDir) -> dict[str, object]:
    summary = json.loads(rd.summary.read_text()) if rd.finished() else {}
    records = read_jsonl(rd.metrics)
    train = [r for r in records if r.get("kind") == "train"]
    evals = [r for r in records if r.get("kind") == "eval"]
    final = summary.get("final") or (evals[-1] if evals else {})
    mfu = [r["perf/mfu"] for r in train if "perf/mfu" in r]
    return {
        "status": "finished" if summary else "running or stopped",
        "steps": summary.get("steps", train[-1]["step"] if train else None),
        "world size": summary.get("world_size"),
        "global batch": summary.get("global_batch_size"),
        "train time (s)": summary.get("train_time_s"),
        "samples/s": summary.get("throughput/samples_per_s"),
        "tokens/s": summary.get("throughput/tokens_per_s"),
        "goodput": summary.get("goodput/ratio"),
        "MFU (median)": sorted(mfu)[len(mfu) // 2] if mfu else None,
        "train/loss (last)": train[-1].get("train/loss") if train else None,
        **{k: v for k, v in final.items() if k.startswith("eval/") and isinstance(v, (int, float))},
    }


def compare(run_dirs: list[str | Path]) -> str:
    """The markdown table of ``run_dirs`` side by side (see the module docstring)."""
    runs = [RunDir(d).require_run() for d in run_dirs]
    names = [rd.root.name for rd in runs]
    if len(set(names)) < len(names):  # same names from different places: the paths tell them apart
        names = [str(rd.root) for rd in runs]
    configs = [_flat(yaml.safe_load(rd.resolved_config.read_text())) for rd in runs]
    keys = sorted({k for c in configs for k in c})
    differ = [k for k in keys if not k.startswith(_NOT_A_SETTING) and len({repr(c.get(k)) for c in configs}) > 1]
    outcome = [_run_rows(rd) for rd in runs]
    measures = list(dict.fromkeys(k for o in outcome for k in o))
    evals = [latest_metrics(rd.root) for rd in runs]
    metrics = sorted({m for e in evals for m in e})
    lines = ["| | " + " | ".join(names) + " |", "|---|" + "---|" * len(runs)]
    lines += [f"| {k} | " + " | ".join(_fmt(c.get(k)) for c in configs) + " |" for k in differ]
    lines += [f"| {k} | " + " | ".join(_fmt(o.get(k)) for o in outcome) + " |" for k in measures]
    lines += [f"| {task} {metric} | " + " | ".join(_fmt(e[(task, metric)][0]) if (task, metric) in e else "-"
                                                   for e in evals) + " |" for task, metric in metrics]
    head = (f"# scaletrain comparison: {', '.join(names)}\n\n"
            f"{len(differ)} setting(s) differ" + (f" ({', '.join(differ[:6])}{', ...' if len(differ) > 6 else ''})"
                                                   if differ else "") + ".\n\n")
    return head + "\n".join(lines) + "\n"
