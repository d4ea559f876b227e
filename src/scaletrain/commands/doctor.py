"""`scaletrain doctor [CONFIG]`: preflight checks as rows (name, ok/warn/fail, detail, fix); exit 1 on a failure."""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import tempfile
import time
from pathlib import Path


def register(sub: argparse._SubParsersAction, parents) -> None:
    p = sub.add_parser("doctor", parents=parents, help="preflight checks before spending GPU-hours")
    p.add_argument("config", nargs="?", help="the training config to check (workers, paths, batch/LR)")
    p.add_argument("overrides", nargs="*", help="section.key=value overrides")
    p.add_argument("--no-smoke", action="store_true", help="skip the all-reduce smoke test (no workers started)")
    p.set_defaults(func=run)


def gather_facts(cfg, smoke: bool):
    from scaletrain.comm.device import Platform
    from scaletrain.comm.ports import port_free
    from scaletrain.comm.topo import detect
    from scaletrain.envvars import MASTER_PORT, snapshot
    from scaletrain.launch.doctor import Facts
    from scaletrain.launch.orphans import describe, leftovers
    from scaletrain.storage.mirror import local_output_dir
    from scaletrain.storage.uri import is_uri

    environ = snapshot()
    platform = Platform.detect()
    shm = shutil.disk_usage("/dev/shm").total if Path("/dev/shm").exists() else None
    # on object storage: the disk of the local mirror, and a write probe of the store
    out = (local_output_dir(cfg.output.output_dir, cfg.storage) if cfg else Path(".")).resolve()
    while not out.exists():
        out = out.parent
    try:
        cmdline = Path("/proc/cmdline").read_text()
    except OSError:
        cmdline = ""
    topo = detect()
    facts = Facts(environ=environ, vendor=platform.vendor, gpu_count=max(platform.device_count, topo.count),
                  shm_bytes=shm, nofile_soft=resource.getrlimit(resource.RLIMIT_NOFILE)[0],
                  disk_free_bytes=shutil.disk_usage(out).free,
                  port_free=port_free(int(environ.get(MASTER_PORT, 0) or 0)), kernel_cmdline=cmdline,
                  topology_warnings=topo.warnings(), config=cfg, gpu_health=_gpu_health(platform),
                  leftovers=describe(left) if (left := leftovers()) else None)
    if cfg is not None and is_uri(cfg.output.output_dir):
        facts.store = _store_check(cfg)
    if cfg is not None:
        facts.path_errors = _path_errors(cfg)
        if not facts.path_errors:
            facts.data = _data_check(cfg)
            facts.experts = _experts(cfg, platform)
        if smoke:
            facts.cluster, facts.smoke = _cluster_and_smoke(cfg, platform.vendor)
    return facts


def _experts(cfg, platform) -> str | None:
    """An MoE model (from its config.json alone): its experts and whether torch has a grouped GEMM kernel here."""
    from scaletrain.errors import ScaletrainError
    from scaletrain.model.build import auto_and_config, grouped_gemm_kernel
    from scaletrain.model.moe import experts_of
    from scaletrain.model.tokenizer import plan_vocab

    if cfg.model.task != "causal-lm":
        return None
    try:
        _, config = auto_and_config(cfg.model, plan_vocab(cfg.model.name_or_path))
    except (ScaletrainError, OSError, ValueError):
        return None  # the model's own check says why
    experts = experts_of(config)
    if experts is None:
        return None
    import torch

    device = "cuda" if platform.has_gpu else "cpu"  # ROCm's torch names its devices cuda too
    kernel = grouped_gemm_kernel(device, torch.bfloat16 if platform.has_gpu else torch.float32)
    how = ("one grouped GEMM per projection (torch's kernel)" if kernel == "torch" else
           "transformers' fallback: one matmul per active expert (this torch has no grouped GEMM kernel here)")
    return f"{experts.count} experts, top-{experts.top_k}; on {device} the experts compute as {how}"


def _store_check(cfg) -> tuple[bool, str]:
    from scaletrain.errors import LaunchError
    from scaletrain.storage.uri import Store, probe

    try:
        took = probe(Store.of(cfg.output.output_dir, cfg.storage.endpoint_url))
    except LaunchError as e:
        return False, str(e)
    return True, f"{cfg.output.output_dir}: a probe object written and deleted in {took:.2f} s"


def _gpu_health(platform) -> list[dict]:
    """Each local GPU's ECC and page-retirement counters, where the vendor library is installed (a reader that
    fails gives nothing: a note in the check's absence, never a crash)."""
    if not platform.has_gpu:
        return []
    from scaletrain.metrics.gpu import gpu_health, reader_for

    found = []
    for i in range(platform.device_count):
        health = gpu_health(reader_for(f"cuda:{i}", platform.vendor))
        if health:
            found.append(health)
    return found


