"""`scaletrain predict`: step time, speedup and efficiency for larger clusters (see scaling/predict.py)."""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from scaletrain.commands.args import COUNT, NONNEGATIVE_REAL, POSITIVE, SHARE
from scaletrain.errors import ConfigError


def register(sub: argparse._SubParsersAction, parents) -> None:
    p = sub.add_parser("predict", parents=parents, help="predict scaling for N devices from measured inputs")
    src = p.add_argument_group("compute (one of)")
    src.add_argument("--from-run", help="a 1-worker run directory: its step time and gradient size")
    src.add_argument("--step-time", type=POSITIVE, help="one device's step time in seconds (no communication)")
    src.add_argument("--run", dest="measured_run", metavar="RUN_DIR",
                     help="a finished DDP run with step breakdowns (monitor.breakdown_every): its measured compute "
                          "is the input, and at its own worker count the prediction is compared term by term with "
                          "what it measured")
    p.add_argument("--grad-bytes", type=POSITIVE, help="gradient bytes per step (default: trainable params x 4)")
    p.add_argument("--param-bytes", type=NONNEGATIVE_REAL, default=0.0, help="FSDP: parameter bytes gathered per pass")
    p.add_argument("--samples-per-step", type=POSITIVE, help="samples per step per device (for samples/s)")
    net = p.add_argument_group("network (one of)")
    net.add_argument("--profile", help="a named hardware profile: mi300x, mi325x, h100-sxm, h200, a100, pcie "
                     "(sources in scaletrain/scaling/profiles.py)")
    net.add_argument("--commbench", help="commbench.json (from commbench --out) for links inside a node")
    p.add_argument("--inter-commbench", help="commbench.json measured across nodes")
    p.add_argument("--gpus", default="1,2,4,8", help="device counts to predict")
    p.add_argument("--gpus-per-node", type=COUNT, default=None, help="devices per node (intra- vs inter-node links)")
    p.add_argument("--overlap", type=SHARE, default=0.8, help="fraction of backward that hides communication")
    p.add_argument("--bucket-mb", type=POSITIVE, default=25.0, help="DDP gradient bucket size in MB")
    p.add_argument("--strategy", default="ddp", choices=["ddp", "fsdp"], help="the parallel strategy predicted")
    p.add_argument("--topology", choices=["switch", "full-mesh"],
                   help="inside a node (default: the profile's; switch for a commbench curve): full-mesh scales "
                        "busbw with the GPUs taking part")
    p.add_argument("--micro-batches", type=COUNT, default=1, help="FSDP/ZeRO-3: micro-batches per step (each "
                                                                "gathers the parameters again)")
    p.add_argument("--layers", type=COUNT, default=32, help="FSDP: transformer blocks (one is gathered at a time)")
    p.add_argument("--no-reshard-after-forward", dest="reshard_after_forward", action="store_false",
                   help="FSDP: forward's gathered parameters are kept for backward (train.fsdp_reshard_after_forward"
                        "=false): one gather per micro-batch")
    p.add_argument("--sync-each-micro-batch", action="store_true",
                   help="FSDP: gradients reduced in every micro-batch (DeepSpeed ZeRO-3) instead of once a step")
    p.add_argument("--contention", type=SHARE, default=None,
                   help="compute slowdown while communication overlaps it (default 0.189: arXiv:2507.03114)")
    p.add_argument("--straggler-cv", type=SHARE, default=0.0,
                   help="per-micro-batch compute spread across ranks, std / mean (default 0: none assumed)")
    p.add_argument("--straggler-from", metavar="RUN_DIR",
                   help="a multi-worker run: the spread of its ranks' own step work (ranks/ready_s) as --straggler-cv")
    p.add_argument("--check-published", action="store_true",
                   help="predicted vs published speedups for every row of scaletrain/scaling/published.py")
    p.add_argument("--json", action="store_true", help="the prediction as JSON")
    p.set_defaults(func=run)


def _curve_from(path: str):
    from scaletrain.scaling.predict import BusCurve

    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{path}: commbench results not found; run scaletrain commbench --out DIR first")
    data = json.loads(p.read_text())
    rows = data[0]["rows"] if isinstance(data, list) and data and "rows" in data[0] else data
    return BusCurve.from_rows(rows)


