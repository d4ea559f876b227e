"""`scaletrain plan CONFIG [k=v ...] [--gpus 1,2,4,8] [--device mi300x] [--gpus-per-node 8]`: per-device memory
by what holds it, for the configured job and the other memory levers, a verdict per world size, and step time,
speedup and efficiency from the scaling predictor. Reads the model's config only (meta device)."""

from __future__ import annotations

import argparse
import json

from scaletrain.errors import ConfigError


def register(sub: argparse._SubParsersAction, parents) -> None:
    p = sub.add_parser("plan", parents=parents, help="will the job fit, on how many devices, how fast")
    p.add_argument("config", help="the training config")
    p.add_argument("overrides", nargs="*", help="section.key=value overrides")
    p.add_argument("--gpus", default="1,2,4,8", help="world sizes to plan for")
    p.add_argument("--device", help="mi300x, mi325x, mi355x, mi250x, mi210, a100, a100-40gb, h100, h200, b200 or "
                                    "cpu (default: this machine's)")
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--json", action="store_true", help="the numbers as JSON")
    p.set_defaults(func=run)


def _this_device():
    from scaletrain.memory.plan import device_named, local_device

    return local_device(use_gpu=True, workers_here=1) or device_named("cpu")


def run(args: argparse.Namespace) -> int:
    from rich.table import Table

    from scaletrain.commands.scale import parse_workers
    from scaletrain.config import load_config
    from scaletrain.console import console
    from scaletrain.memory.estimate import GIB, estimate
    from scaletrain.memory.plan import ASSUMED_MFU, device_named, shape_for, step_time_s, variants, verdict
    from scaletrain.model import Vocab, load_tokenizer, model_dir
    from scaletrain.scaling.predict import PROFILES, Inputs, table

    cfg = load_config(args.config, args.overrides)
    sizes = parse_workers(args.gpus, "--gpus")
    if args.gpus_per_node < 1:
        raise ConfigError(f"--gpus-per-node {args.gpus_per_node}: must be >= 1")
    device = device_named(args.device) if args.device else _this_device()
    model_dir(cfg.model.name_or_path)
    tokenizer = load_tokenizer(cfg.model.name_or_path)
    shape = shape_for(cfg, Vocab.of(tokenizer))
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
    timing = []
    if compute is not None:
        profile = PROFILES.get(device.key.lower())
        if profile:
            grads = shape.trainable * 4
            inp = Inputs(compute_s=compute, grad_bytes=grads, intra=profile["intra"], inter=profile["inter"],
                         gpus_per_node=args.gpus_per_node, strategy=cfg.train.strategy,
                         param_bytes=shape.total * (2 if dtype != "fp32" else 4), n_layers=max(1, shape.layers))
            timing = table(inp, sizes)
        else:
            timing = [{"workers": n, "step_time_s": compute, "note": f"compute only: no network profile for "
                                                                     f"{device.key} (scaletrain predict --commbench)"}
                      for n in sizes]
    if args.json:
        print(json.dumps({"device": device.key, "device_memory_gib": device.memory_bytes / GIB, "rows": rows,
                          "verdicts": {n: v[1] for n, v in verdicts.items()}, "timing": timing,
                          "assumed_mfu": ASSUMED_MFU if compute is not None else None}, indent=1))
    else:
        console.print(f"scaletrain plan: {cfg.model.name_or_path} on {device.key} ({device.memory_bytes / GIB:.0f} "
                      f"GiB per device); GiB per device (weights, gradients, optimizer state, activations, "
                      f"buffers, runtime overhead)", soft_wrap=True)
        t = Table(pad_edge=False, padding=(0, 1))
        for col in ("variant", "n", "weights", "grads", "optim", "activ", "buffers", "overhd", "peak", "at", "fits"):
            t.add_column(col, justify="left" if col in ("variant", "at") else "right", no_wrap=True)
        for r in rows:
            t.add_row(r["variant"], str(r["devices"]), *(f"{r[k]:.1f}" for k in (
                "parameters", "gradients", "optimizer", "activations", "buffers", "overhead", "peak")),
                      r["peak_phase"], "yes" if r["fits"] else "[red]no[/]")
        console.print(t, crop=False)
        for n, (ok, text) in verdicts.items():
            console.print(f"{n} device(s): {'[green]' if ok else '[red]'}{text}[/]", soft_wrap=True)
        for r in timing:
            extra = (f", speedup {r['speedup']:.2f}x, efficiency {r['efficiency']:.0%}" if "speedup" in r else
                     f" ({r['note']})")
            console.print(f"{r['workers']} device(s): step {r['step_time_s']:.3f} s{extra}", soft_wrap=True)
        if compute is not None:
            console.print(f"(compute at an assumed {ASSUMED_MFU:.0%} MFU of {device.key}'s peak {dtype})",
                          soft_wrap=True)
    if not any(ok for ok, _ in verdicts.values()):
        raise ConfigError(f"the job fits none of --gpus {args.gpus} on {device.key}: "
                          f"{verdicts[sizes[-1]][1].split('; ', 1)[1]}")
    return 0
