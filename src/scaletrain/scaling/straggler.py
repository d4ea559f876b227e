"""Waiting for the slowest rank, sized from the job's own data lengths.

Synchronous data-parallel training waits at every collective for the rank that reaches it last. Under FSDP and
ZeRO-3 every block's parameter all-gather is a collective, so every micro-batch waits for the slowest rank's
micro-batch; under DDP the ranks meet once a step, at the gradient all-reduce (the other micro-batches run under
``no_sync``), so a step waits for the slowest rank's whole step. Each rank's micro-batch is its own draw of the
data: with per-batch padding its compute follows its longest row, so the wait grows with the number of ranks.

A micro-batch's compute is split in two: a part that does not depend on its rows (the same on every rank: it never
makes one wait) and its FLOPs at its padded length (tokens x the model's linear FLOPs per token, plus attention's,
which grows with the length) at the device's achieved rate (peak x metrics/flops.py's ASSUMED_MFU). The wait per
step is the expected slowest-of-N FLOPs over the mean FLOPs, at that rate, for each micro-batch (or step) of the step:

- ``random`` (a shuffled sampler, each micro-batch padded to its longest row: LLaMA-Factory's, TRL's, HF Trainer's):
  the micro-batches of an epoch are simulated from the lengths (seeded shuffles), and the expected maximum of N
  independent draws from their costs is exact over that distribution: E[max] = sum_i c_(i) ((i/M)^N - ((i-1)/M)^N)
  over the M sorted costs c_(1) <= ... <= c_(M);
- ``balanced`` (scaletrain's length-balanced sampler, ``data.balance_ranks``): the sampler's own dealing
  (data/balance.py) deals N ranks their micro-batches over a simulated epoch, and the wait is measured on that
  assignment (mean over the epoch of the slowest rank's cost less the mean rank's);
- ``packed`` (``data.packing``: rows concatenated up to the sequence length): every micro-batch holds about the
  same tokens; the packs are simulated (rows in shuffled order, a pack closed when the next row does not fit) and
  attention is per row, so what differs between packs is their rows' squared lengths and their fill.
"""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass

SIMULATED_EPOCHS = 20  # shuffles of the data the random sampler's micro-batch costs are drawn from
MAX_ROWS = 20_000  # a larger data set is sized from a seeded sample of its lengths (the distribution is kept)


@dataclass(frozen=True)
class Work:
    """What a micro-batch costs on one device, from the model's shape and the device's achieved rate."""

    linear_flops_per_token: float  # the dense layers' training FLOPs per token (metrics/flops.py without attention)
    attention_flops_per_token: float  # x the row's length: 12 x layers x hidden (forward and backward)
    flops_per_s: float  # one device's achieved FLOP/s: its peak x ASSUMED_MFU

    def row_flops(self, length: int) -> float:
        return length * (self.linear_flops_per_token + self.attention_flops_per_token * length)

    def padded_s(self, lengths: list[int]) -> float:
        """A micro-batch padded to its longest row."""
        return len(lengths) * self.row_flops(max(lengths)) / self.flops_per_s

    def packed_s(self, lengths: list[int]) -> float:
        """A pack of rows (no padding between them), attention within each row."""
        attention = sum(n * n for n in lengths) * self.attention_flops_per_token
        return (sum(lengths) * self.linear_flops_per_token + attention) / self.flops_per_s


@dataclass(frozen=True)
class Wait:
    """The slowest-rank wait at one world size, per optimizer step."""

    workers: int
    wait_s: float  # per step: the slowest rank's compute less the mean rank's, summed over the step's syncs
    mean_s: float  # per step: the mean rank's length-dependent compute (its FLOPs at the achieved rate)
    spread: float  # the per-sync compute spread across draws (std / mean)
    rank_spread: float = 0.0  # the expected std / mean of the N ranks' step compute: what ranks/ready_s measures


def expected_max(values: list[float], n: int) -> float:
    """E[max of n independent draws] from the empirical distribution of ``values`` (exact, see the docstring)."""
    c = sorted(values)
    m = len(c)
    if n <= 1:
        return sum(c) / m
    return sum(v * (((i + 1) / m) ** n - (i / m) ** n) for i, v in enumerate(c))


def rank_spread(step_costs: list[float], n: int, seed: int = 0, draws: int = 4000) -> float:
    """The expected std / mean across ``n`` ranks of their step costs, each rank drawing its own step (seeded)."""
    if n <= 1 or not step_costs:
        return 0.0
    rng = random.Random(seed)
    total = 0.0
    for _ in range(draws):
        c = [rng.choice(step_costs) for _ in range(n)]
        total += statistics.pstdev(c) / statistics.fmean(c)
    return total / draws


def _shuffled(count: int, seed: int, epoch: int) -> list[int]:
    order = list(range(count))
    random.Random(seed * 1_000_003 + epoch).shuffle(order)
    return order


def _random_costs(lengths: list[int], batch: int, accumulation: int, work: Work, per_step: bool,
                  seed: int) -> list[float]:
    """The costs of the micro-batches (``per_step``: of the steps) a shuffled, padded sampler gives."""
    costs = []
    for epoch in range(SIMULATED_EPOCHS):
        order = _shuffled(len(lengths), seed, epoch)
        micro = [work.padded_s([lengths[i] for i in order[s:s + batch]])
                 for s in range(0, len(order) - batch + 1, batch)]
        if per_step:
            micro = [sum(micro[s:s + accumulation]) for s in range(0, len(micro) - accumulation + 1, accumulation)]
        costs += micro
    return costs