def _check_numbers(args) -> None:
    """Each numeric flag in its range, named in the error (a zero bucket divided by zero before)."""
    for flag, value, low in (("--step-time", args.step_time, 0), ("--grad-bytes", args.grad_bytes, 0),
                             ("--samples-per-step", args.samples_per_step, 0), ("--bucket-mb", args.bucket_mb, 0),
                             ("--gpus-per-node", args.gpus_per_node, 0)):
        if value is not None and not value > low:
            raise ConfigError(f"{flag} {value:g}: must be greater than {low}")
    if not args.param_bytes >= 0:
        raise ConfigError(f"--param-bytes {args.param_bytes:g}: must be 0 (DDP) or the bytes FSDP gathers per pass")
    for flag, value in (("--micro-batches", args.micro_batches), ("--layers", args.layers)):
        if value < 1:
            raise ConfigError(f"{flag} {value}: must be >= 1")
    if not 0 <= args.overlap <= 1:
        raise ConfigError(f"--overlap {args.overlap}: a fraction between 0 and 1")
    for flag, value in (("--contention", args.contention), ("--straggler-cv", args.straggler_cv)):
        if value is not None and not 0 <= value < 1:
            raise ConfigError(f"{flag} {value:g}: a fraction between 0 and 1")


def inputs_from_args(args, measured: dict | None = None):
    """The predictor's inputs from the flags; ``measured``: a run's breakdown (``--run``, measured_breakdown)."""
    from scaletrain.metrics.records import read_jsonl
    from scaletrain.rundir import RunDir
    from scaletrain.scaling.predict import Inputs
    from scaletrain.scaling.profiles import PROFILES

    _check_numbers(args)
    grad_bytes, samples = args.grad_bytes, args.samples_per_step
    if measured is not None:
        if args.from_run or args.step_time:
            raise ConfigError("--run RUN_DIR is the compute input: give it alone, without --from-run or --step-time")
        compute = measured["compute_s"] + measured["optimizer_s"]
        grad_bytes = grad_bytes or measured["grad_bytes"]
        samples = samples or measured["samples_per_step_per_device"]
        args.strategy = measured["strategy"]
        if measured["workers"] > 1 and not args.straggler_from:
            args.straggler_from = args.measured_run
    elif args.from_run:
        run = RunDir(args.from_run)
        if not run.finished():
            raise ConfigError(f"--from-run {run}: no {RunDir.SUMMARY}; point it at a finished 1-worker run")
        summary = json.loads(run.summary.read_text())
        if summary["world_size"] != 1:
            raise ConfigError(f"--from-run {run}: a {summary['world_size']}-worker run; the compute time must come "
                              f"from 1 worker (scaletrain scale --workers 1,... writes one)")
        times = [r["time/step_s"] for r in read_jsonl(run.metrics) if r["kind"] == "train"][1:]
        compute = statistics.median(times) if times else None
        grad_bytes = grad_bytes or summary.get("parameters/trainable", 0) * 4
        samples = samples or summary.get("samples_per_step_per_device")
    else:
        compute = args.step_time
    if not compute:
        raise ConfigError("give --from-run RUN_DIR or --step-time SECONDS for the compute time of one device")
    if not grad_bytes:
        raise ConfigError("give --grad-bytes (or --from-run of a finished run)")
    if args.profile:
        if args.profile not in PROFILES:
            raise ConfigError(f"--profile {args.profile}: known profiles are {', '.join(PROFILES)}")
        prof = PROFILES[args.profile]
        intra, inter, per_node = prof["intra"], prof["inter"], prof["gpus_per_node"]
        extra_peak = {"link_peak_gbs": prof.get("link_peak_gbs", 0.0)}
        topology = args.topology or prof.get("topology", "switch")
    elif args.commbench:
        intra = _curve_from(args.commbench)
        inter = _curve_from(args.inter_commbench) if args.inter_commbench else None
        per_node = 8
        topology = args.topology or "switch"
        extra_peak = {}
    else:
        raise ConfigError("give --profile NAME or --commbench commbench.json for the network")
    extra = {} if args.contention is None else {"contention": args.contention}
    if args.straggler_from:
        args.straggler_cv = measured_spread(args.straggler_from)
    elif args.from_run and args.profile and not args.straggler_cv:  # the wait sized from the run's own data
        extra["straggler_waits"] = run_waits(args, args.from_run, args.profile)
    return Inputs(compute_s=compute, grad_bytes=grad_bytes, intra=intra, inter=inter,
                  gpus_per_node=args.gpus_per_node or per_node, bucket_bytes=args.bucket_mb * 1024**2,
                  overlap=args.overlap, strategy=args.strategy, param_bytes=args.param_bytes,
                  samples_per_step_per_device=samples, topology=topology, micro_batches=args.micro_batches,
                  n_layers=args.layers, reshard_after_forward=args.reshard_after_forward,
                  sync_each_micro_batch=args.sync_each_micro_batch, straggler_cv=args.straggler_cv, **extra,
                  **extra_peak)


