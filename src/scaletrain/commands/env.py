"""`scaletrain env`: versions, devices and communication variables, ready for a bug report."""

from __future__ import annotations

import argparse
import json


def register(sub: argparse._SubParsersAction, parents) -> None:
    p = sub.add_parser("env", parents=parents, help="print versions, devices and comm variables for a bug report")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from scaletrain.commands.envinfo import collect, render
    from scaletrain.redact import Redactor

    info = collect()
    print(Redactor.from_environment()(json.dumps(info, indent=1)) if args.json else render(info))
    return 0
