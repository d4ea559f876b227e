"""`report.md`: header table, final metrics, plots, events, alerts and grouped log findings.

Works on finished, failed and running runs: every section uses what is there.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import yaml

from scaletrain.errors import ConfigError
from scaletrain.metrics.records import read_jsonl
from scaletrain.report import plots
from scaletrain.report.evals import eval_section
from scaletrain.report.logscan import scan_logs
from scaletrain.rundir import RunDir

REPORT, TITLE = RunDir.REPORT, "# scaletrain report: "


def write_report(run_dir: str | Path, out_dir: str | Path | None = None, price: float | None = None) -> Path:
    rd = RunDir(run_dir).require_run()
    run = rd.root
    out = Path(out_dir) if out_dir else run
    _refuse_foreign(out, run)
    try:
        out.mkdir(parents=True, exist_ok=True)
        if not os.access(out, os.W_OK):
            raise PermissionError
    except (PermissionError, OSError):
        raise ConfigError(f"report directory {out} is not writable; pass --out DIR") from None
    records = read_jsonl(rd.metrics)
    train = [r for r in records if r.get("kind") == "train"]
    evals = [r for r in records if r.get("kind") == "eval"]
    system = [r for r in records if r.get("kind") == "system"]
    cfg = yaml.safe_load(rd.resolved_config.read_text())
    summary = json.loads(rd.summary.read_text()) if rd.finished() else None
    checkpoints = [r for r in records if r.get("kind") == "checkpoint"]
    images = [p for p in (plots.loss(train, evals, out, checkpoints), plots.throughput(train, out, evals, checkpoints),
                          plots.rewards(train, evals, out), plots.goodput(summary or {}, out), plots.ranks(train, out),
                          plots.utilization(system, out), plots.experts(train, out), plots.rl(train, out)) if p]
    status = "finished" if summary else ("failed" if "failure:" in _read(rd.events) else "running or stopped")
    lines = [f"{TITLE}{run.name}", "", f"Status: **{status}**", "", "| | |", "|---|---|"]
    s = summary or {}
    world = s.get("world_size", cfg["scaling"]["num_workers"])
    gb = s.get("global_batch_size", cfg["train"]["per_device_train_batch_size"]
               * cfg["train"]["gradient_accumulation_steps"] * world)
    rows = [("model", f"{cfg['model']['name_or_path']} ({cfg['model']['finetuning_type']})"),
            ("task", cfg["model"]["task"]), *_classes(cfg), ("world size", world),
            ("strategy", cfg["train"]["strategy"]),
            ("global batch", gb), ("steps", s.get("steps", train[-1]["step"] if train else 0)),
            ("train time", f"{s['train_time_s']:.1f} s" if summary else "-"),
            ("eval time", f"{s['eval_time_s']:.1f} s" if summary else "-"),
            ("throughput", f"{s['throughput/samples_per_s']:.1f} samples/s" if summary else "-"),
            # what the run cost in devices: its wall time (goodput's, else the train time) x its devices
            ("device-hours", f"{world * s.get('goodput/wall_s', s['train_time_s']) / 3600:.3f}" if summary else "-"),
            *([("cost", f"{price * world * s.get('goodput/wall_s', s['train_time_s']) / 3600:.2f} (at {price:g} "
                        f"per device-hour)")] if summary and price else [])]
    padding = [r["data/padding_pct"] for r in train if "data/padding_pct" in r]
    spread = [r["data/tokens_per_rank_spread"] for r in train if "data/tokens_per_rank_spread" in r]
    if padding:  # the median over the run's records: how much compute went to padding, how even the ranks were
        rows += [("padding", f"{sorted(padding)[len(padding) // 2]:.1f}% of positions"),
                 ("tokens per rank spread", f"{sorted(spread)[len(spread) // 2]:.3f} ((max - min) / mean)")]
    rows += _precision(s) + _goodput(s)
    final = s.get("final") or (evals[-1] if evals else {})
    rows += [(k, f"{v:.4f}" if isinstance(v, float) else v) for k, v in final.items() if k.startswith("eval/")]
    lines += [f"| {k} | {v} |" for k, v in rows]
    lines += eval_section(run)
    lines += ["", "## Plots", ""] + [f"![{p.stem}]({os.path.relpath(p, out)})" for p in images]
    lines += _samples(rd)
    alerts = read_jsonl(rd.alerts)
    lines += ["", f"## Alerts ({len(alerts)})", ""]
    lines += [f"- step {a.get('step', '-')}: **{a['rule']}** {a['message']}" for a in alerts] or ["none"]
    lines += ["", "## Events (logs/main.log)", "", "```", _read(rd.events).rstrip(), "```"]
    findings = scan_logs(run)
    lines += ["", f"## Errors and warnings in worker logs ({len(findings)} distinct)", ""]
    lines += [f"- {f.line()}" for f in findings] or ["none"]
    path = out / REPORT
    path.write_text("\n".join(lines) + "\n")
    return path


def _goodput(s: dict) -> list[tuple[str, str]]:
    """Where the wall time went, by category (seconds and share), over every session of the run."""
    wall = s.get("goodput/wall_s")
    if not wall:
        return []
    from scaletrain.metrics.goodput import CATEGORIES

    rows = [("goodput", f"{s['goodput/ratio']:.1%} of {wall:.1f} s wall ({s['goodput/interruptions']} "
                        f"interruption(s), {s['goodput/sessions']} session(s))")]
    return rows + [(f"time: {c.replace('_', ' ')}", f"{s[f'goodput/{c}_s']:.1f} s "
                    f"({s[f'goodput/{c}_s'] / wall:.1%})") for c in CATEGORIES if f"goodput/{c}_s" in s]


def _precision(s: dict) -> list[tuple[str, str]]:
    """What was stored and computed in which dtype, and the bytes of parameters and optimizer state each rank
    held beside the plan's (precision.py; the plan and the run should agree on any device)."""
    if "precision/compute" not in s:
        return []
    rows = [("precision", f"compute {s['precision/compute']}, trainable {s['precision/trainable_params']}, frozen "
                          f"{s['precision/frozen_params']}, optimizer {s['precision/optimizer_states']}, final/ "
                          f"{s.get('precision/final', '-')}")]
    plan = s.get("memory/predicted") or {}
    for what, key, planned in (("parameters held", "memory/param_bytes_per_rank", "parameters"),
                               ("optimizer state held", "memory/optimizer_bytes_per_rank", "optimizer")):
        if s.get(key):
            rows.append((what, f"{max(s[key]) / 2**20:.1f} MiB per rank (plan {plan.get(planned, 0) / 2**20:.1f} MiB)"))
    return rows


