"""`scaletrain scale CONFIG --workers 1,2,4,8` and `scaletrain parity CONFIG --workers N`."""

from __future__ import annotations

import argparse
import contextlib
import json
from pathlib import Path

from scaletrain.commands.args import COUNT, NONNEGATIVE, POSITIVE, number
from scaletrain.errors import ConfigError


def register(sub: argparse._SubParsersAction, parents) -> None:
    p = sub.add_parser("scale", parents=parents, help="run the config at several world sizes and tabulate scaling")
    p.add_argument("config", help="the training config")
    p.add_argument("overrides", nargs="*", help="section.key=value overrides")
    p.add_argument("--workers", default="1,2", help="world sizes, e.g. 1,2,4,8")
    p.add_argument("--warmup", type=NONNEGATIVE, default=5, help="steps excluded from timing")
    p.add_argument("--steps", type=COUNT, default=20, help="measured steps per world size")
    p.add_argument("--fixed-global-batch", action="store_true",
                   help="keep the global batch of the config fixed (strong scaling) instead of the per-device one")
    p.add_argument("--breakdown-every", type=NONNEGATIVE, default=5,
                   help="sample the step-time breakdown every K steps")
    p.set_defaults(func=run_scale)
    q = sub.add_parser("parity", parents=parents, help="check N workers reproduce 1 worker (same global batch)")
    q.add_argument("config", help="the training config")
    q.add_argument("overrides", nargs="*", help="section.key=value overrides")
    q.add_argument("--workers", type=number(int, 2), default=2, help="the world size compared with 1 worker")
    q.add_argument("--steps", type=COUNT, default=20, help="steps each run trains")
    q.add_argument("--tolerance", type=POSITIVE, default=None, help="max relative loss difference (default 1e-3)")
    q.add_argument("--keep-dropout", action="store_true", help="leave dropout on (curves then differ by noise)")
    q.set_defaults(func=run_parity)


def parse_workers(text: str, flag: str = "--workers") -> list[int]:
    try:
        sizes = sorted({int(w) for w in text.split(",") if w.strip()})
    except ValueError:
        raise ConfigError(f"{flag} {text}: give world sizes like 1,2,4,8") from None
    if not sizes or sizes[0] < 1:
        raise ConfigError(f"{flag} {text}: world sizes must be >= 1")
    return sizes


def run_scale(args: argparse.Namespace) -> int:
    from scaletrain.config import load_config
    from scaletrain.console import console
    from scaletrain.launch.doctor import CPU_HEADROOM_NOTE, worker_fit
    from scaletrain.launch.job import run_job
    from scaletrain.launch.launcher import choose_launcher
    from scaletrain.launch.ray_launcher import ray_session
    from scaletrain.rundir import create_run_dir
    from scaletrain.scaling.sweep import add_speedup, check_sweep, measure, plan_config, write_outputs

    cfg = load_config(args.config, args.overrides)
    sizes = parse_workers(args.workers)
    check_sweep(cfg, sizes, args.warmup, args.steps, args.fixed_global_batch, args.breakdown_every)
    with ray_session(cfg.scaling.address) as resources:
        fit = worker_fit(cfg, resources)
        capacity = fit.capacity
        out = create_run_dir(cfg.output.output_dir, None, f"scale-{Path(args.config).stem}")
        rows = []
        for n in sizes:
            if n > capacity:
                console.print(f"[yellow]skipping {n} workers[/]: the cluster fits {capacity}", soft_wrap=True)
                rows.append({"workers": n, "note": f"skipped: the cluster fits {capacity} workers"})
                continue
            run_cfg = plan_config(cfg, n, args.warmup, args.steps, args.fixed_global_batch, out, args.breakdown_every)
            result = run_job(run_cfg, args.config, show_progress=False)
            row = measure(result.run_dir, args.warmup, n)
            if fit.fills_cpus(n, choose_launcher(run_cfg)[0].scaling.launcher):  # why it is low on a small box
                row["note"] = CPU_HEADROOM_NOTE
            rows.append(row)
    paths = write_outputs(add_speedup(rows), out, f"scaletrain scale: {Path(args.config).name}")
    console.print((out / "scaling.md").read_text(), soft_wrap=True, markup=False)  # its [..](..) links are text
    console.print(f"written: {', '.join(str(p) for p in paths)}", soft_wrap=True)
    return 0


def run_parity(args: argparse.Namespace) -> int:
    from scaletrain.config import load_config
    from scaletrain.console import console
    from scaletrain.launch.job import run_job
    from scaletrain.launch.launcher import runs_on_ray
    from scaletrain.launch.ray_launcher import ray_session
    from scaletrain.rundir import create_run_dir
    from scaletrain.scaling.parity import DEFAULT_TOLERANCE, check_pair, compare, plan_pair, verdict

    cfg = load_config(args.config, args.overrides)
    tolerance = args.tolerance if args.tolerance is not None else DEFAULT_TOLERANCE
    check_pair(cfg, args.workers, args.steps, tolerance)
    many = cfg.model_copy(update={"scaling": cfg.scaling.model_copy(update={"num_workers": args.workers})})
    with ray_session(cfg.scaling.address) if runs_on_ray(many) else contextlib.nullcontext():
        out = create_run_dir(cfg.output.output_dir, None, f"parity-{Path(args.config).stem}")
        one, many = plan_pair(cfg, args.workers, args.steps, args.keep_dropout, out)
        r1 = run_job(one, args.config, show_progress=False)
        rn = run_job(many, args.config, show_progress=False)
    result = compare(r1.run_dir, rn.run_dir)
    ok = verdict(result, tolerance)
    result.update(workers=args.workers, tolerance=tolerance, passed=ok,
                  lr_1=r1.summary["learning_rate"], lr_n=rn.summary["learning_rate"])
    (out / "parity.json").write_text(json.dumps(result, indent=1))
    ea, eb = result["final_eval_loss_1"], result["final_eval_loss_n"]
    evals = f"final eval loss {ea:.5f} vs {eb:.5f}" if ea is not None and eb is not None else "no eval loss"
    console.print(f"parity 1 vs {args.workers} workers over {result['steps']} steps: max relative loss difference "
                  f"{result['max_rel_loss_diff']:.2e} (step {result['worst_step']}), {evals}; tolerance "
                  f"{tolerance:g}: {'PASS' if ok else 'FAIL'}", soft_wrap=True)
    if not ok:
        hint = (f" (learning rate {result['lr_1']:g} on 1 worker but {result['lr_n']:g} on {args.workers}: "
                f"check train.lr_scaling / lr_reference_batch)" if result["lr_1"] != result["lr_n"] else "")
        console.print(f"[red]the {args.workers}-worker run does not reproduce the 1-worker run[/]{hint}",
                      soft_wrap=True)
        return 1
    return 0
