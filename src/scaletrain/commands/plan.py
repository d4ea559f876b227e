"""`scaletrain plan CONFIG [k=v ...] [--gpus 1,2,4,8] [--device mi300x] [--gpus-per-node 8]`: per-device memory
by what holds it, for the configured job and the other memory levers, a verdict per world size, and step time,
speedup and efficiency from the scaling predictor. Reads the model's config only (meta device)."""

from __future__ import annotations

import argparse
import json

from scaletrain.commands.args import COUNT, POSITIVE
from scaletrain.errors import ConfigError
from scaletrain.rl.overlap import overlap_line


def register(sub: argparse._SubParsersAction, parents) -> None:
    p = sub.add_parser("plan", parents=parents, help="will the job fit, on how many devices, how fast")
    p.add_argument("config", help="the training config")
    p.add_argument("overrides", nargs="*", help="section.key=value overrides")
    p.add_argument("--gpus", default="1,2,4,8", help="world sizes to plan for")
    p.add_argument("--device", help="mi300x, mi325x, mi355x, mi250x, mi210, a100, a100-40gb, h100, h200, b200 or "
                                    "cpu (default: this machine's)")
    p.add_argument("--gpus-per-node", type=COUNT, default=8, help="devices per node (the plan's node count)")
    p.add_argument("--context-parallel", help="context-parallel degrees to weigh, e.g. 1,2,4,8 (default: those, "
                                              "for sequences of 16k tokens or more or a config that sets it)")
    p.add_argument("--json", action="store_true", help="the numbers as JSON (everything)")
    p.add_argument("--all", action="store_true", help="also the table of memory levers (wider than 80 columns)")
    p.add_argument("--mtbf-hours", type=POSITIVE, help="mean time between failures of the job: suggests "
                                                    "checkpoint.save_steps (Young/Daly)")
    p.add_argument("--checkpoint-s", type=POSITIVE, help="with --mtbf-hours: one checkpoint's cost in seconds "
                                                      "(default: its size at an assumed 1 GB/s)")
    p.add_argument("--step-s", type=POSITIVE, help="with --mtbf-hours: one step's time (default: the plan's estimate)")
    p.add_argument("--price", action="append", default=[], metavar="DEVICE=PER_HOUR",
                   help="price per device-hour (repeat to compare devices side by side): device-hours and cost per "
                        "device count, e.g. --price mi300x=3.2 --price h100=4.5")
    p.add_argument("--steps", type=COUNT, help="with --price: the job's optimizer steps at scaling.num_workers "
                                               "(default: train.max_steps)")
    p.add_argument("--deadline", type=POSITIVE, metavar="HOURS",
                   help="with --price: the cheapest device and count that finishes within this many hours")
    p.set_defaults(func=run)


def _this_device():
    from scaletrain.memory.plan import device_named, local_device

    return local_device(use_gpu=True, workers_here=1) or device_named("cpu")


