"""`scaletrain predict`: step time and scaling efficiency for N devices over M nodes, from measured inputs.

Collective times come from bus-bandwidth curves (nccl-tests' busbw by message size, interpolated on a
log-size scale): an all-reduce of S bytes over n ranks takes S * 2(n-1)/n / busbw(S); an all-gather or
reduce-scatter of a full buffer S takes S * (n-1)/n / busbw(S). The curve already holds the latency
(small messages reach a low busbw). One curve is used inside a node, another for jobs spanning nodes.

Inside a node the busbw also depends on how many GPUs take part. Behind a switch (NVSwitch) every GPU keeps
its full bandwidth: the curve holds for any count. In a full mesh (MI300X: every GPU pair has its own xGMI
link) a GPU reaches its peers over one link each, so n GPUs use n-1 links: the curve, measured with all
``gpus_per_node`` GPUs, is scaled by (n-1)/(gpus_per_node-1) (rccl-tests on 8 MI300X: ~313 GB/s busbw at
1 GiB; 2 GPUs get one link, ~45-48 GB/s).

DDP: gradients are all-reduced in buckets (``bucket_mb``, torch's default 25) while backward runs; all
buckets but the last can hide behind ``overlap`` x backward time (backward ~ 2/3 of compute).
FSDP/ZeRO-3: parameters are all-gathered in forward and again in backward, gradients reduce-scattered;
prefetching can hide them behind ``overlap`` x compute except the first gather.
Step time = compute (per-device batch fixed, so unchanged) + exposed communication.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from scaletrain.comm.bench import bus_factor
from scaletrain.errors import ConfigError

GB = 1e9


@dataclass(frozen=True)
class BusCurve:
    points: tuple[tuple[int, float], ...]  # (message bytes, busbw GB/s), sizes ascending

    def busbw(self, size: float) -> float:
        pts = self.points
        if size <= pts[0][0]:
            return pts[0][1]
        if size >= pts[-1][0]:
            return pts[-1][1]
        for (s0, b0), (s1, b1) in zip(pts, pts[1:]):
            if s0 <= size <= s1:
                w = (math.log(size) - math.log(s0)) / (math.log(s1) - math.log(s0))
                return b0 + w * (b1 - b0)
        raise AssertionError("unreachable")

    @classmethod
    def from_rows(cls, rows: list[dict]) -> "BusCurve":
        """From commbench JSON rows (all_reduce): busbw of the out-of-place and in-place runs, averaged."""
        pts = sorted({r["size"]: (r["oop_busbw"] + r["ip_busbw"]) / 2 for r in rows
                      if r.get("collective", "all_reduce") == "all_reduce"}.items())
        if not pts:
            raise ConfigError("the commbench results hold no all_reduce rows; run commbench -c all_reduce")
        return cls(tuple(pts))


# Named hardware profiles (curves with their sources) live in profiles.py.


def allreduce_s(size: float, n: int, curve: BusCurve) -> float:
    return 0.0 if n <= 1 or size <= 0 else size * bus_factor("all_reduce", n) / (curve.busbw(size) * GB)


def allgather_s(size: float, n: int, curve: BusCurve) -> float:
    return 0.0 if n <= 1 or size <= 0 else size * bus_factor("all_gather", n) / (curve.busbw(size) * GB)


@dataclass(frozen=True)
class Inputs:
    compute_s: float  # one device's step time without communication (forward + backward + optimizer)
    grad_bytes: float  # gradient bytes all-reduced (DDP) / reduce-scattered (FSDP) per step
    intra: BusCurve
    inter: BusCurve | None = None
    gpus_per_node: int = 8
    bucket_bytes: float = 25 * 1024**2
    overlap: float = 0.8  # fraction of backward (DDP) / compute (FSDP) that communication can hide behind
    strategy: str = "ddp"
    param_bytes: float = 0.0  # FSDP: parameter bytes all-gathered twice per step
    n_layers: int = 32  # FSDP: the first layer's all-gather cannot be prefetched
    samples_per_step_per_device: float | None = None
    topology: str = "switch"  # inside a node: "switch" (full bandwidth for any GPU count) or "full-mesh"
    micro_batches: int = 1  # FSDP/ZeRO-3 gathers the parameters again in every micro-batch's forward and backward


@dataclass(frozen=True)
class _Scaled:
    """A curve at a fraction of its bandwidth: a full-mesh node with fewer GPUs than it was measured with."""

    curve: BusCurve
    factor: float

    def busbw(self, size: float) -> float:
        return self.curve.busbw(size) * self.factor


def link_factor(topology: str, ranks: int, gpus_per_node: int) -> float:
    """The share of the node's measured busbw that ``ranks`` GPUs of it get (see the module docstring)."""
    if topology != "full-mesh" or ranks >= gpus_per_node or gpus_per_node < 2:
        return 1.0
    return max(1, ranks - 1) / (gpus_per_node - 1)


def step(inp: Inputs, n: int) -> dict:
    """Predicted step of one device when ``n`` devices train together."""
    nodes = math.ceil(n / inp.gpus_per_node)
    curve = inp.intra if nodes == 1 else (inp.inter or inp.intra)
    if nodes == 1:
        factor = link_factor(inp.topology, n, inp.gpus_per_node)
        curve = _Scaled(curve, factor) if factor != 1.0 else curve
    if inp.strategy == "ddp":
        full, rest = divmod(inp.grad_bytes, inp.bucket_bytes)
        buckets = [inp.bucket_bytes] * int(full) + ([rest] if rest else [])
        times = [allreduce_s(b, n, curve) for b in buckets]
        total = sum(times)
        hideable = total - (times[-1] if times else 0.0)  # the last bucket finishes after backward
        hidden = min(hideable, inp.overlap * inp.compute_s * 2 / 3)
    elif inp.strategy == "fsdp":
        # one block at a time: each all-gather moves one block's parameters
        per_layer = inp.param_bytes / max(1, inp.n_layers)
        gather = allgather_s(per_layer, n, curve) * inp.n_layers
        reduce = allgather_s(inp.grad_bytes, n, curve)  # reduce-scatter moves the same bytes as all-gather
        total = 2 * gather * inp.micro_batches + reduce
        first_layer = gather / max(1, inp.n_layers)
        hidden = min(total - first_layer, inp.overlap * inp.compute_s)
    else:
        raise ConfigError(f"--strategy {inp.strategy}: choose ddp or fsdp")
    exposed = max(0.0, total - hidden)
    step_s = inp.compute_s + exposed
    return {"workers": n, "nodes": nodes, "step_time_s": step_s, "comm_s": total, "exposed_comm_s": exposed,
            "exposed_comm_share": exposed / step_s if step_s else 0.0}


def table(inp: Inputs, sizes: list[int]) -> list[dict]:
    rows = []
    base = step(inp, 1)["step_time_s"]
    for n in sizes:
        r = step(inp, n)
        r["speedup"] = n * base / r["step_time_s"]
        r["efficiency"] = r["speedup"] / n
        if inp.samples_per_step_per_device:
            r["samples_per_s"] = n * inp.samples_per_step_per_device / r["step_time_s"]
        r["note"] = "predicted"
        rows.append(r)
    return rows
