"""Ranks started once for a module and reused by its tests (torch's ``MultiProcContinuousTest`` keeps its ranks for
a whole test class the same way), where a test needs real processes and a real gloo process group but no launcher:
``torch.multiprocessing.spawn`` starts a fresh interpreter per rank per test (~5 CPU-seconds of imports each on
this machine); these start once and run each test's function in turn.

``Ranks(n).run(fn, world, *args)`` calls ``fn(rank, *args)`` on ranks 0..world-1 at once, as ``mp.spawn(fn, args,
nprocs=world)`` does, and raises with a rank's traceback if one failed; a process group the function left open is
destroyed after it. The ranks are spawned (not forked: the test process has run OpenMP regions, after which a
forked child hangs in its first parallel one), so each is a fresh interpreter, as under mp.spawn.
"""

from __future__ import annotations

import traceback


def _serve(rank: int, conn) -> None:
    import torch.distributed as dist

    while True:
        job = conn.recv()
        if job is None:
            return
        fn, args = job
        try:
            fn(rank, *args)
            conn.send(None)
        except BaseException:  # noqa: BLE001 - sent to the test, which raises it
            conn.send(f"rank {rank}: {traceback.format_exc()}")
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()


class Ranks:
    def __init__(self, n: int):
        import torch.multiprocessing as mp

        ctx = mp.get_context("spawn")
        self.conns, self.procs = [], []
        for rank in range(n):
            here, there = ctx.Pipe()
            proc = ctx.Process(target=_serve, args=(rank, there), daemon=True, name=f"rank-{rank}")
            proc.start()
            self.conns.append(here)
            self.procs.append(proc)

    def run(self, fn, world: int, *args) -> None:
        assert world <= len(self.procs), f"{world} ranks asked of a pool of {len(self.procs)}"
        for conn in self.conns[:world]:
            conn.send((fn, args))
        errors = []
        for rank, conn in enumerate(self.conns[:world]):
            try:
                if (error := conn.recv()) is not None:
                    errors.append(error)
            except EOFError:
                errors.append(f"rank {rank}: its process died (exit code {self.procs[rank].exitcode})")
        if errors:
            raise AssertionError("\n".join(errors))

    def close(self) -> None:
        for conn, proc in zip(self.conns, self.procs):
            try:
                conn.send(None)
            except OSError:
                pass
            proc.join(10)
            if proc.is_alive():
                proc.kill()