def run(args: argparse.Namespace) -> int:

    from scaletrain.commands.scale import parse_workers
    from scaletrain.config import load_config
    from scaletrain.memory.estimate import GIB, estimate
    from scaletrain.memory.plan import (
        ASSUMED_MFU,
        device_named,
        rollout_engine_line,
        shape_for,
        step_time_s,
        variants,
        verdict,
    )
    from scaletrain.model.tokenizer import plan_vocab

    cfg = load_config(args.config, args.overrides)
    sizes = parse_workers(args.gpus, "--gpus")
    if args.gpus_per_node < 1:
        raise ConfigError(f"--gpus-per-node {args.gpus_per_node}: must be >= 1")
    device = device_named(args.device) if args.device else _this_device()
    vocab = plan_vocab(cfg.model.name_or_path)
    shape = shape_for(cfg, vocab)
    kind = "cpu" if device.key == "cpu" else "gpu"
    rows = []
    for name, c in variants(cfg):
        for n in sizes:
            b = estimate(c, shape, n, kind)
            rows.append({"variant": name, "devices": n, **{k: v / GIB if isinstance(v, int) else v
                                                           for k, v in b.as_dict().items()},
                         "fits": b.peak <= device.memory_bytes})
    verdicts = {n: verdict(cfg, shape, n, device) for n in sizes}
    dtype = "bf16" if cfg.train.bf16 else "fp16" if cfg.train.fp16 else "fp32"
    compute = step_time_s(cfg, shape, device, dtype)
    from scaletrain.commands.from_data import job_lengths

    lengths, read = job_lengths(cfg) if compute is not None and max(sizes) > 1 else (None, "")
    timing = _timing(args, cfg, shape, device, dtype, compute, sizes, lengths) if compute is not None else []
    interval = save_steps_for(args, cfg, shape, compute) if args.mtbf_hours is not None else None
    cp_rows, cp_lines = _context_parallel(args, cfg, vocab, sizes, device)
    engine = {n: line for n in sizes if (line := rollout_engine_line(cfg, shape, n, device)) is not None}
    if args.json:
        moe = ({"moe": {"experts": shape.experts[0], "experts_per_token": shape.experts[1],
                        "parameters": shape.total, "active_parameters": shape.active_total}} if shape.experts else {})
        print(json.dumps({"device": device.key, "device_memory_gib": device.memory_bytes / GIB, "rows": rows, **moe,
                          **({"checkpoint_interval": interval} if interval else {}),
                          "verdicts": {n: v[1] for n, v in verdicts.items()}, "timing": timing,
                          **({"context_parallel": cp_rows, "context_parallel_notes": cp_lines} if cp_rows else {}),
                          **({"rollout_engine": {n: {"fits": ok, "note": line} for n, (ok, line) in engine.items()}}
                             if engine else {}),
                          "assumed_mfu": ASSUMED_MFU if compute is not None else None,
                          "straggler_sized_from": read or None}, indent=1))
    else:
        _print(cfg, device, rows, verdicts, timing, compute, dtype, args.all, shape.moe_line(), read)
        for line in cp_lines:
            _say(f"context parallel: {line}")
        for line in dict.fromkeys(line for _, line in engine.values()):  # one line each different one
            _say(line)
        if interval:
            import textwrap

            print(textwrap.fill(interval["note"], WIDTH, subsequent_indent="  ", break_long_words=False))
    if not args.json and (overlap := overlap_line(cfg)):
        _say(overlap)
    if not args.json and (images := _images_line(cfg)):
        _say(images)
        if loaders := _loaders_line(cfg):
            _say(loaders)
    if args.price:
        _costs(args, cfg, shape, sizes, dtype)
    elif args.deadline or args.steps:
        raise ConfigError("--deadline and --steps go with --price DEVICE=PER_HOUR (what a device-hour costs)")
    if engine and not any(ok for ok, _ in engine.values()):
        raise ConfigError(f"GRPO's rollout engine fits none of --gpus {args.gpus} on {device.key}: "
                          f"{next(iter(engine.values()))[1]}")
    if not any(ok for ok, _ in verdicts.values()):
        split = next((r for r in cp_rows if r["fits"]), None)
        fix = (f"set scaling.context_parallel={split['context_parallel']} on {split['devices']} devices (each "
               f"sequence split over {split['context_parallel']})" if split else
               verdicts[sizes[-1]][1].split('; ', 1)[1])
        raise ConfigError(f"the job fits none of --gpus {args.gpus} on {device.key}: {fix}")
    return 0


