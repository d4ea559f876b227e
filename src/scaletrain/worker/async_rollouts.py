"""Asynchronous GRPO's rollouts in flight (#74, ``rollout.max_staleness`` = k > 0, TRL's AsyncGRPO name; verl's
one-step-off at k = 1): while step s trains, the separate engine's actors already sample the prompts of steps s + 1
.. s + k, with the weights of step s - 1 (synced before they are sent). Each step then collects what was sent for it
(or, the first step, a step after an epoch's end or a resume, samples its own at once), and every completion
carries the version that sampled it: the lag of what trains (the trainer's optimizer steps minus that version) is at
most k by construction; a request older than k (a run resumed onto a different total, an epoch edge) is dropped and
sampled again, counted (``rollout/stale_dropped``).

Ordering with the weight syncs: an actor runs one caller's tasks in order, but a sync comes from rank 0 and a rollout
from each rank; every rank collects its own step's rollouts before any sync of that step (``begin`` waits at a
barrier), and an evaluation collects everything in flight first, so a sync never overtakes a rollout sent before it.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Pending:
    """One step's rollout requests, sent to this rank's actor: each micro-batch's request and its reference."""

    step: int
    version: int
    requests: list[dict]
    submitted: list[tuple]
    results: list | None = None

    def collect(self, pool) -> list:
        if self.results is None:
            self.results = [pool.collect(s) for s in self.submitted]
        return self.results


@dataclass
class InFlight:
    """The steps whose rollouts were sent ahead, by step."""

    pending: dict[int, Pending] = field(default_factory=dict)
    started: bool = False  # this process has sent or collected a step's rollouts

    def take(self, step: int) -> Pending | None:
        return self.pending.pop(step, None)

    def collect_all(self, pool) -> None:
        """Everything sent waited for (an evaluation's sync may follow: it must not overtake them)."""
        for p in self.pending.values():
            p.collect(pool)


def lag(trainer_steps: int, version: int) -> int:
    """How many optimizer steps the policy that trains is ahead of the one that sampled."""
    return trainer_steps - version
