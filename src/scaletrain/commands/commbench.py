"""`scaletrain commbench`: collective bandwidth across N Ray workers, nccl-tests columns; `--sweep` to tune env."""

from __future__ import annotations

import argparse
import itertools
import json
import tempfile
from pathlib import Path

from scaletrain.commands.args import COUNT, NONNEGATIVE, POSITIVE, number
from scaletrain.config.schema import MIN_COMM_TIMEOUT_S
from scaletrain.errors import ConfigError

RESULTS, BEST_PROFILE = "commbench.json", "best-profile.yaml"  # written under --out
DEFAULT_BUCKET_MB = 25.0  # torch DDP's default bucket_cap_mb: the all-reduce size that matters for training


def register(sub: argparse._SubParsersAction, parents) -> None:
    p = sub.add_parser("commbench", parents=parents, help="measure collectives (nccl-tests columns) on N workers")
    p.add_argument("-n", "--workers", type=COUNT, default=2, help="number of workers (ranks)")
    p.add_argument("-c", "--collective", default="all_reduce",
                   help="comma list of all_reduce, all_gather, reduce_scatter, broadcast, all_to_all, or 'all'")
    p.add_argument("-b", "--minbytes", default="8", help="smallest size (8, 64K, 128M, 1G)")
    p.add_argument("-e", "--maxbytes", default="64M", help="largest size")
    p.add_argument("-f", "--stepfactor", type=number(int, 2), default=2, help="size multiplier between rows")
    p.add_argument("-w", "--warmup_iters", type=NONNEGATIVE, default=5, help="untimed iterations per size")
    p.add_argument("--iters", type=COUNT, default=20, help="timed iterations per size")
    p.add_argument("-d", "--datatype", default="float", help="float, half, bfloat16, double, int32")
    p.add_argument("--check", type=number(int, 0, 1), default=1, help="1: verify results (#wrong column), 0: skip")
    p.add_argument("--backend", default="auto", help="auto, nccl, rccl or gloo")
    p.add_argument("--profile", help="comm profile applied to every worker (see comm.profile)")
    p.add_argument("--env", action="append", default=[], metavar="NAME=VALUE", help="extra worker variable")
    p.add_argument("--address", help="Ray cluster to join (default: RAY_ADDRESS or a local Ray)")
    p.add_argument("--timeout", type=number(int, MIN_COMM_TIMEOUT_S), default=300,
                   help="collective timeout in seconds (what comm.timeout_s allows: at least 10)")
    p.add_argument("--json", action="store_true", help="print JSON instead of the table")
    p.add_argument("--out", help="directory for results (JSON, and the winning profile of a sweep)")
    p.add_argument("--sweep", nargs="+", metavar="NAME=V1,V2", help="run once per combination, fresh workers each")
    p.add_argument("--bucket-mb", type=POSITIVE, default=DEFAULT_BUCKET_MB,
                   help="gradient bucket size that ranks a sweep (sizes from half to twice this count)")
    p.set_defaults(func=run)


def parse_sweep(items: list[str]) -> list[dict[str, str]]:
    """``["A=1,2", "B=x"]`` -> ``[{"A": "1", "B": "x"}, {"A": "2", "B": "x"}]``."""
    axes = []
    for item in items:
        name, sep, values = item.partition("=")
        vals = [v for v in values.split(",") if v.strip()]
        if not sep or not name:
            raise ConfigError(f"--sweep {item}: write NAME=V1,V2,...")
        if not vals:
            raise ConfigError(f"--sweep {item}: the value list is empty; give at least one value")
        axes.append([(name, v.strip()) for v in vals])
    return [dict(combo) for combo in itertools.product(*axes)]


def rank_sweep(results: list[tuple[dict, list[dict]]], bucket_bytes: float) -> list[tuple[dict, float]]:
    """(settings, score) best first; score = mean busbw of the sizes within [bucket/2, 2 x bucket]
    (or of the largest size measured when none falls in that window)."""
    ranked = []
    for settings, rows in results:
        rows = [r for r in rows if r.get("scope", "all") == "all"]
        window = [r for r in rows if bucket_bytes / 2 <= r["size"] <= bucket_bytes * 2]
        if not window:
            top = max(r["size"] for r in rows)
            window = [r for r in rows if r["size"] == top]
        score = sum((r["oop_busbw"] + r["ip_busbw"]) / 2 for r in window) / len(window)
        ranked.append((settings, score))
    return sorted(ranked, key=lambda x: -x[1])


