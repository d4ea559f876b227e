"""`scaletrain prune RUNS_DIR [--older-than DAYS] [--keep-final] [--yes]`: what old runs hold, and freeing it
(after/prune.py): a dry run unless --yes, never a run that is still going."""

from __future__ import annotations

import argparse
from pathlib import Path

from scaletrain.commands.args import NONNEGATIVE_REAL


def register(sub: argparse._SubParsersAction, parents) -> None:
    p = sub.add_parser("prune", parents=parents, help="list what old runs hold (checkpoints, data, final/, caches) "
                                                      "and free it; a dry run unless --yes")
    p.add_argument("runs_dir", help="the output.output_dir that holds the runs (or one run directory)")
    p.add_argument("--older-than", type=NONNEGATIVE_REAL, default=7.0,
                   help="only runs and cache entries whose newest file is at least this many days old")
    p.add_argument("--keep-final", action="store_true",
                   help="keep final/ and the records (config, metrics, report, logs); free checkpoints and data")
    p.add_argument("--yes", action="store_true", help="delete (without it: only say what would be freed)")
    p.set_defaults(func=run)


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f}"


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from scaletrain.after.prune import apply, choose, survey
    from scaletrain.rundir import RunDir

    console = Console(stderr=True, width=max(150, Console(stderr=True).width))

    items = choose(survey(Path(args.runs_dir)), args.older_than, args.keep_final)
    table = Table(title=f"scaletrain prune {args.runs_dir}" + ("" if args.yes else " (dry run)"))
    for col in ("run or cache entry", "status", "age days", "checkpoints MiB", "data MiB", "final MiB",
                "logs+other MiB", "frees MiB", "kept because"):
        table.add_column(col)
    for i in items:
        p = i.parts
        table.add_row(i.path.name, i.status, f"{i.age_days:.1f}", _mib(p.get(RunDir.CHECKPOINTS, 0)),
                      _mib(p.get(RunDir.DATA, 0) + p.get("cache", 0)), _mib(p.get(RunDir.FINAL, 0)),
                      _mib(p.get("logs", 0) + p.get("other", 0)), _mib(i.freed), i.why_kept)
    console.print(table)
    total = sum(i.freed for i in items)
    if not args.yes:
        console.print(f"dry run: nothing deleted; --yes frees {total / 2**30:.2f} GiB "
                      f"({sum(1 for i in items if i.freed)} of {len(items)} items)", soft_wrap=True)
        return 0
    console.print(f"freed {apply(items, args.keep_final) / 2**30:.2f} GiB", soft_wrap=True)
    return 0
