"""The per-worker system sampler: a daemon thread writing one ``system`` record every ``monitor.interval_s``.

Process CPU %, RSS and host memory from psutil; GPU utilisation, memory, power and temperature from
amdsmi/pynvml; torch's allocator counters on GPUs. On CPU-only workers GPU fields are absent, not zero.
"""

from __future__ import annotations

import threading
import time

import psutil

from scaletrain.metrics.records import GIB, JsonlSink


class SystemSampler:
    def __init__(self, sink: JsonlSink, rank: int, device: str, interval_s: float, gpu_reader=None):
        self.sink, self.rank, self.device, self.interval_s = sink, rank, device, interval_s
        self.gpu = gpu_reader
        self.proc = psutil.Process()
        self.unwritable = False  # the sink failed to write (a full disk): said once
        self.proc.cpu_percent(None)  # prime: the first reading is relative to this call
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="scaletrain-sampler", daemon=True)
        self.samples = 0
        self.busy_s = 0.0  # time spent sampling, to report the sampler's own cost

    def start(self) -> "SystemSampler":
        self._thread.start()
        return self

    def sample(self, cpu: bool = True) -> dict[str, float]:
        """The readings now; ``cpu=False`` leaves out the CPU share, which psutil measures since its previous
        call: only this sampler's thread may take it, or a second caller's reading covers a window of a few
        microseconds (0%) and shortens the thread's."""
        out = {"memory/rss_gib": self.proc.memory_info().rss / GIB,
               "memory/host_used_pct": psutil.virtual_memory().percent}
        if cpu:  # psutil's reading over a short window can overshoot; a process cannot use more than every core
            out["system/cpu_pct"] = min(self.proc.cpu_percent(None), 100.0 * (psutil.cpu_count() or 1))
        if self.device.startswith("cuda"):
            import torch

            out["memory/allocated_gib"] = torch.cuda.memory_allocated() / GIB
            out["memory/reserved_gib"] = torch.cuda.memory_reserved() / GIB
            out["memory/peak_gib"] = torch.cuda.max_memory_allocated() / GIB
        if self.gpu is not None:
            out.update(self.gpu.sample())
        return out

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            t0 = time.perf_counter()
            record = {"kind": "system", "rank": self.rank, "time": time.time(), **self.sample()}
            try:
                self.sink.write(record)
            except OSError as e:  # a full disk: one line, never a thread's traceback on the user's console
                if not self.unwritable:
                    import sys

                    sys.stderr.write(f"warning: system metrics of rank {self.rank} cannot be written "
                                     f"({e.strerror or e}); they are lost until there is space\n")
                self.unwritable = True
                continue
            self.samples += 1
            self.busy_s += time.perf_counter() - t0

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


class CpuShare:
    """A process's CPU use over a window of its own, in percent of one core: the CPU seconds of every thread
    (``time.process_time``) over the wall seconds since ``start``. Unlike psutil's ``cpu_percent(None)`` it keeps
    no state shared with another reader, so a sampler thread cannot shorten its window."""

    def __init__(self):
        self.start()

    def start(self) -> None:
        self.cpu0, self.wall0 = time.process_time(), time.perf_counter()

    def pct(self) -> float:
        wall = time.perf_counter() - self.wall0
        return 100.0 * (time.process_time() - self.cpu0) / wall if wall > 0 else 0.0


class TreeMemory:
    """The driver's whole process tree (itself and every descendant: an embedded Ray's GCS, raylet, dashboard
    agents, workers; a torchrun agent and its workers, forked by a fork server or not): the peak of its summed
    resident set, sampled by the driver's monitor. Resident sets count shared pages in each process, as `ps` and
    LLaMA-Factory comparisons do; it is the figure that must fit the host."""

    def __init__(self, proc: psutil.Process | None = None):
        self.proc = proc or psutil.Process()
        self.peak_bytes, self.peak_processes, self.samples = 0, 0, 0

    def sample(self) -> int:
        total, count = 0, 0
        for p in self.processes():
            try:
                total += p.memory_info().rss
                count += 1
            except (psutil.NoSuchProcess, psutil.AccessDenied):  # it ended between the listing and the reading
                continue
        if total > self.peak_bytes:
            self.peak_bytes, self.peak_processes = total, count
        self.samples += 1
        return total

    def processes(self) -> list[psutil.Process]:
        """The driver and its descendants, and for each process a fork server forked for one of them (a torchrun
        agent's, a worker's caller: forked.py) that process and its own descendants."""
        from scaletrain import forked

        found, todo = {}, [self.proc]
        while todo:
            p = todo.pop()
            if p.pid in found:
                continue
            found[p.pid] = p
            try:
                todo += p.children()
            except psutil.Error:
                continue
            if (child := forked.child_of(p)) is not None:
                todo.append(child)
        return list(found.values())

    def summary(self) -> dict:
        return {"memory/tree_peak_bytes": self.peak_bytes, "memory/tree_peak_processes": self.peak_processes}
