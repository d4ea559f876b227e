"""`scaletrain train CONFIG [section.key=value ...]` and `scaletrain train --resume RUN_DIR`."""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path

from scaletrain.config import load_config
from scaletrain.errors import ConfigError
from scaletrain.launch.resume import resized, resume_conflicts
from scaletrain.rundir import RunDir


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
    resume = Path(args.resume).expanduser().resolve() if args.resume else None
    if resume is not None:
        saved = RunDir(resume).resolved_config
        if not saved.is_file():
            raise ConfigError(f"--resume {resume}: no {RunDir.RESOLVED_CONFIG} there; pass the directory of an earlier run")
        if RunDir(resume).finished():
            raise ConfigError(f"--resume {resume}: this run finished ({RunDir.SUMMARY} exists); start a new run instead")
        if args.config and "=" in args.config:  # `train --resume DIR key=value`
            args.overrides.insert(0, args.config)
            args.config = None
        cfg = load_config(args.config or saved, args.overrides)
        cfg, resize_note = resized(load_config(saved), cfg)
        if resize_note:
            from scaletrain.console import console

            console.print(f"[yellow]note:[/] {resize_note}", soft_wrap=True)
        conflicts = resume_conflicts(load_config(saved), cfg)
        if conflicts and not args.force_resume:
            raise ConfigError(f"--resume {resume}: the config changes {'; '.join(conflicts)}, which breaks an exact "
                              f"resume; undo the change or pass --force-resume")
        config_path = saved
    else:
        if not args.config:
            raise ConfigError("scaletrain train needs a config file: scaletrain train CONFIG.yaml [section.key=value ...]")
        cfg = load_config(args.config, args.overrides)
        config_path = Path(args.config)
    from scaletrain.launch.launcher import joins_torchrun, launcher_for

    # A torchrun agent starts now: its start-up overlaps the driver's imports below and its data preparation.
    with contextlib.nullcontext() if joins_torchrun(cfg) else launcher_for(cfg) as launcher:
        from scaletrain.console import console, summary_table
        from scaletrain.launch.job import run_job

        result = run_job(cfg, config_path, resume_dir=resume, show_progress=not args.no_progress, launcher=launcher)
    console.print(summary_table(result.summary, result.run_dir))
    return 0