def run_waits(args, run_dir: str, profile: str) -> tuple[tuple[int, float], ...]:
    """The slowest-rank wait per device count from a run's own data under its sampler, on the profile's device
    (its peak x ASSUMED_MFU: plan's rate; commands/from_data.py); none where it cannot be sized, said on stderr."""
    import sys
    from types import SimpleNamespace

    from scaletrain.commands.from_data import data_waits, job_lengths, sampler_of
    from scaletrain.commands.scale import parse_workers
    from scaletrain.config import load_config
    from scaletrain.errors import ScaletrainError
    from scaletrain.memory.plan import shape_for
    from scaletrain.model.tokenizer import plan_vocab
    from scaletrain.rundir import RunDir
    from scaletrain.scaling.profiles import BY_DEVICE

    device = next((key for key, name in BY_DEVICE.items() if name == profile), None)
    try:
        cfg = load_config(str(RunDir(run_dir).resolved_config), [])
        shape = shape_for(cfg, plan_vocab(cfg.model.name_or_path))
    except (ScaletrainError, OSError) as e:
        why = f"its config cannot be read: {str(e).splitlines()[0]}"
        cfg = None
    if cfg is not None:
        lengths, why = job_lengths(cfg)
        dtype = "bf16" if cfg.train.bf16 else "fp16" if cfg.train.fp16 else "fp32"
        waits = data_waits(cfg, shape, SimpleNamespace(key=device), dtype, parse_workers(args.gpus, flag="--gpus"),
                           lengths) if lengths and device else {}
        if mine := waits.get(sampler_of(cfg)):
            print(f"note: waiting for the slowest rank sized from {run_dir}'s data ({why}) on {device}",
                  file=sys.stderr)
            return tuple((n, w.wait_s) for n, w in mine.items())
        why = why if not lengths else f"no peak FLOPs known for --profile {profile}'s device"
    print(f"note: the wait for the slowest rank is not sized from {run_dir}'s data ({why}); none assumed",
          file=sys.stderr)
    return ()


def measured_breakdown(run_dir: str) -> dict:
    """A finished run's median step breakdown (worker/breakdown.py: data wait, compute without gradient sync,
    exposed communication, optimizer, in seconds) with what the prediction needs of it."""
    from scaletrain.metrics.records import read_jsonl
    from scaletrain.rundir import RunDir

    run = RunDir(run_dir).require_run()
    if not run.finished():
        raise ConfigError(f"--run {run_dir}: no {RunDir.SUMMARY}; point it at a finished run")
    summary = json.loads(run.summary.read_text())
    records = [r for r in read_jsonl(run.metrics) if r.get("kind") == "breakdown"]
    if not records:
        raise ConfigError(f"--run {run_dir}: no step breakdown recorded (a DDP or 1-worker run with "
                          f"monitor.breakdown_every > 0; FSDP gathers in forward, so it has none)")
    records = records[1:] or records  # the first probe holds the warm-up step
    out = {k: statistics.median(r[f"time/{k}"] for r in records)
           for k in ("data_wait_s", "compute_s", "exposed_comm_s", "optimizer_s", "step_s")}
    return {**out, "workers": summary["world_size"], "strategy": summary.get("strategy", "ddp"),
            "grad_bytes": summary.get("parameters/trainable", 0) * 4,
            "samples_per_step_per_device": summary.get("samples_per_step_per_device"), "probes": len(records)}


def term_by_term(measured: dict, predicted: dict) -> list[str]:
    """The prediction at the run's own worker count against what the run measured, in the breakdown's categories:
    the measured exposed communication (sync on minus sync off) holds what the prediction splits into exposed
    gathers, reductions, latency, contention and stragglers."""
    lost = {k: predicted[k] for k in LOSS_NAMES}
    exposed = sum(lost.values())
    step = predicted["step_time_s"] + measured["data_wait_s"]
    lines = [f"measured run: {measured['workers']} worker(s), {measured['strategy']}, median of {measured['probes']} "
             f"step breakdown(s); predicted at {measured['workers']} from its compute",
             f"{'term':<28} {'measured s':>11} {'predicted s':>12}",
             f"{'compute + optimizer':<28} {measured['compute_s'] + measured['optimizer_s']:>11.4f} "
             f"{predicted['compute_s']:>12.4f}  (the input)",
             f"{'lost to communication':<28} {measured['exposed_comm_s']:>11.4f} {exposed:>12.4f}  ("
             + ", ".join(f"{LOSS_NAMES[k]} {v:.4f}" for k, v in lost.items()) + ")",
             f"{'data wait':<28} {measured['data_wait_s']:>11.4f} {measured['data_wait_s']:>12.4f}  (measured: not "
             f"modelled)",
             f"{'step':<28} {measured['step_s']:>11.4f} {step:>12.4f}  ({step / measured['step_s'] - 1:+.1%})"]
    return lines