def _path_errors(cfg) -> list[str]:
    from scaletrain.data.sources import check_files
    from scaletrain.errors import ScaletrainError
    from scaletrain.model.files import model_dir

    errors = []
    for check in (lambda: model_dir(cfg.model.name_or_path),
                  lambda: check_files(cfg.data, cfg.model.task, cfg.train.stage)):
        try:
            check()
        except ScaletrainError as e:
            errors.append(str(e))
    return errors


def _data_check(cfg) -> tuple[bool, str, list[str]]:
    """`train`'s own preflight (the tokenized result is cached: train reuses it): (ok, what was found or the
    error, warnings)."""
    from scaletrain.comm.device import Platform
    from scaletrain.errors import ScaletrainError
    from scaletrain.launch.preflight import preflight

    try:
        pre = preflight(cfg)
        pre.precision(Platform.detect().has_gpu)
    except ScaletrainError as e:
        return False, str(e), []
    data = pre.data
    skipped = sum(data.skipped.values())
    train = f"a stream of {len(data.stream.shards)} shard(s)" if data.stream else f"{len(data.train)} train"
    detail = f"{train} / {len(data.eval)} eval examples"
    if data.labels is not None and data.labels.names:
        detail += f"; classes {', '.join(data.labels.names)}"
    warnings = [n.removeprefix("data: ") for n in data.notes if "warning:" in n]
    warnings += pre.fit_notes(Platform.detect().has_gpu)
    if skipped:  # the notes name the first lines of each reason
        warnings += [n.removeprefix("data: ") for n in data.notes if "skipped" in n]
    return True, detail, warnings


def _cluster_and_smoke(cfg, vendor):
    from scaletrain.comm.launch_env import worker_env
    from scaletrain.errors import ScaletrainError
    from scaletrain.launch import ray_launcher
    from scaletrain.launch.plan import plan_scaling

    with ray_launcher.ray_session(cfg.scaling.address) as resources:
        try:
            plan = plan_scaling(cfg.scaling, cfg.comm, resources, vendor)
        except ScaletrainError:
            return resources, None  # check_workers reports it
        if cfg.scaling.num_workers < 2:
            return resources, (True, "1 worker: no collective to test")
        out = Path(tempfile.mkdtemp(prefix="scaletrain-doctor-"))
        env = worker_env(cfg.comm, vendor, plan.backend, str(out))
        t0 = time.perf_counter()
        try:
            # SPREAD: on a multi-node cluster the smoke test should cross every node it can reach.
            spread = cfg.scaling.model_copy(update={"placement_strategy": "SPREAD"})
            ray_launcher.run_on_workers(_smoke_entry, {"backend": plan.backend, "result": str(out / "smoke.json")},
                                        spread, plan, env, str(out), timeout_s=30)
            result = json.loads((out / "smoke.json").read_text())
        except Exception as e:  # noqa: BLE001 - a hang or a crash is exactly what this check reports
            return resources, (False, f"all-reduce across {cfg.scaling.num_workers} workers failed: "
                                      f"{type(e).__name__}: "
                                      f"{str(e).strip().splitlines()[-1][:200] if str(e).strip() else ''}")
        ok = result["value"] == result["expected"]
        return resources, (ok, f"{cfg.scaling.num_workers} workers, {plan.backend}: sum {result['value']:g} "
                               f"(expected {result['expected']:g}) in {time.perf_counter() - t0:.1f} s with start-up; "
                               f"nodes {result['nodes']}")


def _smoke_entry(config: dict) -> None:
    import torch
    import torch.distributed as dist

    from scaletrain.comm.context import context_from_ray

    ctx = context_from_ray(config["backend"])
    t = torch.full((1024,), float(ctx.world_rank + 1), device=ctx.device)
    dist.all_reduce(t)
    nodes = [None] * ctx.world_size
    dist.all_gather_object(nodes, ctx.node_id[:8])
    if ctx.is_main:
        Path(config["result"]).write_text(json.dumps({"value": t[0].item(), "nodes": sorted(set(nodes)),
                                                      "expected": ctx.world_size * (ctx.world_size + 1) / 2}))


def run(args: argparse.Namespace) -> int:
    from rich.table import Table

    from scaletrain.config import load_config
    from scaletrain.config.load import literal_secrets
    from scaletrain.console import console
    from scaletrain.launch.doctor import Status, run_checks

    cfg = load_config(args.config, args.overrides) if args.config else None
    facts = gather_facts(cfg, smoke=not args.no_smoke)
    facts.literal_secrets = literal_secrets(args.config) if args.config else []
    results = run_checks(facts)
    table = Table(title="scaletrain doctor")
    for col in ("check", "status", "detail", "fix"):
        table.add_column(col, overflow="fold")
    colors = {Status.OK: "green", Status.WARN: "yellow", Status.FAIL: "red"}
    for r in results:
        table.add_row(r.name, f"[{colors[r.status]}]{r.status.value}[/]", r.detail, r.fix)
    console.print(table)
    failed = [r.name for r in results if r.status is Status.FAIL]
    if failed:
        console.print(f"[red]{len(failed)} check(s) failed[/]: {', '.join(failed)}")
        return 1
    return 0
