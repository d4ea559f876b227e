"""`scaletrain up [--num-cpus N] [--num-gpus N]` and `scaletrain down`: a warm local Ray cluster
(launch/warm/cluster.py)."""

from __future__ import annotations

import argparse

from scaletrain.commands.args import NONNEGATIVE


def register(sub: argparse._SubParsersAction, parents) -> None:
    p = sub.add_parser("up", parents=parents, help="start a persistent local Ray cluster that train, scale, "
                                                   "commbench and doctor then use")
    p.add_argument("--num-cpus", type=NONNEGATIVE, help="CPUs it offers (default: all of this machine's)")
    p.add_argument("--num-gpus", type=NONNEGATIVE, help="GPUs it offers (default: Ray detects them)")
    p.set_defaults(func=run_up)
    d = sub.add_parser("down", parents=parents, help="stop the local Ray cluster scaletrain up started")
    d.set_defaults(func=run_down)


def run_up(args: argparse.Namespace) -> int:
    from scaletrain.launch.launcher import require_ray

    require_ray("scaletrain up")
    from scaletrain.console import console
    from scaletrain.errors import ConfigError
    from scaletrain.launch.warm.cluster import up

    for flag, value in (("--num-cpus", args.num_cpus), ("--num-gpus", args.num_gpus)):
        if value is not None and value < (1 if flag == "--num-cpus" else 0):
            raise ConfigError(f"{flag} {value}: must be >= {1 if flag == '--num-cpus' else 0}")
    from scaletrain.launch.warm.cluster import forkserver_log

    cluster, started = up(args.num_cpus, args.num_gpus)
    if started:
        console.print(f"up: a local Ray cluster at {cluster.address} ({cluster.num_cpus} CPUs, dashboard "
                      f"{cluster.dashboard}); train, scale, commbench and doctor use it until scaletrain down",
                      soft_wrap=True)
        if not cluster.forkserver:
            console.print(f"[yellow]note:[/] its fork server did not start (see {forkserver_log()}): drivers and "
                          f"workers start the plain way, importing everything each time", soft_wrap=True)
    else:
        console.print(f"already up: the local Ray cluster at {cluster.address} ({cluster.num_cpus} CPUs, dashboard "
                      f"{cluster.dashboard}), started by scaletrain up; nothing started", soft_wrap=True)
    return 0


def run_down(args: argparse.Namespace) -> int:
    from scaletrain.launch.launcher import require_ray

    require_ray("scaletrain down")
    from scaletrain.console import console
    from scaletrain.launch.warm.cluster import down

    cluster = down()
    if cluster is None:
        console.print("down: no local Ray cluster started by scaletrain up; nothing stopped", soft_wrap=True)
    else:
        console.print(f"down: stopped the local Ray cluster at {cluster.address}", soft_wrap=True)
    return 0