def _samples(rd: RunDir) -> list[str]:
    """GRPO: a few prompts with their completions and rewards at the start and at the end of the run."""
    rows = read_jsonl(rd.samples) if rd.samples.exists() else []
    if not rows:
        return []
    cell = lambda s: str(s).replace("|", "\\|").replace("\n", " ")[:160]
    out = ["", "## Completions at the start and the end", "", "| step | prompt | completion | rewards |",
           "|---|---|---|---|"]
    out += [f"| {r['step']} | {cell(r['prompt'])} | {cell(r['completion'])} | "
            f"{', '.join(f'{k} {v:.3g}' if v is not None else f'{k} -' for k, v in r['rewards'].items())} |"
            for r in rows]
    return out


def _classes(cfg: dict) -> list[tuple[str, str]]:
    """Classification: the classes by id (names when the data had them)."""
    if cfg["model"]["task"] != "sequence-classification":
        return []
    names = cfg["data"].get("label_names")
    n = cfg["model"].get("num_labels")
    if names:
        return [("classes", ", ".join(f"{i} = {name}" for i, name in enumerate(names)))]
    return [("classes", "regression (1 output)" if n == 1 else f"{n} (numbered 0..{n - 1})")] if n else []


def _refuse_foreign(out: Path, run: Path) -> None:
    """``--out`` may refresh this run's own report there, never replace another run's files or a user's."""
    if out.resolve() == run.resolve() or not out.is_dir():
        return
    if RunDir(out).is_run():
        raise ConfigError(f"--out {out} is another run's directory and its report would be replaced; "
                          f"pass a new or empty directory")
    report = out / REPORT
    ours = report.is_file() and report.read_text(errors="replace").startswith(f"{TITLE}{run.name}\n")
    clash = [name for name in (REPORT, *plots.FILES) if (out / name).exists()]
    if clash and not ours:
        raise ConfigError(f"--out {out} already holds {', '.join(clash)} not written for {run.name}; "
                          f"pass a new or empty directory")


def _read(p: Path) -> str:
    return p.read_text() if p.is_file() else ""
