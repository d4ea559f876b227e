"""`scaletrain topo`: GPU-to-GPU links (XGMI / NVLink / PCIe) and NUMA affinity, with warnings."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction, parents) -> None:
    p = sub.add_parser("topo", parents=parents, help="show GPU link topology and warn about slow pairs")
    p.add_argument("--from-file", metavar="FILE", help="parse saved output of nvidia-smi topo -m, rocm-smi "
                                                       "--showtopo or amd-smi topology instead of probing")
    p.add_argument("--gpus", help="the job's GPUs, e.g. 0,1,4,5 (default: all)")
    p.set_defaults(func=run)


def load(path: str):
    from scaletrain.comm.topo.parsers import parse_amd_smi, parse_nvidia_smi, parse_rocm_smi
    from scaletrain.errors import ConfigError

    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"--from-file {path}: file not found")
    from scaletrain.textfile import read_text

    text = read_text(p, "--from-file")
    if "ROCm System Management Interface" in text or "(Topology) Numa Node" in text:
        return parse_rocm_smi(text)
    if "TABLE:" in text or text.lstrip().startswith(("[", "{")):
        return parse_amd_smi(text)
    if "GPU0" in text:
        return parse_nvidia_smi(text)
    raise ConfigError(f"--from-file {path}: not output of nvidia-smi topo -m, rocm-smi --showtopo or amd-smi topology")


def run(args: argparse.Namespace) -> int:
    from rich.table import Table

    from scaletrain.comm.topo import detect
    from scaletrain.console import console
    from scaletrain.errors import ConfigError

    topo = load(args.from_file) if args.from_file else detect()
    if topo.count == 0:
        console.print(topo.note or "no GPU present", soft_wrap=True)
        return 0
    try:
        gpus = [int(g) for g in args.gpus.split(",")] if args.gpus else None
    except ValueError:
        raise ConfigError(f"--gpus {args.gpus}: give GPU indices like 0,1,2,3") from None
    if gpus and max(gpus) >= topo.count:
        raise ConfigError(f"--gpus {args.gpus}: this node has GPUs 0-{topo.count - 1}")
    rows = topo.matrix()
    table = Table(title=f"GPU topology ({topo.source})")
    for col in rows[0]:
        table.add_column(col)
    for row in rows[1:]:
        table.add_row(*row)
    console.print(table)
    if topo.note:
        console.print(f"note: {topo.note}")
    for w in topo.warnings(gpus):
        console.print(f"[yellow]warning:[/] {w}", soft_wrap=True)
    return 0
