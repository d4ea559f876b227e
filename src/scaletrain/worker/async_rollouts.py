"""Asynchronous GRPO's rollouts in flight (#74, ``rollout.max_staleness`` = k > 0, TRL's AsyncGRPO name; verl's
one-step-off at k = 1): while step s trains, the separate engine's actors already sample the prompts of steps s + 1
.. s + k, with the weights of step s - 1 (synced before they are sent). Each step then collects what was sent for it
(or, the first step or a step after an epoch's end, samples its own at once), and every completion carries the
version that sampled it: the lag of what trains (the trainer's optimizer steps minus that version) is at most k by
construction; a request older than k (a run resumed onto a different total, an epoch edge) is dropped and sampled
again, counted (``rollout/stale_dropped``). A checkpoint keeps each rank's rollouts in flight (waited for at the
save: ``InFlight.state_dict``), so a run resumed from it trains on the same rollouts as the run that went on; one
resumed onto another world size (whose ranks' rollouts are not the saved ones) samples them again, and says so.

Ordering with the weight syncs: an actor runs one caller's tasks in order, but a sync comes from rank 0 and a rollout
from each rank; every rank collects its own step's rollouts before any sync of that step (``begin`` waits at a
barrier), and an evaluation collects everything in flight first, so a sync never overtakes a rollout sent before it.
With one training rank the sync before the next steps' rollouts is sent without waiting (the same caller sends both,
so the actor loads, then samples, while the step trains); its replies are checked before the next wait.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import torch

from scaletrain.worker.parallel import all_reduce_sum

log = logging.getLogger(__name__)


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

    def state_dict(self, pool) -> dict:
        """What was sent ahead, waited for and kept with the checkpoint (the requests and the tokens sampled for
        them, and the version that sampled them): a run resumed there trains on the same rollouts as the one that
        went on (the weights that sampled them are an optimizer step older than the checkpoint's)."""
        if not self.pending:
            return {}
        self.collect_all(pool)
        return {step: {"version": p.version, "requests": p.requests, "results": p.results}
                for step, p in self.pending.items()}

    def load_state_dict(self, state: dict) -> None:
        self.pending = {int(step): Pending(int(step), p["version"], p["requests"], [], p["results"])
                        for step, p in state.items()}


def lag(trainer_steps: int, version: int) -> int:
    """How many optimizer steps the policy that trains is ahead of the one that sampled."""
    return trainer_steps - version


def ahead_of_time(obj, t, window: list[dict], step: int) -> list[dict]:
    """rollout.max_staleness > 0 (GRPOObjective ``obj``): this step's rollouts, sent ahead at an earlier step
    (or sampled now), collected; then the next steps' prompts sent with the current weights, so the actor samples
    them while this step trains. Each completion carries the version that sampled it."""
    engine, held = obj._engine(t), t.progress.step  # the optimizer steps the training policy holds
    t0 = time.perf_counter()
    pending = obj.inflight.take(step)
    if pending is not None and lag(held, pending.version) > obj.staleness:  # older than the bound: again
        obj._add(t, "stale_dropped", float(sum(len(r["seeds"]) for r in pending.requests)))
        pending.collect(engine)
        pending = None
    if pending is None:
        if step > 1 and not obj.inflight.started:
            log.warning("step %d: rollout.max_staleness=%d: the rollouts that were in flight for this step are "
                        "not in the checkpoint for this rank (it was saved by another world size); they are sampled "
                        "again now, by the current weights, so from here this run is not bit for bit the one "
                        "that was interrupted", step, obj.staleness)
        obj._sync(t)
        pending = _send(obj, t, window, step)
    results = pending.collect(engine)
    obj.inflight.started = True
    obj._add(t, "rollout_s", time.perf_counter() - t0)  # what the trainer waited for: the exposed rollout
    all_reduce_sum([0.0], t.ctx.device)  # every rank holds its rollouts before a sync may reach its actor
    for ahead in range(1, obj.staleness + 1):  # the next steps' prompts, sampled while this step trains
        later = step + ahead
        if later > t.spec.total_steps or later in obj.inflight.pending:
            continue
        upcoming = t.peek(ahead) if t.peek is not None else None
        if upcoming is None:  # the epoch ends first: its first step samples its own
            break
        obj._sync(t, defer=True)  # with one training rank the actor loads while this step trains
        obj.inflight.pending[later] = _send(obj, t, upcoming, later)
    rollouts = [obj._finish(t, req, out, sampled, True) for req, (out, sampled) in zip(pending.requests, results)]
    behind = lag(held, pending.version)
    for r in rollouts:
        r["versions"] = torch.full((r["input_ids"].shape[0],), pending.version, dtype=torch.long)
    obj._add(t, "lag_sum", float(behind * sum(r["input_ids"].shape[0] for r in rollouts)))
    obj._add(t, "lag_n", float(sum(r["input_ids"].shape[0] for r in rollouts)))
    obj.extremes[2] = max(obj.extremes[2], float(behind))
    return rollouts

def _send(obj, t, window: list[dict], step: int) -> Pending:
    engine = obj._engine(t)
    requests = [obj._request(t, batch, step) for batch in window]
    return Pending(step, engine.version, requests,
                   [engine.submit(r["ids"], r["mask"], r["seeds"], **r["how"]) for r in requests])
