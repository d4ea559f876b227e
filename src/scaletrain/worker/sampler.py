"""A distributed sampler that can start mid-epoch, so a resumed run sees the same sample order."""

from __future__ import annotations

import torch


class ResumableSampler(torch.utils.data.Sampler[int]):
    """Seeded per-epoch shuffle, split across ranks like ``DistributedSampler(drop_last=True)``.

    ``set_position(epoch, start)`` skips the first ``start`` samples of this rank's epoch order.
    """

    def __init__(self, num_samples: int, num_replicas: int, rank: int, seed: int):
        self.num_samples, self.num_replicas, self.rank, self.seed = num_samples, num_replicas, rank, seed
        self.per_rank = num_samples // num_replicas
        self.epoch = self.start = 0

    def set_position(self, epoch: int, start: int) -> None:
        self.epoch, self.start = epoch, start

    def epoch_order(self) -> list[int]:
        g = torch.Generator()
        g.manual_seed(self.seed + self.epoch)
        order = torch.randperm(self.num_samples, generator=g).tolist()[: self.per_rank * self.num_replicas]
        return order[self.rank:: self.num_replicas]

    def __iter__(self):
        return iter(self.epoch_order()[self.start:])

    def __len__(self) -> int:
        return max(0, self.per_rank - self.start)
