"""Collective benchmark with nccl-tests' columns and formulas, so numbers compare with all_reduce_perf.

Formulas (nccl-tests doc/PERFORMANCE.md): algbw = S / t with S the buffer size in bytes (GB/s = 1e9 B/s);
busbw = algbw x factor, where the factor is 2(n-1)/n for all_reduce, (n-1)/n for all_gather,
reduce_scatter and all_to_all (S being the full, gathered buffer), and 1 for broadcast.
The reported time is the average over timed iterations, averaged over ranks (nccl-tests' default -a 1).
"""

from __future__ import annotations

import re
import time
from dataclasses import asdict, dataclass

from scaletrain.errors import ConfigError

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all")
DTYPES = {"float": "float32", "float32": "float32", "half": "float16", "float16": "float16",
          "bfloat16": "bfloat16", "double": "float64", "float64": "float64", "int32": "int32"}
_NCCL_TYPE_NAMES = {"float32": "float", "float16": "half", "bfloat16": "bfloat16", "float64": "double",
                    "int32": "int32"}
_UNITS = {"": 1, "B": 1, "K": 1024, "KB": 1024, "M": 1024**2, "MB": 1024**2, "G": 1024**3, "GB": 1024**3}


def bus_factor(collective: str, n: int) -> float:
    if collective == "all_reduce":
        return 2 * (n - 1) / n
    if collective in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    if collective == "broadcast":
        return 1.0
    raise ConfigError(f"unknown collective '{collective}'; choose from {', '.join(COLLECTIVES)}")