def _params(args):
    from scaletrain.comm.bench import COLLECTIVES, DTYPES, BenchParams, size_range

    colls = COLLECTIVES if args.collective == "all" else tuple(c.strip() for c in args.collective.split(","))
    for c in colls:
        if c not in COLLECTIVES:
            raise ConfigError(f"-c {c}: unknown collective; choose from {', '.join(COLLECTIVES)} or all")
    if args.datatype not in DTYPES:
        raise ConfigError(f"-d {args.datatype}: choose one of {', '.join(DTYPES)}")
    if args.iters < 1 or args.warmup_iters < 0:
        raise ConfigError("--iters must be >= 1 and -w >= 0")
    return BenchParams(colls, tuple(size_range(args.minbytes, args.maxbytes, args.stepfactor)),
                       DTYPES[args.datatype], args.warmup_iters, args.iters, bool(args.check))


def run(args: argparse.Namespace) -> int:
    from scaletrain.launch.launcher import require_ray

    require_ray("scaletrain commbench")
    from scaletrain.comm.bench import format_table, validate_params
    from scaletrain.console import console
    from scaletrain.launch.commbench import run_commbench

    params = _params(args)
    validate_params(params, args.workers)
    if args.timeout < MIN_COMM_TIMEOUT_S:  # what comm.timeout_s allows (raised to it without a word before)
        raise ConfigError(f"--timeout {args.timeout}: give at least {MIN_COMM_TIMEOUT_S} seconds for a collective")
    extra = dict(_pair(e) for e in args.env)
    combos = parse_sweep(args.sweep) if args.sweep else [{}]
    out_dir = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="scaletrain-commbench-"))
    earlier = [name for name in (RESULTS, BEST_PROFILE) if (out_dir / name).exists()]
    if earlier:
        raise ConfigError(f"--out {out_dir} already holds {', '.join(earlier)} of an earlier commbench; "
                          f"pass a new directory (results are never overwritten)")
    results = []
    for settings in combos:
        env = {**extra, **settings}
        if settings:
            console.print(f"sweep: {' '.join(f'{k}={v}' for k, v in settings.items())}", soft_wrap=True)
        rows = run_commbench(params, args.workers, args.backend, args.profile, env, args.address, args.timeout, out_dir)
        results.append((settings, [r.to_dict() for r in rows]))
        if args.json:
            print(json.dumps({"settings": settings, "workers": args.workers, "rows": [r.to_dict() for r in rows]}))
        else:
            print(format_table(rows, f"scaletrain commbench: {args.workers} ranks, {params.dtype}, "
                                     f"warmup {params.warmup_iters}, iters {params.iters}"))
    (out_dir / RESULTS).write_text(json.dumps([{"settings": s, "rows": r} for s, r in results], indent=1))
    if args.sweep:
        ranked = rank_sweep(results, args.bucket_mb * 1024**2)
        console.print(f"\nsweep ranked by busbw near the {args.bucket_mb:g} MB gradient bucket (GB/s):")
        for settings, score in ranked:
            console.print(f"  {score:8.3f}  {' '.join(f'{k}={v}' for k, v in settings.items())}", soft_wrap=True)
        best = out_dir / BEST_PROFILE
        best.write_text("# winning settings of `scaletrain commbench --sweep`; paste under comm: in a config\n"
                        "env:\n" + "".join(f"  {k}: \"{v}\"\n" for k, v in ranked[0][0].items()))
        console.print(f"winning profile written to {best} (use it as comm.profile={best})", soft_wrap=True)
    return 0


def _pair(item: str) -> tuple[str, str]:
    name, sep, value = item.partition("=")
    if not sep or not name:
        raise ConfigError(f"--env {item}: write NAME=VALUE")
    return name, value