def _costs(args, cfg, shape, sizes, dtype) -> None:
    """--price: device-hours and cost per device count for each priced device, side by side (memory/cost.py)."""
    from scaletrain.memory.cost import cheapest, job_rows, parse_prices
    from scaletrain.memory.plan import device_named, step_time_s, verdict

    steps = args.steps or (cfg.train.max_steps if cfg.train.max_steps > 0 else None)
    if steps is None:
        raise ConfigError("--price: give --steps N (the job's optimizer steps at scaling.num_workers) or set "
                          "train.max_steps, so the job's length is known")
    by_device = {}
    for key, price in parse_prices(args.price, device_named).items():
        device = device_named(key)
        compute = step_time_s(cfg, shape, device, dtype)
        if compute is None:
            raise ConfigError(f"--price {key}: the plan has no step time for {key} (no peak FLOPs known); price "
                              f"another device")
        times = {r["workers"]: r["step_time_s"] for r in _timing(args, cfg, shape, device, dtype, compute, sizes)}
        fits = {n: verdict(cfg, shape, n, device)[0] for n in sizes}
        by_device[key] = job_rows(times, steps, cfg.scaling.num_workers, price, fits)
    print(f"cost of {steps} steps at {cfg.scaling.num_workers} worker(s) (the same samples on every count):")
    print(f"{'device':<10}{'count':>6}{'fits':>6}{'hours':>10}{'dev-hours':>11}{'cost':>11}")
    for key, rows in by_device.items():
        for r in rows:
            print(f"{key:<10}{r['devices']:>6}{'yes' if r['fits'] else 'no':>6}{r['hours']:>10.2f}"
                  f"{r['device_hours']:>11.1f}{r['cost']:>11.2f}")
    best = cheapest(by_device, args.deadline)
    within = f" within {args.deadline:g} h" if args.deadline else ""
    if best is None:
        raise ConfigError(f"--deadline {args.deadline:g}: no priced device count in --gpus {args.gpus} fits and "
                          f"finishes{within}; add devices (--gpus) or relax the deadline")
    key, r = best
    _say(f"cheapest{within}: {r['devices']} x {key}, {r['hours']:.2f} h, {r['device_hours']:.1f} device-hours, "
         f"cost {r['cost']:.2f}")


def _timing(args, cfg, shape, device, dtype, compute, sizes, lengths: list[int] | None = None) -> list[dict]:
    """The predicted step time per world size on ``device`` (compute only where it has no network profile)."""
    from scaletrain.commands.from_data import data_waits, sampler_of
    from scaletrain.scaling.predict import Inputs, table
    from scaletrain.scaling.profiles import missing, profile_for

    profile = profile_for(device.key)
    if not profile:
        return [{"workers": n, "step_time_s": compute, "note": f"compute only: {missing(device.key)}"} for n in sizes]
    waits = data_waits(cfg, shape, device, dtype, sizes, lengths) if lengths else {}
    inp = Inputs(compute_s=compute, grad_bytes=shape.trainable * 4, intra=profile["intra"], inter=profile["inter"],
                 gpus_per_node=args.gpus_per_node, strategy=cfg.train.strategy, topology=profile["topology"],
                 param_bytes=shape.total * (2 if dtype != "fp32" else 4), n_layers=max(1, shape.layers),
                 micro_batches=cfg.train.gradient_accumulation_steps,
                 reshard_after_forward=cfg.train.fsdp_reshard_after_forward, shard_size=cfg.train.fsdp_shard_size,
                 straggler_waits=tuple((n, w.wait_s) for n, w in waits.get(sampler_of(cfg), {}).items()),
                 link_peak_gbs=profile.get("link_peak_gbs", 0.0))
    rows = table(inp, sizes)
    for r in rows:  # the levers that remove the wait: the other samplers' waits at the same count
        r["straggler_by_sampler"] = {k: v[r["workers"]].wait_s for k, v in waits.items()}
    return rows





LONG_SEQUENCE = 16384  # tokens from which `plan` weighs context parallelism unasked


def _context_parallel(args, cfg, vocab, sizes, device) -> tuple[list[dict], list[str]]:
    from scaletrain.commands.scale import parse_workers
    from scaletrain.memory.plan import context_parallel_lines, context_parallel_options

    asked = args.context_parallel
    if cfg.model.task != "causal-lm" or not (asked or cfg.scaling.context_parallel > 1
                                             or cfg.data.max_length >= LONG_SEQUENCE):
        return [], []
    degrees = tuple(parse_workers(asked, "--context-parallel")) if asked else (1, 2, 4, 8)
    rows = context_parallel_options(cfg, vocab, sizes, device, degrees)
    return rows, context_parallel_lines(cfg, rows, device)


