"""Run the collective benchmark on Ray Train workers (the same launcher and env handling as `train`)."""

from __future__ import annotations

import json
from pathlib import Path

from scaletrain.comm.bench import BenchParams, Row
from scaletrain.comm.device import Platform
from scaletrain.config.schema import CommConfig, ScalingConfig
from scaletrain.launch import ray_launcher

RESULT_FILE = "rows.json"


def run_commbench(params: BenchParams, workers: int, backend: str, profile: str | None, env: dict[str, str],
                  address: str | None, timeout_s: int, out_dir: Path) -> list[Row]:
    vendor = Platform.detect().vendor
    scaling = ScalingConfig(num_workers=workers, address=address)
    comm = CommConfig(backend=backend, profile=profile, env=env, timeout_s=max(10, timeout_s))
    ray_launcher.prepare_driver_env(vendor)
    started = ray_launcher.ensure_ray(address)
    try:
        plan = ray_launcher.plan_scaling(scaling, comm, ray_launcher.cluster_resources(), vendor)
        out_dir.mkdir(parents=True, exist_ok=True)
        result = out_dir / RESULT_FILE
        result.unlink(missing_ok=True)
        worker_env = ray_launcher.comm_worker_env(comm, vendor, plan.backend, str(out_dir))
        ray_launcher.run_on_workers(_entry, {"params": params, "result": str(result), "backend": plan.backend},
                                    scaling, plan, worker_env, str(out_dir), comm.timeout_s)
        return [Row(**r) for r in json.loads(result.read_text())]
    finally:
        if started:
            import ray

            ray.shutdown()


def _entry(config: dict) -> None:
    from scaletrain.comm.bench import run_benchmark
    from scaletrain.comm.context import context_from_ray

    ctx = context_from_ray(config["backend"])
    rows = run_benchmark(config["params"], ctx.world_rank, ctx.world_size, ctx.device)
    if ctx.is_main:
        Path(config["result"]).write_text(json.dumps([r.to_dict() for r in rows]))