def measured_spread(run_dir: str) -> float:
    """The median over a run's train records of the spread of its ranks' own work before the gradient sync
    (``ranks/ready_s``: std / mean across ranks), the per-step straggler spread the run measured."""
    from scaletrain.metrics.records import read_jsonl
    from scaletrain.rundir import RunDir

    run = RunDir(run_dir).require_run()
    spreads = []
    for r in read_jsonl(run.metrics):
        ready = r.get("ranks/ready_s") if r.get("kind") == "train" else None
        if ready and len(ready) > 1 and statistics.fmean(ready) > 0:
            spreads.append(statistics.pstdev(ready) / statistics.fmean(ready))
    if not spreads:
        raise ConfigError(f"--straggler-from {run_dir}: no train record with per-rank times (ranks/ready_s) of 2+ "
                          f"ranks; give a run of 2 or more workers")
    return statistics.median(spreads[1:] or spreads)  # the first record holds the warm-up step


LOSS_NAMES = {"gather_s": "gather", "reduce_s": "reduce", "latency_s": "latency", "contention_s": "contend",
              "straggler_s": "stragg"}


def print_table(rows: list[dict]) -> None:
    """One line per device count: the step, the share of it each loss takes, speedup and efficiency."""
    print(f"{'workers':>7} {'nodes':>5} {'step s':>9} " + " ".join(f"{v:>7}" for v in LOSS_NAMES.values())
          + f" {'speedup':>8} {'effic.':>7}" + ("  samples/s" if "samples_per_s" in rows[0] else ""))
    for r in rows:
        print(f"{r['workers']:>7} {r['nodes']:>5} {r['step_time_s']:9.4f} "
              + " ".join(f"{r[k] / r['step_time_s']:7.1%}" for k in LOSS_NAMES)
              + f" {r['speedup']:8.2f} {r['efficiency']:7.1%}"
              + (f"  {r['samples_per_s']:9.1f}" if "samples_per_s" in r else ""))
    for line in lost_lines(rows):
        print(line)
    for line in comm_lines(rows):
        print(line)


def comm_lines(rows: list[dict]) -> list[str]:
    """Per device count, both readings of a "communication share": the bus bandwidth the step's collectives reach
    over the links' theoretical peak, and the exposed communication and waiting over the step."""
    import textwrap

    rows = [r for r in rows if r["workers"] > 1 and "busbw_gbs" in r]
    if not rows:
        return []
    out = [f"{'workers':>7} {'busbw GB/s':>10} {'of links':>8} {'comm+wait':>9}"]
    for r in rows:
        share = f"{r['busbw_share']:.0%}" if r["busbw_share"] is not None else "-"
        out.append(f"{r['workers']:>7} {r['busbw_gbs']:>10.1f} {share:>8} {r['comm_wait_share']:>9.1%}")
    return out + textwrap.wrap("(the bus bandwidth the step's collectives reach, over the theoretical peak of the "
                               "links they use inside a node; the step's exposed communication and waiting for the "
                               "slowest rank)", 80)


def lost_lines(rows: list[dict]) -> list[str]:
    """Where the time goes at the largest device count, and per count the lever that buys the most."""
    from scaletrain.scaling.predict import LOSSES

    lines = []
    if worst := [r for r in rows if r.get("largest_loss")]:
        r = worst[-1]
        lines.append(f"at {r['workers']} devices {r['lost_share']:.1%} of the step is lost to scale, most to "
                     f"{LOSSES[r['largest_loss']]} ({r[r['largest_loss']] / r['step_time_s']:.1%} of the step)")
    best: dict[str, list] = {}  # the best lever per device count, grouped by setting
    for r in rows:
        if r.get("levers"):
            lever = r["levers"][0]
            best.setdefault(lever["setting"], [lever["what"]]).append((r["workers"], lever["gain"]))
    for setting, (what, *gains) in best.items():
        lines.append(f"{setting} buys {' / '.join(f'{100 * g:+.1f}' for _, g in gains)} points of efficiency at "
                     f"{' / '.join(str(n) for n, _ in gains)} devices: {what}")
    return lines