def _packs(lengths: list[int], width: int, seed: int, epoch: int) -> list[list[int]]:
    packs, current, used = [], [], 0
    for i in _shuffled(len(lengths), seed, epoch):
        n = min(lengths[i], width)
        if current and used + n > width:
            packs.append(current)
            current, used = [], 0
        current.append(n)
        used += n
    return packs + ([current] if current else [])


def _packed_costs(lengths: list[int], batch: int, accumulation: int, width: int, work: Work, per_step: bool,
                  seed: int) -> list[float]:
    costs = []
    for epoch in range(SIMULATED_EPOCHS):
        packs = _packs(lengths, width, seed, epoch)
        micro = [sum(work.packed_s(p) for p in packs[s:s + batch])
                 for s in range(0, len(packs) - batch + 1, batch)]
        if per_step:
            micro = [sum(micro[s:s + accumulation]) for s in range(0, len(micro) - accumulation + 1, accumulation)]
        costs += micro
    return costs


def _balanced_wait(lengths: list[int], batch: int, accumulation: int, n: int, work: Work, per_step: bool,
                   seed: int) -> tuple[float, float, float, float]:
    """(the mean slowest rank's cost less the mean rank's, the mean rank's, the costs' spread) per sync, and the
    ranks' step spread, from the sampler's own assignment (data/balance.py) of N ranks over simulated epochs."""
    from scaletrain.data.balance import deal

    per_rank = len(lengths) // (batch * accumulation * n) * batch * accumulation
    waits, means, every, rank_spreads = [], [], [], []
    for epoch in range(max(1, SIMULATED_EPOCHS // 4)):  # each epoch deals every example: fewer are needed
        ranks, steps = [], []
        for order in deal(_shuffled(len(lengths), seed, epoch)[:per_rank * n], lengths, batch, accumulation, n,
                          seed, epoch):
            micro = [work.padded_s([lengths[i] for i in order[m:m + batch]]) for m in range(0, len(order), batch)]
            steps.append([sum(micro[m:m + accumulation]) for m in range(0, len(micro), accumulation)])
            ranks.append(steps[-1] if per_step else micro)
        for costs in zip(*ranks):
            waits.append(max(costs) - statistics.fmean(costs))
            means.append(statistics.fmean(costs))
            every += costs
        rank_spreads += [statistics.pstdev(c) / statistics.fmean(c) for c in zip(*steps)]
    if not means:
        raise ValueError(f"{len(lengths)} examples make no step of {batch} x {accumulation} x {n}")
    return (statistics.fmean(waits), statistics.fmean(means), statistics.pstdev(every) / statistics.fmean(every),
            statistics.fmean(rank_spreads))


def waits(lengths: list[int], work: Work, sizes: list[int], batch: int, accumulation: int, sampler: str = "random",
          sync: str = "micro", width: int | None = None, seed: int = 0) -> dict[int, Wait]:
    """The slowest-rank wait per step at each world size of ``sizes`` (see the module docstring). ``sync``:
    "micro" (FSDP, ZeRO-3: every micro-batch meets) or "step" (DDP: once a step); ``width``: packed rows' width."""
    if not lengths:
        raise ValueError("no lengths to size the wait from")
    if batch < 1 or accumulation < 1:
        raise ValueError("batch and accumulation must be >= 1")
    if sampler not in ("random", "balanced", "packed"):
        raise ValueError(f"sampler {sampler}: choose random, balanced or packed")
    if len(lengths) > MAX_ROWS:
        lengths = random.Random(seed).sample(list(lengths), MAX_ROWS)
    lengths = [int(n) for n in lengths]
    per_step = sync == "step"
    syncs = 1 if per_step else accumulation
    out = {}
    if sampler == "balanced":
        for n in sizes:
            wait, mean, spread, ranks = _balanced_wait(lengths, batch, accumulation, n, work, per_step, seed)
            out[n] = Wait(n, syncs * wait if n > 1 else 0.0, syncs * mean, spread, ranks if n > 1 else 0.0)
        return out
    if sampler == "packed":
        if not width:
            raise ValueError("packed: give the packs' width (data.max_length)")
        costs = _packed_costs(lengths, batch, accumulation, width, work, per_step, seed)
        steps = costs if per_step else _packed_costs(lengths, batch, accumulation, width, work, True, seed)
    else:
        costs = _random_costs(lengths, batch, accumulation, work, per_step, seed)
        steps = costs if per_step else _random_costs(lengths, batch, accumulation, work, True, seed)
    if not costs:
        raise ValueError(f"{len(lengths)} examples make no micro-batch of {batch}")
    mean = statistics.fmean(costs)
    spread = statistics.pstdev(costs) / mean if mean else 0.0
    for n in sizes:
        out[n] = Wait(n, syncs * (expected_max(costs, n) - mean) if n > 1 else 0.0, syncs * mean, spread,
                      rank_spread(steps, n, seed))
    return out
