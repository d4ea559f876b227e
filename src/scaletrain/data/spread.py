"""Where a source's records are encoded: the driver's cores (``datasets.map``, a process per core for a large
source) or Ray tasks on every node of a cluster (``data/on_ray.py``); and how fast, for the preparation's note."""

from __future__ import annotations

import os
import time
import uuid

from scaletrain.data.on_ray import on_cluster, tokenize_on_ray


def encoded(ds, fn, d, workdir: str, speed: Speed):
    """``fn`` over the records of ``ds`` (batched, 1000 at a time) as an Arrow-file dataset in ``workdir``, where
    ``d.tokenize_on`` says; the time and processes go to ``speed``."""
    t0 = time.perf_counter()
    if on_cluster(d.tokenize_on, len(ds), PARALLEL_ROWS):
        out, nodes, cpus = tokenize_on_ray(ds, fn, workdir)
        speed.add(len(ds), time.perf_counter() - t0, cpus, len(nodes))
    else:
        out = _mapped(ds, fn, d, workdir)
        speed.add(len(ds), time.perf_counter() - t0, tokenize_processes(d.preprocessing_num_workers, len(ds)) or 1)
    return out


PARALLEL_ROWS = 20_000  # a source this large is tokenized by a process per core unless told otherwise


def tokenize_processes(configured: int | None, rows: int) -> int | None:
    """Processes for one source's tokenization (None: this one): data.preprocessing_num_workers, else every core of
    the driver for a large source (a process costs about a second to start: a small one stays in this process)."""
    if configured is not None:
        return configured if configured > 1 and rows >= 1000 else None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return cores if cores > 1 and rows >= PARALLEL_ROWS else None


class Speed:
    """Records tokenized, seconds and processes over a preparation's sources: the note's rows/s and per core."""

    def __init__(self):
        self.rows, self.seconds, self.processes, self.nodes = 0, 0.0, 1, 0

    def add(self, rows: int, seconds: float, processes: int, nodes: int = 0) -> None:
        self.rows, self.seconds = self.rows + rows, self.seconds + seconds
        self.processes, self.nodes = max(self.processes, processes), max(self.nodes, nodes)

    def __str__(self) -> str:
        rate = self.rows / self.seconds if self.seconds > 0 else 0.0
        where = (f"Ray tasks on {self.nodes} node(s), {self.processes} CPUs" if self.nodes else
                 f"{self.processes} process(es)")
        how = "data.tokenize_on sets where" if self.nodes else "data.preprocessing_num_workers sets them"
        return f"{rate:,.0f} records/s with {where}, {rate / self.processes:,.0f} per core; {how}"


def _mapped(ds, fn, d, workdir: str):
    """The encoder over the records on the driver's cores, into an Arrow file in ``workdir``."""
    workers = tokenize_processes(d.preprocessing_num_workers, len(ds))
    if workers:
        from scaletrain import envvars

        # The fast tokenizer's own thread pool must not be live across the fork of datasets' worker processes.
        envvars.apply_defaults({envvars.TOKENIZERS_PARALLELISM: "false"})
    rows = 1000
    return ds.map(fn, batched=True, batch_size=rows, writer_batch_size=rows, num_proc=workers,
                  remove_columns=ds.column_names,
                  cache_file_name=os.path.join(workdir, f"tokenized-{uuid.uuid4().hex}.arrow"), desc=None)
