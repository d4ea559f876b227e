"""`scaletrain submit CONFIG [k=v ...] --address http://HEAD:8265` (Ray's Job Submission API), or `--emit slurm |
kuberay` (an sbatch script or a KubeRay RayJob manifest); `scaletrain jobs list | status ID | logs ID [--follow] |
stop ID` over the same API."""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
from pathlib import Path

from scaletrain.commands.args import COUNT
from scaletrain.errors import ConfigError


def register(sub: argparse._SubParsersAction, parents) -> None:
    p = sub.add_parser("submit", parents=parents, help="run a training job on a Ray cluster (or write a Slurm / "
                                                       "KubeRay job for it)")
    p.add_argument("config", help="the training config (inside the working directory, which is uploaded)")
    p.add_argument("overrides", nargs="*", help="section.key=value overrides")
    p.add_argument("--address", help="the cluster's dashboard, http://HEAD:8265 (default: RAY_ADDRESS)")
    p.add_argument("--working-dir", default=".", help="uploaded as the job's working_dir (default: here)")
    p.add_argument("--emit", choices=["slurm", "kuberay"], help="write a job for the scheduler instead of submitting")
    p.add_argument("--out", help="--emit: the file to write (default: stdout)")
    p.add_argument("--gpus-per-node", type=COUNT, default=8, help="GPUs per node of the Slurm / KubeRay job written")
    p.add_argument("--cpus-per-node", type=COUNT, help="CPUs per node of the Slurm / KubeRay job written")
    p.add_argument("--gpu-vendor", choices=["nvidia", "amd"], default="nvidia", help="--emit kuberay: the device "
                                                                                     "plugin's GPU resource")
    p.add_argument("--chaos", action="store_true", help="allow fault_tolerance.chaos (it kills workers on purpose)")
    p.add_argument("--image", help="--emit kuberay: the container image with scaletrain installed")
    p.set_defaults(func=run_submit)
    j = sub.add_parser("jobs", parents=parents, help="list, follow and stop jobs on a Ray cluster")
    j.add_argument("action", choices=["list", "status", "logs", "stop"], help="what to do")
    j.add_argument("job_id", nargs="?", help="the job (status, logs, stop)")
    j.add_argument("--address", help="the cluster's dashboard, http://HEAD:8265 (default: RAY_ADDRESS)")
    j.add_argument("--follow", action="store_true", help="logs: keep printing until the job ends")
    j.set_defaults(func=run_jobs)


def _address(args) -> str:
    from scaletrain import envvars

    address = args.address or envvars.read(envvars.RAY_ADDRESS)
    if not address:
        raise ConfigError("give --address http://HEAD:8265 (the Ray dashboard of the cluster) or set RAY_ADDRESS")
    return address


def run_submit(args: argparse.Namespace) -> int:
    from scaletrain.config import load_config
    from scaletrain.console import console
    from scaletrain.launch import submit

    config = Path(args.config)
    cfg = load_config(config, args.overrides)  # a bad config fails here, before anything is sent
    if cfg.fault_tolerance.chaos is not None and not args.chaos:
        raise ConfigError(f"{config}: fault_tolerance.chaos kills workers on purpose (tests and drills); a submitted "
                          f"job runs it only with --chaos, else remove fault_tolerance.chaos")
    if args.emit:
        if args.gpus_per_node < 1:
            raise ConfigError(f"--gpus-per-node {args.gpus_per_node}: must be >= 1")
        sh = submit.shape(cfg, args.gpus_per_node, args.cpus_per_node)
        name = re.sub(r"[^a-z0-9-]+", "-", f"scaletrain-{config.stem}".lower()).strip("-")[:50]
        if args.emit == "slurm":
            text = submit.slurm_script(cfg, str(config), args.overrides, sh, name)
        else:
            text = submit.kuberay_manifest(cfg, config.read_text(), args.overrides, sh, name,
                                           image=args.image or submit.DEFAULT_IMAGE, vendor=args.gpu_vendor)
        if args.out:
            out = Path(args.out)
            if out.exists():
                raise ConfigError(f"--out {out} exists; nothing overwritten: pick another name or remove it")
            out.write_text(text)
            console.print(f"wrote {out} ({args.emit}: {cfg.scaling.num_workers} worker(s) on {sh.nodes} node(s))")
        else:
            sys.stdout.write(text)
        return 0
    from scaletrain.launch.launcher import require_ray

    require_ray("scaletrain submit")  # (--emit above writes a file and needs no Ray)
    job_id = submit.submit(_address(args), config, args.overrides, Path(args.working_dir))
    print(job_id)
    console.print(f"submitted {job_id}; follow it: scaletrain jobs logs {job_id} --follow --address "
                  f"{_address(args)}", soft_wrap=True)
    return 0


def run_jobs(args: argparse.Namespace) -> int:
    from scaletrain.launch.launcher import require_ray

    require_ray("scaletrain jobs")
    from scaletrain.launch import submit

    address = _address(args)
    if args.action == "list":
        for job in submit.list_jobs(address):
            print(f"{job['job_id']}\t{job['status']}\t{job['entrypoint']}")
        return 0
    if not args.job_id:
        raise ConfigError(f"scaletrain jobs {args.action} needs a job id (scaletrain jobs list shows them)")
    if args.action == "status":
        print(submit.status(address, args.job_id))
    elif args.action == "logs":
        if args.follow:
            asyncio.run(submit.follow(address, args.job_id, lambda text: (sys.stdout.write(text), sys.stdout.flush())))
        else:
            sys.stdout.write(submit.logs(address, args.job_id))
    else:
        print(f"{args.job_id}: {'stop requested' if submit.stop(address, args.job_id) else 'not running'}")
    return 0
