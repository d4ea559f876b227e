"""How a length-balanced epoch is dealt to the ranks (worker/sampler.py trains on it; scaling/straggler.py sizes
the wait it leaves): the epoch order is cut into windows of ``BALANCE_WINDOW`` optimizer steps; inside a window
the examples are sorted by length and cut into steps of one global batch (the steps then shuffled), so a step's
examples have similar lengths (less padding); a step's micro-batches go to the ranks longest first, each to the
rank with the fewest tokens so far. Which examples form a step depends on the global batch only, not on the number
of ranks: 1 and N workers train on the same steps (parity), and every rank computes the same assignment from the
seed alone (resume)."""

from __future__ import annotations

import random

BALANCE_WINDOW = 8  # optimizer steps sorted together


def deal(order: list[int], lengths, batch: int, accumulation: int, replicas: int, seed: int,
         epoch: int) -> list[list[int]]:
    """Every rank's examples of the epoch ``order`` (whole steps), in the order it trains on them."""
    per_step = batch * accumulation * replicas
    rng = random.Random(seed * 1_000_003 + epoch)
    steps = []
    for w in range(0, len(order), per_step * BALANCE_WINDOW):
        window = sorted(order[w:w + per_step * BALANCE_WINDOW], key=lambda i: lengths[i], reverse=True)
        chunk = [window[s:s + per_step] for s in range(0, len(window), per_step)]
        rng.shuffle(chunk)
        steps += chunk
    ranks = [[] for _ in range(replicas)]
    for step in steps:
        micro = [step[m:m + batch] for m in range(0, len(step), batch)]
        micro.sort(key=lambda mb: -sum(lengths[i] for i in mb))
        load, given = [0] * replicas, [[] for _ in range(replicas)]
        for mb in micro:  # longest first to the least loaded rank that has room
            r = min((r for r in range(replicas) if len(given[r]) < accumulation), key=lambda r: (load[r], r))
            given[r].append(mb)
            load[r] += sum(lengths[i] for i in mb)
        for r in range(replicas):
            ranks[r] += [i for mb in given[r] for i in mb]
    return ranks
