"""`scaletrain report RUN_DIR` and `scaletrain watch RUN_DIR`."""

from __future__ import annotations

import argparse
import time

from scaletrain.commands.args import POSITIVE
from scaletrain.rundir import RunDir


def register(sub: argparse._SubParsersAction, parents) -> None:
    p = sub.add_parser("report", parents=parents, help="write report.md and plots for a run (finished or not); "
                                                        "several runs: compared side by side")
    p.add_argument("run_dir", nargs="+", help="a run directory; two or more: a comparison table")
    p.add_argument("--out", help="directory for report.md and the PNGs (default: the run directory); with several "
                                 "runs, where comparison.md goes (default: printed only)")
    p.add_argument("--price", type=POSITIVE, metavar="PER_DEVICE_HOUR",
                   help="what a device-hour cost: the report states the run's cost beside its device-hours")
    p.set_defaults(func=run_report)
    w = sub.add_parser("watch", parents=parents, help="follow a running job from another terminal")
    w.add_argument("run_dir", help="the run directory to follow")
    w.add_argument("--interval", type=POSITIVE, default=2.0, help="seconds between refreshes")
    w.add_argument("--once", action="store_true", help="print the current state once and exit")
    w.set_defaults(func=run_watch)


def run_report(args: argparse.Namespace) -> int:
    from scaletrain.commands.runref import local_run
    from scaletrain.console import console
    from scaletrain.report.markdown import write_report
    from scaletrain.storage.mirror import Mirror, home_of

    if len(args.run_dir) > 1:
        return _compare(args)
    run_dir = local_run(args.run_dir[0], [], "report")
    store = home_of(run_dir)
    mirror = Mirror(run_dir, store, 0).assume_synced() if store and not args.out else None
    path = write_report(run_dir, args.out, price=args.price)
    if mirror is not None:  # the report and its plots beside the run on the store
        mirror.sync()
        path = f"{store.uri}/{RunDir.REPORT} (and here: {path})"
    console.print(f"report written to {path}", soft_wrap=True)
    return 0


def _compare(args: argparse.Namespace) -> int:
    from pathlib import Path

    from scaletrain.commands.runref import local_run
    from scaletrain.console import console
    from scaletrain.errors import ConfigError
    from scaletrain.report.compare import compare

    table = compare([local_run(d, [], "report") for d in args.run_dir])
    print(table, end="")
    if args.out:
        path = Path(args.out) / "comparison.md"
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            with open(path, "x") as f:  # never over an earlier comparison
                f.write(table)
        except FileExistsError:
            raise ConfigError(f"--out {args.out}: comparison.md exists there and is never replaced; pass a new "
                              f"directory") from None
        console.print(f"comparison written to {path}", soft_wrap=True)
    return 0


def run_watch(args: argparse.Namespace) -> int:
    from scaletrain.commands.runref import local_run
    from scaletrain.metrics.goodput import account, one_line
    from scaletrain.metrics.monitor import JsonlFollower
    from scaletrain.storage.uri import is_uri

    # A URI: a snapshot of the run fetched now (--once); following one on a store fetches it again each round.
    run = RunDir(local_run(args.run_dir, [], "watch")).require_run()
    follower, latest, shown = JsonlFollower(run.metrics), {}, 0
    while True:
        if is_uri(args.run_dir) and shown:  # the store has moved on: fetch the run's files again
            local_run(args.run_dir, [], "watch")
        for r in follower.poll():
            latest[(r.get("kind"), r.get("rank", 0))] = r
        events = run.events.read_text().splitlines() if run.events.exists() else []
        for line in events[shown:]:
            print(line)
        shown = len(events)
        for (kind, rank), r in sorted(latest.items(), key=lambda kv: (str(kv[0][0]), kv[0][1])):
            fields = ", ".join(f"{k}={v:.4g}" for k, v in r.items() if isinstance(v, float) and k != "time")
            print(f"  latest {kind} rank {rank}: step {r.get('step', '-')}: {fields}")
        print(f"  {one_line(account(run.root, None if run.finished() else time.time()))}")
        if args.once or run.finished():
            return 0
        time.sleep(args.interval)
