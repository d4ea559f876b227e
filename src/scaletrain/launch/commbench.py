"""Run the collective benchmark on Ray Train workers (the same launcher and env handling as `train`)."""

from __future__ import annotations

import json
from pathlib import Path

from scaletrain.comm.bench import BenchParams, Row
from scaletrain.comm.device import Platform
from scaletrain.comm.launch_env import worker_env
from scaletrain.config.schema import CommConfig, ScalingConfig
from scaletrain.launch import ray_launcher
from scaletrain.launch.plan import plan_scaling

RESULT_FILE = "rows.json"


def run_commbench(params: BenchParams, workers: int, backend: str, profile: str | None, env: dict[str, str],
                  address: str | None, timeout_s: int, out_dir: Path) -> list[Row]:
    vendor = Platform.detect().vendor
    scaling = ScalingConfig(num_workers=workers, address=address)
    comm = CommConfig(backend=backend, profile=profile, env=env, timeout_s=timeout_s)
    with ray_launcher.ray_session(address) as resources:
        plan = plan_scaling(scaling, comm, resources, vendor)
        out_dir.mkdir(parents=True, exist_ok=True)
        result = out_dir / RESULT_FILE
        result.unlink(missing_ok=True)
        env = worker_env(comm, vendor, plan.backend, str(out_dir))
        ray_launcher.run_on_workers(_entry, {"params": params, "result": str(result), "backend": plan.backend},
                                    scaling, plan, env, str(out_dir), comm.timeout_s)
        return [Row(**r) for r in json.loads(result.read_text())]


def _entry(config: dict) -> None:
    import torch.distributed as dist

    from scaletrain.comm.bench import run_benchmark
    from scaletrain.comm.context import context_from_ray

    ctx = context_from_ray(config["backend"])
    params = config["params"]
    rows = run_benchmark(params, ctx.world_rank, ctx.world_size, ctx.device)
    # When ranks span nodes, also measure inside each node and across nodes (one rank per node).
    nodes = [None] * ctx.world_size
    dist.all_gather_object(nodes, ctx.node_id)
    by_node: dict[str, list[int]] = {}
    for rank, node in enumerate(nodes):
        by_node.setdefault(node, []).append(rank)
    if len(by_node) > 1:
        for scope, members in [("intra", m) for m in by_node.values()] + [("inter", [m[0] for m in by_node.values()])]:
            group = dist.new_group(members)  # every rank creates every group, in the same order
            if ctx.world_rank in members and len(members) > 1:
                part = run_benchmark(params, members.index(ctx.world_rank), len(members), ctx.device, group, scope)
                if ctx.world_rank == members[0] and (scope == "inter" or members[0] == 0):
                    rows += part  # one node's intra numbers stand for all (nodes are alike)
        dist.barrier()
    if ctx.is_main:
        Path(config["result"]).write_text(json.dumps([r.to_dict() for r in rows]))
