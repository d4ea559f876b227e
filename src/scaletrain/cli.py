"""`scaletrain` entry point: registers sub-commands; each lives in its own module under commands/."""

from __future__ import annotations

import argparse
import sys
import traceback

from scaletrain.errors import ScaletrainError

DESCRIPTION = ("Take a Transformer fine-tuning job from one device to many GPUs and nodes with Ray Train "
               "(ROCm/RCCL and CUDA/NCCL): check the machine before (doctor, env, topo, commbench, predict), "
               "train the same YAML on 1 to N workers, and measure after (scale, parity, report).")


class OneLineParser(argparse.ArgumentParser):
    """argparse with its errors in one line, worded as every other error of scaletrain's (``error: scaletrain plan:
    argument --gpus-per-node: 0: must be >= 1; see scaletrain plan --help``) instead of the usage block above them:
    every command's bad input is one line."""

    def error(self, message: str):
        self.exit(2, f"error: {self.prog}: {message}; see {self.prog} --help\n")


def build_parser() -> argparse.ArgumentParser:
    from scaletrain.commands import (
        chat,
        cluster,
        commbench,
        doctor,
        env,
        evaluate,
        export,
        imports,
        plan,
        predict,
        preview,
        prune,
        report,
        scale,
        serve,
        submit,
        topo,
        train,
    )

    parser = OneLineParser(prog="scaletrain", description=DESCRIPTION)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show full tracebacks")
    parser.add_argument("--debug", action="store_true", help="show full tracebacks")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in (train, doctor, plan, preview, submit, cluster, env, topo, commbench, report, scale, predict,
                    export, evaluate, serve, chat, imports, prune):
        command.register(sub, [common])
    return parser


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse like argparse, but let key=value overrides follow options too (`train c.yaml --no-progress a=1`)."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    stray = [a for a in extra if a.startswith("-") or "=" not in a or not hasattr(args, "overrides")]
    if stray:
        parser.error(f"unrecognized arguments: {' '.join(stray)}")
    if extra:
        args.overrides = [*args.overrides, *extra]
    return args


# Commands whose driver the warm cluster's fork server starts pre-imported when `scaletrain up` runs (doctor joins
# that cluster too, but reports this process's own environment, so it runs here).
WARM_COMMANDS = ("train", "scale", "commbench")


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    from scaletrain.console import quiet_library_warnings

    quiet_library_warnings()
    if argv is None and args.command in WARM_COMMANDS:  # a command line, not a call from Python
        from scaletrain.launch.warm.cluster import run_forked_driver

        if (code := run_forked_driver(sys.argv)) is not None:
            return code
    try:
        return int(args.func(args) or 0)
    except ScaletrainError as e:
        from scaletrain.redact import Redactor

        redact = Redactor.from_environment()
        if args.debug:  # the traceback too, redacted, and still the error's own exit code
            print(redact("".join(traceback.format_exception(e))), file=sys.stderr, end="")
        for line in str(e).splitlines() or [""]:  # a config with several problems: one line each
            print(f"{e.label}: {redact(line)}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("stopped: interrupted (a second Ctrl-C, or one before training started: no checkpoint saved)",
              file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