def _images_line(cfg) -> str | None:
    """A vision-language model's images: their tokens and the tower's cost (model/vision.py image_plan)."""
    from scaletrain.model.files import model_dir
    from scaletrain.model.vision import image_plan, image_plan_line, is_vision_language

    path = model_dir(cfg.model.name_or_path)
    if path is None:
        return None
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(path), local_files_only=True)
    if not is_vision_language(config):
        return None
    m = cfg.model
    trains = m.finetuning_type == "full" and not (m.freeze_vision_tower and m.freeze_multi_modal_projector)
    facts = image_plan(config, cfg.data.image_max_pixels, cfg.data.max_length, trains,
                       4 if not (cfg.train.bf16 or cfg.train.fp16) else 2)
    return image_plan_line(facts, cfg.data.image_max_pixels, trains)


def _loaders_line(cfg) -> str | None:
    """The data-loading workers' images/s per core (timed here on the first images of the data) against a step's
    images (data/pixels.py loader_line); None when the data has no images or cannot be read here."""
    import tempfile

    from transformers import AutoConfig

    from scaletrain.data.images import ImageProblem, media_base, sized_images
    from scaletrain.data.pixels import loader_line
    from scaletrain.data.sources import load, sources
    from scaletrain.errors import DataError
    from scaletrain.model.files import model_dir
    from scaletrain.model.processor import loader_pixels

    d, tr = cfg.data, cfg.train
    for src in sources(d, cfg.model.task, tr.stage):
        try:
            with tempfile.TemporaryDirectory(prefix="scaletrain-plan-") as scratch:
                ds = load(src.path, src.file_format, src.key, scratch, d.encoding, src.origin).ds
        except DataError:
            return None  # plan sizes the job; train names a bad file
        if src.columns.images not in ds.column_names:
            continue
        column = ds.select(range(min(len(ds), 1000)))[src.columns.images]
        rows = [r if isinstance(r, list) else [r] for r in column]
        refs = [ref for r in rows[:8] for ref in (r or [])][:4]
        try:
            where = [w for w, _ in sized_images(refs, media_base(d.media_dir, src.path), d.image_max_pixels,
                                                d.image_min_pixels)]
        except ImageProblem:
            return None
        path = str(model_dir(cfg.model.name_or_path))
        pixels = loader_pixels(path, AutoConfig.from_pretrained(path, local_files_only=True), d.image_max_pixels,
                               d.image_min_pixels)
        per_record = sum(len(r or []) for r in rows) / len(rows)
        return loader_line(pixels.rate(where), len(where),
                           per_record * tr.per_device_train_batch_size * tr.gradient_accumulation_steps,
                           d.loader_workers)
    return None


def _say(text: str) -> None:
    import textwrap

    print(textwrap.fill(text, WIDTH, subsequent_indent="  ", break_long_words=False, break_on_hyphens=False))


WIDTH = 80  # the default output fits a terminal or a log of this width; numbers are never cut
ASSUMED_WRITE_GBPS = 1.0  # checkpoint write speed when --checkpoint-s is not given (a network filesystem's order)


