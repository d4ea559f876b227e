"""`scaletrain train CONFIG [section.key=value ...]` and `scaletrain train --resume RUN_DIR`."""

from __future__ import annotations

import argparse
from pathlib import Path

from scaletrain.commands.runref import local_run
from scaletrain.config import load_config
from scaletrain.errors import ConfigError
from scaletrain.launch.resume import resume_config
from scaletrain.storage.mirror import home_of


def register(sub: argparse._SubParsersAction, parents: list[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("train", parents=parents, help="fine-tune on 1..N workers from a YAML config")
    p.add_argument("config", nargs="?", help="YAML config (optional with --resume)")
    p.add_argument("overrides", nargs="*", help="section.key=value overrides, e.g. scaling.num_workers=2")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue a stopped run from its latest checkpoint")
    p.add_argument("--force-resume", action="store_true",
                   help="resume even if the config changes the model, task or data order")
    p.add_argument("--no-progress", action="store_true", help="no live progress bar")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.resume:
        if args.config and "=" in args.config:  # `train --resume DIR key=value`
            args.overrides.insert(0, args.config)
            args.config = None
        resume = local_run(args.resume, args.overrides, "--resume")
        cfg, config_path, notes = resume_config(resume, args.config, args.overrides, args.force_resume)
    elif not args.config:
        raise ConfigError("scaletrain train needs a config file: scaletrain train CONFIG.yaml [section.key=value ...]")
    else:
        resume, cfg, config_path, notes = None, load_config(args.config, args.overrides), Path(args.config), []
    from scaletrain.console import console, summary_table
    from scaletrain.launch.job import run_job
    from scaletrain.launch.orphans import describe, leftovers

    for note in notes:
        console.print(f"[yellow]note:[/] {note}", soft_wrap=True)
    if left := leftovers():  # an earlier driver's processes, killed with it gone (launch/orphans.py)
        console.print(f"[yellow]warning:[/] {describe(left)}", soft_wrap=True)
    result = run_job(cfg, config_path, resume_dir=resume, show_progress=not args.no_progress)
    console.print(summary_table(result.summary, str(home_of(result.run_dir) or result.run_dir)))
    return 0
