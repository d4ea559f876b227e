"""`scaletrain serve RUN_DIR --print vllm|sglang`: the command that serves a run's model with the prompt format it
trained with (scaletrain/after/serving.py); scaletrain starts no server itself."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction, parents) -> None:
    p = sub.add_parser("serve", parents=parents, help="print the vLLM or SGLang command that serves a run's model")
    p.add_argument("run_dir", help="a finished run directory")
    p.add_argument("--print", dest="server", required=True, choices=["vllm", "sglang"],
                   help="the server whose command to print")
    p.add_argument("--name", help="the model name requests use (default: the run's name)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from scaletrain.after.serving import serve_plan

    plan = serve_plan(args.run_dir, args.server, args.name)
    for cmd in plan.commands:
        print(cmd)
    for note in plan.notes:
        print(f"# {note}")
    return 0
