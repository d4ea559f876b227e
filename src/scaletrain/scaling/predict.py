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
Step time = compute (per-device batch fixed, so unchanged) + the time lost to scale, each a named term in the
categories a run's own breakdown uses (``LOSSES``):

- ``gather_s`` / ``reduce_s``: the exposed parameter all-gathers and gradient reductions: what cannot overlap (each
  micro-batch's first block gather, which nothing precedes; the last block's reduce-scatter or DDP's last bucket,
  which follows the last compute) plus what exceeds ``overlap`` x compute. FSDP gathers every micro-batch, in
  forward and again in backward unless ``reshard_after_forward`` is false; it reduces once per step (scaletrain,
  FSDP2 without gradient sync in accumulation) or in every micro-batch (``sync_each_micro_batch``: DeepSpeed
  ZeRO-3).
- ``latency_s``: the small collectives of every step (the loss's all-reduce for logging, the gradient norm's for
  clipping), each at the curve's small-message latency (``BusCurve.latency_s``, the 8-byte row of the same
  nccl-tests/rccl-tests output).
- ``contention_s``: compute slows while a collective runs beside it (communication kernels take compute units,
  caches and HBM bandwidth): ``contention`` x the hidden communication time. CONTENTION is the average compute
  slowdown measured with overlapped communication on A100, H100, MI250 and MI210 (arXiv:2507.03114).