def save_steps_for(args, cfg, shape, compute_s: float | None) -> dict:
    """checkpoint.save_steps from the job's MTBF (Young/Daly), with what it assumed."""
    from scaletrain.metrics.goodput import young_daly_s

    if args.mtbf_hours <= 0:
        raise ConfigError(f"--mtbf-hours {args.mtbf_hours:g}: must be > 0 (the mean time between failures)")
    step_s = args.step_s or compute_s
    if not step_s:
        raise ConfigError("--mtbf-hours: no step time is known for this device; give --step-s (a measured step, "
                          "e.g. time/step_s in metrics.jsonl)")
    bytes_ = shape.trainable * 12  # what a checkpoint holds: the trainable fp32 weights and AdamW's two moments
    cost = args.checkpoint_s if args.checkpoint_s else bytes_ / (ASSUMED_WRITE_GBPS * 1e9)
    interval_s = young_daly_s(cost, args.mtbf_hours * 3600)
    steps = max(1, round(interval_s / step_s))
    said = "" if args.checkpoint_s else f" ({bytes_ / 1e9:.1f} GB at an assumed {ASSUMED_WRITE_GBPS:g} GB/s)"
    return {"save_steps": steps, "interval_s": interval_s, "checkpoint_s": cost, "step_s": step_s,
            "note": f"checkpoints: set checkpoint.save_steps={steps} (every {interval_s:.0f} s: Young/Daly "
                    f"sqrt(2 x {cost:.1f} s checkpoint{said} x {args.mtbf_hours:g} h MTBF), at {step_s:.3g} s a "
                    f"step)"}


def _print(cfg, device, rows, verdicts, timing, compute, dtype, show_all: bool, moe: str | None = None,
           read: str = "") -> None:
    """The configured job, one line per world size (peak, what dominates, fits, step time, speedup), then the
    verdicts wrapped at 80 columns; ``--all`` adds the variant table."""
    import textwrap

    from scaletrain.memory.plan import ASSUMED_MFU

    gib = device.memory_bytes / 2**30
    say = lambda text: print(textwrap.fill(text, WIDTH, subsequent_indent="  ", break_long_words=False,
                                           break_on_hyphens=False))
    say(f"scaletrain plan: {cfg.model.name_or_path} on {device.key} ({gib:.0f} GiB per device), {dtype}")
    if moe:
        say(moe)
    timed = {r["workers"]: r for r in timing}
    print(f"{'devices':>7} {'peak GiB':>9}  {'largest part':<26} {'fits':<4} {'step s':>7} {'speedup':>8} "
          f"{'effic.':>6}")
    parts = ("parameters", "gradients", "optimizer", "activations", "buffers", "overhead", "reference")
    for r in (r for r in rows if r["variant"] == "configured"):
        largest = max(parts, key=lambda k: r[k])
        what = f"{largest} {r[largest]:.1f}" + (f" ({r['peak_phase']})" if largest == "activations" else "")
        t = timed.get(r["devices"], {})
        step = f"{t['step_time_s']:.3f}" if "step_time_s" in t else "-"
        speed = f"{t['speedup']:.2f}x" if "speedup" in t else "-"
        eff = f"{t['efficiency']:.1%}" if "efficiency" in t else "-"
        print(f"{r['devices']:>7} {r['peak']:>9.1f}  {what:<26} {'yes' if r['fits'] else 'no':<4} {step:>7} "
              f"{speed:>8} {eff:>6}")
    for n, (_, text) in verdicts.items():
        say(f"{n} device(s): {text}")
    from scaletrain.commands.predict import lost_lines

    for line in lost_lines(timing):
        say(f"scaling: {line}")
    from scaletrain.commands.from_data import straggler_lines

    for line in straggler_lines(cfg, timing, read):
        say(f"scaling: {line}")
    from scaletrain.commands.predict import comm_lines

    for line in comm_lines(timing):
        print(line)
    notes = {r["note"] for r in timing if r.get("note") and r["note"] != "predicted"}
    for note in sorted(notes):
        say(f"step time: {note}")
    if compute is not None:
        say(f"(compute at an assumed {ASSUMED_MFU:.0%} MFU of {device.key}'s peak {dtype})")
    if show_all:
        print()
        print(f"{'variant':<18} {'n':>3} " + " ".join(f"{c:>7}" for c in ("weights", "grads", "optim", "activ",
                                                                            "buffers", "overhd", "peak"))
              + "  at             fits")
        for r in rows:
            print(f"{r['variant']:<18} {r['devices']:>3} " + " ".join(f"{r[k]:>7.1f}" for k in (
                "parameters", "gradients", "optimizer", "activations", "buffers", "overhead", "peak"))
                  + f"  {r['peak_phase']:<14} {'yes' if r['fits'] else 'no'}")