def bandwidths(collective: str, size_bytes: int, time_us: float, n: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s."""
    algbw = size_bytes / (time_us * 1e-6) / 1e9 if time_us > 0 else 0.0
    return algbw, algbw * bus_factor(collective, n)


def parse_size(text: str, flag: str = "-b") -> int:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMG]?B?)\s*", str(text).upper())
    if not m:
        raise ConfigError(f"{flag} {text}: not a size; write bytes like 8, 64K, 128M or 1G")
    return int(float(m.group(1)) * _UNITS[m.group(2)])


def size_range(begin: str, end: str, factor: int) -> list[int]:
    b, e = parse_size(begin, "-b"), parse_size(end, "-e")
    if b <= 0:
        raise ConfigError(f"-b {begin}: the smallest size must be at least 1 byte")
    if b > e:
        raise ConfigError(f"-b {begin} is larger than -e {end}; swap them")
    if factor < 2:
        raise ConfigError(f"-f {factor}: the size factor must be at least 2")
    sizes, s = [], b
    while s <= e:
        sizes.append(s)
        s *= factor
    return sizes


@dataclass(frozen=True)
class BenchParams:
    collectives: tuple[str, ...] = ("all_reduce",)
    sizes: tuple[int, ...] = (8 * 1024**2,)
    dtype: str = "float32"
    warmup_iters: int = 5
    iters: int = 20
    check: bool = True


@dataclass(frozen=True)
class Row:
    collective: str
    size: int
    count: int
    type: str
    redop: str
    root: int
    oop_time_us: float
    oop_algbw: float
    oop_busbw: float
    oop_wrong: int
    ip_time_us: float
    ip_algbw: float
    ip_busbw: float
    ip_wrong: int
    scope: str = "all"  # "all" ranks, "intra"-node or "inter"-node (one rank per node)
    ranks: int = 0

    def to_dict(self) -> dict:
        return asdict(self)


def validate_params(params: BenchParams, world_size: int) -> None:
    for c in params.collectives:
        bus_factor(c, 2)  # unknown names raise
    if world_size < 2:
        raise ConfigError("commbench needs at least 2 workers: a collective over 1 rank moves no data; "
                          "pass -n 2 or more")
    if params.dtype not in DTYPES.values():
        raise ConfigError(f"-d {params.dtype}: choose one of {', '.join(sorted(set(DTYPES)))}")


def run_benchmark(params: BenchParams, rank: int, world: int, device: str, group=None, scope: str = "all") -> list[Row]:
    """Every rank of ``group`` (default: all) calls this; returns rows averaged over the group's ranks."""
    import torch
    import torch.distributed as dist

    dtype = getattr(torch, params.dtype)
    elem = torch.tensor([], dtype=dtype).element_size()
    rows = []
    for coll in params.collectives:
        for size in params.sizes:
            count = max(world, size // elem // world * world)  # divisible by world for the sharded collectives
            oop = _measure(coll, count, dtype, device, rank, world, params, in_place=False, group=group)
            ip = _measure(coll, count, dtype, device, rank, world, params, in_place=True, group=group)
            times = torch.tensor([oop[0], ip[0]], dtype=torch.float64, device=device)
            wrong = torch.tensor([oop[1], ip[1]], dtype=torch.float64, device=device)
            dist.all_reduce(times, group=group)
            dist.all_reduce(wrong, group=group)
            t_oop, t_ip = (times / world).tolist()
            nbytes = count * elem
            a1, b1 = bandwidths(coll, nbytes, t_oop, world)
            a2, b2 = bandwidths(coll, nbytes, t_ip, world)
            rows.append(Row(coll, nbytes, count, _NCCL_TYPE_NAMES[params.dtype],
                            "sum" if coll in ("all_reduce", "reduce_scatter") else "none",
                            0 if coll == "broadcast" else -1, t_oop, a1, b1, int(wrong[0]), t_ip, a2, b2, int(wrong[1]),
                            scope, world))
    return rows


def _measure(coll, count, dtype, device, rank, world, params: BenchParams, in_place: bool,
             group=None) -> tuple[float, int]:
    """(average time per iteration in us, wrong elements) for one collective and size.

    ``rank`` and ``world`` are within ``group``; broadcast's source is the group's first rank."""
    import torch
    import torch.distributed as dist

    src0 = dist.get_global_rank(group, 0) if group is not None else 0

    shard = count // world
    full = torch.empty(count, dtype=dtype, device=device)
    out = torch.empty(count if coll in ("all_gather", "all_to_all") else shard if coll == "reduce_scatter" else count,
                      dtype=dtype, device=device)

    def fill():
        # Small integers: sums stay exact in every dtype, so the check is exact.
        full.copy_((torch.arange(count, device=device) % 7 + rank + 1).to(dtype))

    if coll == "all_reduce":
        op = lambda: dist.all_reduce(full, group=group)
    elif coll == "broadcast":
        op = lambda: dist.broadcast(full, src=src0, group=group)
    elif coll == "all_gather":
        src = full[rank * shard:(rank + 1) * shard] if in_place else full[:shard].clone()
        target = full if in_place else out
        op = lambda: dist.all_gather_into_tensor(target, src, group=group)
    elif coll == "reduce_scatter":
        target = full[rank * shard:(rank + 1) * shard] if in_place else out
        op = lambda: dist.reduce_scatter_tensor(target, full, group=group)
    else:
        op = lambda: dist.all_to_all_single(out, full, group=group)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    fill()
    for _ in range(params.warmup_iters):
        op()
    sync()
    dist.barrier(group=group)
    t0 = time.perf_counter()
    for _ in range(params.iters):
        op()
    sync()
    elapsed_us = (time.perf_counter() - t0) / params.iters * 1e6
    wrong = 0
    if params.check:
        fill()
        if coll == "all_gather" and not in_place:
            src.copy_(full[:shard])
        op()
        sync()
        wrong = _count_wrong(coll, full, out, count, shard, rank, world, dtype, device, in_place)
    return elapsed_us, wrong


def _count_wrong(coll, full, out, count, shard, rank, world, dtype, device, in_place) -> int:
    import torch

    base = torch.arange(count, device=device) % 7
    ranks_sum = world * (world + 1) // 2
    if coll == "all_reduce":
        want, got = base * world + ranks_sum, full
    elif coll == "broadcast":
        want, got = base + 1, full
    elif coll == "reduce_scatter":
        want = (base * world + ranks_sum)[rank * shard:(rank + 1) * shard]
        got = full[rank * shard:(rank + 1) * shard] if in_place else out
    elif coll == "all_gather":  # chunk j comes from rank j's contribution
        idx = torch.arange(count, device=device)
        want = (idx % 7 if in_place else idx % shard % 7) + idx // shard + 1
        got = full if in_place else out
    else:  # all_to_all: chunk j of rank r's output is chunk r of rank j's input
        idx = torch.arange(count, device=device)
        src_rank = idx // shard
        want = (rank * shard + idx % shard) % 7 + src_rank + 1
        got = out
    return int((got.to(torch.float64) != want.to(torch.float64)).sum().item())


def format_time(us: float) -> str:
    """nccl-tests' time column: 2 decimals below 100 us, 1 below 10 ms, none above."""
    if us >= 10000:
        return f"{us:7.0f}"
    if us >= 100:
        return f"{us:7.1f}"
    return f"{us:7.2f}"


def format_table(rows: list[Row], header_note: str = "") -> str:
    lines = [f"# {header_note}"] if header_note else []
    lines += [
        "#                                                              out-of-place                       in-place    "
        "      ",
        "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw "
        "#wrong",
        "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s) "
        "      ",
    ]
    current = None
    for r in rows:
        if (r.collective, r.scope) != current:
            current = (r.collective, r.scope)
            where = {"all": "all ranks", "intra": "inside each node", "inter": "across nodes, one rank per node"}
            lines.append(f"# collective: {r.collective} ({where.get(r.scope, r.scope)}, {r.ranks} ranks)")
        lines.append(f"{r.size:12d}  {r.count:12d}  {r.type:>8s}  {r.redop:>6s}  {r.root:6d}  "
                     f"{format_time(r.oop_time_us)}  {r.oop_algbw:6.2f}  {r.oop_busbw:6.2f}  {r.oop_wrong:5d}  "
                     f"{format_time(r.ip_time_us)}  {r.ip_algbw:6.2f}  {r.ip_busbw:6.2f}  {r.ip_wrong:5d}")
    wrong = sum(r.oop_wrong + r.ip_wrong for r in rows)
    lines.append(f"# Out of bounds values : {wrong} {'OK' if wrong == 0 else 'FAILED'}")
    lines.append(f"# Avg bus bandwidth    : {average_busbw(rows):.3f} ")
    return "\n".join(lines)


def average_busbw(rows: list[Row]) -> float:
    """nccl-tests' closing line: the mean of the in-place and out-of-place busbw over all rows."""
    values = [r.oop_busbw for r in rows] + [r.ip_busbw for r in rows]
    return sum(values) / len(values) if values else 0.0


def parse_nccl_tests(text: str) -> list[dict]:
    """Rows of an nccl-tests / rccl-tests output, for comparing with ours (and checking our formulas)."""
    rows = []
    for ln in text.splitlines():
        toks = ln.split()
        if len(toks) >= 13 and toks[0].isdigit() and toks[1].isdigit():
            rows.append({"size": int(toks[0]), "count": int(toks[1]), "type": toks[2], "redop": toks[3],
                         "root": int(toks[4]), "time_us": float(toks[5]), "algbw": float(toks[6]),
                         "busbw": float(toks[7]), "wrong": toks[8], "ip_time_us": float(toks[9]),
                         "ip_algbw": float(toks[10]), "ip_busbw": float(toks[11])})
    return rows
