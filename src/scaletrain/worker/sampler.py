"""A distributed sampler that can start mid-epoch, so a resumed run sees the same sample order.

With the examples' lengths it also balances ranks: a rank with longer sequences makes every other rank wait at
the gradient sync (data/balance.py deals the seeded epoch order: the same assignment on every rank, 1 and N
workers training on the same steps).
"""

from __future__ import annotations

import torch

from scaletrain.data.balance import deal


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
        return deal(order, self.lengths, self.batch_size, self.accumulation, self.num_replicas, self.seed,
                    self.epoch)[self.rank]

    def __iter__(self):
        return iter(self.epoch_order()[self.start:])

    def __len__(self) -> int:
        return max(0, self.per_rank - self.start)