- ``straggler_s``: synchronous training waits for the slowest rank: sized from the job's own data lengths under
  its sampler (``straggler_waits``, per world size: scaling/straggler.py), or, given a per-micro-batch compute
  spread ``straggler_cv`` (std / mean, a measured one: it overrides the data's), the expected slowest of n as
  mean x (1 + cv x E[max of n standard normals]). Neither given: none is assumed (0).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from scaletrain.comm.bench import bus_factor
from scaletrain.errors import ConfigError

GB = 1e9
# Compute slowdown while communication overlaps it: 18.9% on average (40.0% at most) over GPT and LLaMA layers on
# 4x A100, H100, MI250 and MI210 ("Characterizing Compute-Communication Overlap in GPU-Accelerated Distributed Deep
# Learning: Performance and Power Implications", arXiv:2507.03114, 2025, abstract).
CONTENTION = 0.189
LOSSES = {"gather_s": "exposed parameter gathers", "reduce_s": "exposed gradient reduction",
          "latency_s": "small collectives' latency", "contention_s": "compute slowed by overlapping communication",
          "straggler_s": "waiting for the slowest rank"}


@dataclass(frozen=True)
class BusCurve:
    points: tuple[tuple[int, float], ...]  # (message bytes, busbw GB/s), sizes ascending
    latency_s: float = 0.0  # the smallest message's time (the 8-byte row): no collective takes less

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
    if n <= 1 or size <= 0:
        return 0.0
    return max(size * bus_factor("all_reduce", n) / (curve.busbw(size) * GB), curve.latency_s)


def allgather_s(size: float, n: int, curve: BusCurve) -> float:
    if n <= 1 or size <= 0:
        return 0.0
    return max(size * bus_factor("all_gather", n) / (curve.busbw(size) * GB), curve.latency_s)


def expected_max_normal(n: int) -> float:
    """E[max of n independent standard normals] (0 for n=1; 0.564 for 2, 1.029 for 4, 1.424 for 8): the integral
    of x n phi(x) Phi(x)^(n-1), by the trapezoid rule on [-9, 9] (written out: scipy is not a dependency)."""
    if n <= 1:
        return 0.0
    steps, lo, hi = 3600, -9.0, 9.0
    h = (hi - lo) / steps
    total = 0.0
    for i in range(steps + 1):
        x = lo + i * h
        f = x * n * math.exp(-x * x / 2) / math.sqrt(2 * math.pi) * (0.5 * (1 + math.erf(x / math.sqrt(2)))) ** (n - 1)
        total += f * (0.5 if i in (0, steps) else 1.0)
    return total * h


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
    reshard_after_forward: bool = True  # FSDP: False keeps forward's gathered parameters for backward (one gather)
    sync_each_micro_batch: bool = False  # FSDP: gradients reduced in every micro-batch (DeepSpeed ZeRO-3)
    contention: float = CONTENTION  # compute slowdown while communication overlaps it
    straggler_cv: float = 0.0  # per-micro-batch compute spread across ranks (std / mean); 0: none assumed
    straggler_waits: tuple[tuple[int, float], ...] = ()  # (world size, seconds per step) from the data's lengths
    small_collectives: int = 2  # per step: the loss's all-reduce (logging) and the gradient norm's (clipping)
    shard_size: int | None = None  # FSDP: shard inside groups of this many ranks, replicate across them (HSDP)
    link_peak_gbs: float = 0.0  # inside a node: a GPU's links' theoretical bandwidth one way, all peers (profiles.py)


@dataclass(frozen=True)
class _Scaled:
    """A curve at a fraction of its bandwidth: a full-mesh node with fewer GPUs than it was measured with."""

    curve: BusCurve
    factor: float

    def busbw(self, size: float) -> float:
        return self.curve.busbw(size) * self.factor

    @property
    def latency_s(self) -> float:
        return self.curve.latency_s


def link_factor(topology: str, ranks: int, gpus_per_node: int) -> float:
    """The share of the node's measured busbw that ``ranks`` GPUs of it get (see the module docstring)."""
    if topology != "full-mesh" or ranks >= gpus_per_node or gpus_per_node < 2:
        return 1.0
    return max(1, ranks - 1) / (gpus_per_node - 1)


def step(inp: Inputs, n: int) -> dict:
    """Predicted step of one device when ``n`` devices train together, with the time lost to each term of
    LOSSES (see the module docstring)."""
    nodes = math.ceil(n / inp.gpus_per_node)
    curve = inp.intra if nodes == 1 else (inp.inter or inp.intra)
    if nodes == 1:
        factor = link_factor(inp.topology, n, inp.gpus_per_node)
        curve = _Scaled(curve, factor) if factor != 1.0 else curve
    if inp.strategy == "ddp":
        full, rest = divmod(inp.grad_bytes, inp.bucket_bytes)
        buckets = [inp.bucket_bytes] * int(full) + ([rest] if rest else [])
        times = [allreduce_s(b, n, curve) for b in buckets]
        gathers, reduces = 0.0, sum(times)
        bus_bytes = inp.grad_bytes * bus_factor("all_reduce", n) if n > 1 else 0.0
        fixed_gather, fixed_reduce = 0.0, (times[-1] if times else 0.0)  # the last bucket follows backward
        budget = inp.overlap * inp.compute_s * 2 / 3  # buckets overlap backward only
    elif inp.strategy == "fsdp":
        layers = max(1, inp.n_layers)
        # HSDP: gathers and reduce-scatters inside a shard group (a node's curve), then the group's gradient shard
        # all-reduced across the replicas (the curve across nodes)
        group = min(n, inp.shard_size or n)
        inner = inp.intra if math.ceil(group / inp.gpus_per_node) == 1 and group < n else curve
        if inner is inp.intra and group < n:
            factor = link_factor(inp.topology, group, inp.gpus_per_node)
            inner = _Scaled(inner, factor) if factor != 1.0 else inner
        replicas = n // group

        def reduce_of(size: float) -> float:
            return allgather_s(size, group, inner) + allreduce_s(size / group, replicas, curve)

        gather_pass = allgather_s(inp.param_bytes / layers, group, inner) * layers  # one block at a time
        passes = inp.micro_batches * (2 if inp.reshard_after_forward else 1)
        syncs = inp.micro_batches if inp.sync_each_micro_batch else 1
        gathers = gather_pass * passes
        reduces = reduce_of(inp.grad_bytes) * syncs  # reduce-scatter moves what all-gather does
        bus_bytes = ((inp.param_bytes * passes + inp.grad_bytes * syncs) * bus_factor("all_gather", group)
                     if group > 1 else 0.0) + (inp.grad_bytes / group * syncs * bus_factor("all_reduce", replicas)
                                               if replicas > 1 else 0.0)
        fixed_gather = gather_pass / layers * inp.micro_batches  # each micro-batch's first block: nothing precedes
        fixed_reduce = reduce_of(inp.grad_bytes / layers) * syncs  # the last block's: nothing follows
        budget = inp.overlap * inp.compute_s
    else:
        raise ConfigError(f"--strategy {inp.strategy}: choose ddp or fsdp")
    movable = max(0.0, gathers - fixed_gather) + max(0.0, reduces - fixed_reduce)
    hidden = min(movable, budget)
    spill = movable - hidden  # what exceeds the compute it could hide behind, split by share
    share = (gathers - fixed_gather) / movable if movable else 0.0
    lost = {"gather_s": fixed_gather + spill * share, "reduce_s": fixed_reduce + spill * (1 - share),
            "latency_s": inp.small_collectives * allreduce_s(8, n, curve),
            "contention_s": inp.contention * hidden,
            "straggler_s": straggler_s(inp, n)}
    step_s = inp.compute_s + sum(lost.values())
    exposed = lost["gather_s"] + lost["reduce_s"] + lost["latency_s"]
    largest = max(LOSSES, key=lost.get) if n > 1 and step_s > inp.compute_s else None
    busbw = bus_bytes / (gathers + reduces) / GB if gathers + reduces > 0 else 0.0  # what the collectives reach
    peak = inp.link_peak_gbs * link_factor(inp.topology, n, inp.gpus_per_node) if nodes == 1 else 0.0
    return {"workers": n, "nodes": nodes, "step_time_s": step_s, "compute_s": inp.compute_s,
            "comm_s": gathers + reduces, "hidden_comm_s": hidden, "exposed_comm_s": exposed,
            "exposed_comm_share": exposed / step_s if step_s else 0.0, **lost,
            "lost_share": 1 - inp.compute_s / step_s if step_s else 0.0, "largest_loss": largest,
            # the two readings of a "communication share": the bus bandwidth the step's collectives reach over the
            # links' theoretical peak (one node: the links n GPUs use), and the step's exposed communication and
            # waiting for the slowest rank
            "busbw_gbs": busbw, "busbw_share": busbw / peak if peak and busbw else None,
            "comm_wait_share": (exposed + lost["straggler_s"]) / step_s if step_s else 0.0}


def straggler_s(inp: Inputs, n: int) -> float:
    """The wait for the slowest rank per step at ``n``: a given spread's (it overrides), else the data's."""
    if inp.straggler_cv:
        return inp.compute_s * inp.straggler_cv * expected_max_normal(n)
    return dict(inp.straggler_waits).get(n, 0.0)


def efficiency(inp: Inputs, n: int) -> float:
    """Throughput per device at ``n`` devices over one device's, both with ``inp``'s batch."""
    return step(inp, 1)["step_time_s"] / step(inp, n)["step_time_s"]


def levers(inp: Inputs, n: int) -> list[dict]:
    """What would buy efficiency at ``n`` devices, each with the setting and its predicted gain (percentage points),
    best first; only those that gain at least half a point."""
    nodes = math.ceil(n / inp.gpus_per_node)
    # twice the micro-batches wait twice where each meets (FSDP); a DDP step's wait, the slowest of sums of twice
    # as many draws, grows about as their spread does (sqrt 2)
    more = 2.0 if inp.strategy == "fsdp" else math.sqrt(2.0)
    options = [("train.gradient_accumulation_steps=" + str(2 * inp.micro_batches),
                "twice the accumulation (a global batch twice as large: retune the learning rate)",
                replace(inp, compute_s=2 * inp.compute_s, micro_batches=2 * inp.micro_batches,
                        straggler_waits=tuple((k, more * w) for k, w in inp.straggler_waits)))]
    if inp.strategy == "fsdp" and inp.reshard_after_forward:
        options.append(("train.fsdp_reshard_after_forward=false", "keep forward's gathered parameters for backward "
                        "(one gather per micro-batch; more memory)", replace(inp, reshard_after_forward=False)))
    if inp.strategy == "fsdp" and nodes > 1 and not inp.shard_size:
        options.append((f"train.fsdp_shard_size={inp.gpus_per_node}", "shard inside a node, replicate across "
                        "nodes (HSDP: only gradients cross the network)", replace(inp, shard_size=inp.gpus_per_node)))
    now = efficiency(inp, n)
    out = [{"setting": key, "what": what, "efficiency": efficiency(alt, n), "gain": efficiency(alt, n) - now}
           for key, what, alt in options]
    return sorted((o for o in out if o["gain"] >= 0.005), key=lambda o: -o["gain"])


def table(inp: Inputs, sizes: list[int]) -> list[dict]:
    rows = []
    base = step(inp, 1)["step_time_s"]
    for n in sizes:
        r = step(inp, n)
        r["speedup"] = n * base / r["step_time_s"]
        r["efficiency"] = r["speedup"] / n
        if inp.samples_per_step_per_device:
            r["samples_per_s"] = n * inp.samples_per_step_per_device / r["step_time_s"]
        r["levers"] = levers(inp, n) if n > 1 else []
        r["note"] = "predicted"
        rows.append(r)
    return rows
