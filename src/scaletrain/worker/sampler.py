"""A distributed sampler that can start mid-epoch, so a resumed run sees the same sample order.

With the examples' lengths it also balances ranks: a rank with longer sequences makes every other rank wait at
the gradient sync. The seeded epoch order is cut into windows of ``BALANCE_WINDOW`` optimizer steps; inside a
window the examples are sorted by length and cut into steps of one global batch (the steps then shuffled), so
a step's examples have similar lengths (less padding); a step's micro-batches go to the ranks longest first,
each to the rank with the fewest tokens so far. Which examples form a step depends on the global batch only,
not on the number of ranks: 1 and N workers still train on the same steps (parity), and every rank computes
the same assignment from the seed alone (resume).
"""

from __future__ import annotations

import random

import torch

BALANCE_WINDOW = 8  # optimizer steps sorted together


class ResumableSampler(torch.utils.data.Sampler[int]):
    """Seeded per-epoch shuffle, split across ranks like ``DistributedSampler(drop_last=True)``.

    ``set_position(epoch, start)`` skips the first ``start`` samples of this rank's epoch order.
    """

    def __init__(self, num_samples: int, num_replicas: int, rank: int, seed: int, lengths: list[int] | None = None,
                 batch_size: int = 1, accumulation: int = 1, group: int = 1, repeat: int = 1):
        self.num_samples, self.num_replicas, self.rank, self.seed = num_samples, num_replicas, rank, seed
        self.lengths, self.batch_size, self.accumulation, self.group = lengths, batch_size, accumulation, group
        self.per_rank = num_samples // num_replicas
        if lengths is not None:  # whole steps only: a step is one global batch
            self.per_rank = num_samples // (batch_size * accumulation * num_replicas) * batch_size * accumulation
        if group > 1:  # whole micro-batches of whole groups
            self.per_rank = num_samples // (batch_size * num_replicas) * batch_size
        self.repeat = repeat
        if repeat > 1:  # whole steps, each repeated (GRPO's rl.num_iterations)
            step = batch_size * accumulation
            self.per_rank = self.per_rank // step * step * repeat
        self.epoch = self.start = 0

    def set_position(self, epoch: int, start: int) -> None:
        self.epoch, self.start = epoch, start

    def epoch_order(self) -> list[int]:
        g = torch.Generator()
        g.manual_seed(self.seed + self.epoch)
        if self.group > 1:
            return self._repeated(self._grouped(g))
        order = torch.randperm(self.num_samples, generator=g).tolist()[: self.per_rank * self.num_replicas]
        if self.lengths is not None:
            return self._balanced(order)
        return order[self.rank:: self.num_replicas]

    def _grouped(self, g: torch.Generator) -> list[int]:
        """Groups of ``group`` consecutive rows (a GRPO prompt's completions) shuffled whole, cut into micro-batches
        dealt to the ranks in turn: a step's micro-batches are the same groups on 1 rank or N (micro-batch k of the
        epoch is rank k mod N's), and a group is never split."""
        groups = torch.randperm(self.num_samples // self.group, generator=g).tolist()
        order = [p * self.group + k for p in groups for k in range(self.group)]
        b = self.batch_size
        micro = [order[m:m + b] for m in range(0, self.per_rank * self.num_replicas, b)]
        return [i for k, mb in enumerate(micro) if k % self.num_replicas == self.rank for i in mb]

    def _repeated(self, mine: list[int]) -> list[int]:
        """This rank's order with each step's window given ``repeat`` times in a row (TRL's RepeatSampler with
        repeat_count = num_iterations): the steps of one generation batch train on the same prompts."""
        if self.repeat == 1:
            return mine
        w = self.batch_size * self.accumulation
        return [i for s in range(0, len(mine) - len(mine) % w, w) for _ in range(self.repeat) for i in mine[s:s + w]]

    def _balanced(self, order: list[int]) -> list[int]:
        b, per_step = self.batch_size, self.batch_size * self.accumulation * self.num_replicas
        rng = random.Random(self.seed * 1_000_003 + self.epoch)
        steps = []
        for w in range(0, len(order), per_step * BALANCE_WINDOW):
            window = sorted(order[w:w + per_step * BALANCE_WINDOW], key=lambda i: self.lengths[i], reverse=True)
            chunk = [window[s:s + per_step] for s in range(0, len(window), per_step)]
            rng.shuffle(chunk)
            steps += chunk
        mine = []
        for step in steps:
            micro = [step[m:m + b] for m in range(0, len(step), b)]
            micro.sort(key=lambda mb: -sum(self.lengths[i] for i in mb))
            load, given = [0] * self.num_replicas, [[] for _ in range(self.num_replicas)]
            for mb in micro:  # longest first to the least loaded rank that has room
                r = min((r for r in range(self.num_replicas) if len(given[r]) < self.accumulation),
                        key=lambda r: (load[r], r))
                given[r].append(mb)
                load[r] += sum(self.lengths[i] for i in mb)
            mine += [i for mb in given[self.rank] for i in mb]
        return mine

    def __iter__(self):
        return iter(self.epoch_order()[self.start:])

    def __len__(self) -> int:
        return max(0, self.per_rank - self.start)