def print_published() -> int:
    """Predicted vs published speedups, every row of scaling/published.py, with the target and what is assumed."""
    import textwrap

    from scaletrain.scaling.published import PUBLISHED, TARGET, check

    rows = check()
    print(f"{'published':<37} {'GPUs':>4} {'speedup':>7} {'predict':>7} {'error':>7} {f'<{TARGET:.0%}':>4} "
          f"{'largest':>8}")
    for r in rows:
        if r["predicted"] is None:
            print(f"{r['row']:<37} {r['gpus']:>4} {r['published']:>6.2f}x {'-':>7} {'-':>7} {'-':>4}  (none)")
        else:
            print(f"{r['row']:<37} {r['gpus']:>4} {r['published']:>6.2f}x {r['predicted']:>6.2f}x "
                  f"{r['error']:>+7.1%} {'yes' if r['within'] else 'NO':>4} "
                  f"{LOSS_NAMES.get(r['largest_loss'], '-'):>8}")
    for r in rows:
        if r["within"] is False:
            cv = r["straggler_cv_to_match"]
            print(textwrap.fill(f"- outside the target, {r['row']} at {r['gpus']} GPUs: {r['why']}"
                                + (f"; the wait that would close the gap is a per-micro-batch compute spread of "
                                   f"{cv:.0%} across ranks (--straggler-cv {cv:.2f}), a spread a run measures"
                                   if cv is not None else ""),
                                80, subsequent_indent="  ", break_long_words=False))
    for row in PUBLISHED:
        mine = [r for r in rows if r["row"] == row.name and r.get("comm_share_published") is not None]
        if not mine:
            continue
        gpus = " / ".join(str(r["gpus"]) for r in mine)

        def pct(key: str, mine: list[dict] = mine) -> str:
            return " / ".join(f"{100 * r[key]:.0f}%" if r[key] is not None else "-" for r in mine)

        errors = " / ".join(f"{r['busbw_share'] / r['comm_share_published'] - 1:+.0%}" for r in mine
                            if r["busbw_share"] is not None)
        print(textwrap.fill(f"- communication, {row.name}: {pct('comm_share_published')} at {gpus} GPUs in "
                            f"{row.comm_reading}; predicted {pct('busbw_share')} ({errors}); the other reading, "
                            f"exposed communication and waiting over the step: {pct('comm_wait_share')}",
                            80, subsequent_indent="  ", break_long_words=False))
    for row in PUBLISHED:
        print(textwrap.fill(f"- {row.name}: {row.source}; {row.setup}"
                            + (f"; assumed: {row.assumed}" if row.assumed else "")
                            + (f"; not compared: {row.no_prediction}" if row.no_prediction else ""),
                            80, subsequent_indent="  ", break_long_words=False))
    return 0


def run(args: argparse.Namespace) -> int:
    from scaletrain.commands.scale import parse_workers
    from scaletrain.scaling.predict import table

    if args.check_published:
        if args.json:
            from scaletrain.scaling.published import check

            print(json.dumps(check(), indent=1))
            return 0
        return print_published()
    measured = measured_breakdown(args.measured_run) if args.measured_run else None
    inputs = inputs_from_args(args, measured)
    rows = table(inputs, parse_workers(args.gpus, flag="--gpus"))
    compared = None
    if measured is not None:
        from scaletrain.scaling.predict import step

        compared = (measured, step(inputs, measured["workers"]))
    if args.json:
        print(json.dumps({"rows": rows, "measured": compared[0], "predicted_at_run": compared[1]} if compared
                         else rows, indent=1))
        return 0
    print_table(rows)
    if compared:
        print("\n".join(term_by_term(*compared)))
    if args.straggler_from:
        print(spread_check(args.straggler_from, args.straggler_cv))
    return 0


def spread_check(run_dir: str, measured: float) -> str:
    """The ranks' step spread a run measured beside the one its data gives (commands/from_data.py)."""
    import textwrap

    from scaletrain.commands.from_data import derived_rank_spread
    from scaletrain.rundir import RunDir

    workers = json.loads(RunDir(run_dir).summary.read_text())["world_size"]
    derived, why = derived_rank_spread(run_dir, workers)
    said = (f"its data gives up to {derived:.3f} ({why}: its micro-batches' FLOPs alone; the part of a step that "
            f"does not grow with its rows lowers the measured spread)" if derived is not None else
            f"its data's is not sized ({why})")
    return textwrap.fill(f"ranks' step spread (std / mean): measured {measured:.3f} in {run_dir} (ranks/ready_s, "
                         f"{workers} workers; the prediction's --straggler-cv); {said}", 80, subsequent_indent="  ",
                         break_long_words=False)
