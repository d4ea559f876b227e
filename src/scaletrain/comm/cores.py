"""Which cores a CPU worker's threads run on: each worker of a node its own block of the node's cores.

Two workers that fill the cores of a node run their training threads beside their own helper threads (gloo's
all-reduce, the heartbeat, the system sampler, a Ray actor's runtime threads) and the node's other processes.
Left to the OS, each worker's helper threads wake on whichever core is free at the moment, which is often the
other worker's: on 2 cores (MiniLM, 2 workers) a training thread is preempted 190-440 times a second and gloo's
threads move between cores ~20 times a second. Bound, each worker's threads share its own core(s) and the steps
get shorter: 3.9% (torchrun) and 2.7% (Ray) within one run, alternating bound and unbound every 6 s
(benchmarks/overhead.py, benchmarks/RESULTS.md "overhead").

Written here rather than taken from a library: torchrun's NUMA binding places GPU processes near their device
and says nothing of CPU workers, Ray binds no worker to a core, and psutil/os only offer the system call. A GPU
worker is not bound (its host threads mostly wait for the device; binding them near the GPU is NUMA placement,
not this). A node shared with other jobs (a Ray cluster joined by address, or `scaletrain up`'s) is not bound
either: another job's workers would be bound to the same blocks.
"""

from __future__ import annotations

import os
from collections.abc import Sequence


def core_block(cores: Sequence[int], local_rank: int, local_world_size: int, threads: int) -> tuple[int, ...] | None:
    """The cores of the ``local_rank``-th of ``local_world_size`` workers on a node whose usable cores are
    ``cores``: consecutive blocks of ``threads`` cores (fewer when they would not all fit), in core order, so
    neighbours share caches. None when the node has fewer cores than workers (a block each is impossible)."""
    ordered = sorted(cores)
    per = min(max(1, threads), len(ordered) // max(1, local_world_size))
    if per < 1 or local_rank >= local_world_size:
        return None
    return tuple(ordered[local_rank * per:(local_rank + 1) * per])


def usable_cores() -> list[int]:
    """The cores this process may run on (a container's or a cgroup's share, not the machine's count)."""
    return sorted(os.sched_getaffinity(0))


def bind_process(block: Sequence[int]) -> int:
    """Bind every thread of this process to ``block`` (threads started later inherit it from their starter);
    the number of threads bound. Each thread separately: the system call binds one thread, and a Ray worker runs
    the training in a thread of its own beside the runtime's."""
    bound = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), block)
            bound += 1
        except (ProcessLookupError, PermissionError):  # a thread that ended meanwhile; one not ours to move
            continue
    return bound


def describe(blocks: Sequence[Sequence[int]]) -> str:
    """``worker 0: core 0, worker 1: core 1`` or ``worker 0: cores 0-3, ...`` (the start line's words)."""
    def span(block: Sequence[int]) -> str:
        return f"core {block[0]}" if len(block) == 1 else f"cores {block[0]}-{block[-1]}"
    return ", ".join(f"worker {i}: {span(b)}" for i, b in enumerate(blocks))


def binding_note(cores: Sequence[int], workers: int, threads: int) -> str | None:
    """The driver's start line for ``workers`` CPU workers on a node with ``cores``; None when none is bound."""
    blocks = [core_block(cores, r, workers, threads) for r in range(workers)]
    if workers < 2 or any(b is None for b in blocks):
        return None
    return (f"each worker's threads bound to its own core(s) of this node ({describe(blocks)}): shorter, steadier "
            f"steps than the OS's placement (comm/cores.py); scaling.bind_cores=false leaves them to the OS")
