"""Tokenization spread over a Ray cluster (``data.tokenize_on``): the driver parses the source (its errors name the
file and line before anything runs), cuts it into contiguous shards, and Ray tasks on every node encode them with
the same encoder the driver's ``datasets.map`` runs. The results come back through Ray's object store and are
written, in shard order, to Arrow files beside the driver's own: the cache is the one the driver alone would write,
and the driver holds one shard at a time. No process group exists yet, so no collective timeout can fire during
preparation (LLaMA-Factory's 30-minute one does: LlamaFactory#3939). A node that dies takes its tasks with it and
Ray runs them again elsewhere (``max_retries``).

Ray Data's ``map_batches`` would do the shard bookkeeping, but its output order is not guaranteed without
``preserve_order`` (which serialises the pipeline) and it would own the cache files; tasks over contiguous shards
keep the order and the files here.
"""

from __future__ import annotations

import os
from pathlib import Path

from scaletrain.errors import ConfigError

SHARD_ROWS = 10_000  # records a task encodes (a multiple of the map's 1000-record batches: the same batches)
IN_FLIGHT_PER_CPU = 2  # shards submitted ahead per cluster CPU


def cluster_nodes() -> int:
    """Alive nodes of the Ray cluster this process is connected to (0: not connected)."""
    import sys

    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return 0
    return sum(1 for n in ray.nodes() if n.get("Alive"))


def on_cluster(setting: str, rows: int, large: int) -> bool:
    """Whether a source of ``rows`` records is tokenized by Ray tasks: ``cluster`` always (connected or an error),
    ``auto`` when this driver is connected to a cluster of several nodes and the source is ``large``."""
    if setting == "driver":
        return False
    nodes = cluster_nodes()
    if setting == "cluster":
        if nodes == 0:
            raise ConfigError("data.tokenize_on=cluster: this driver is not connected to a Ray cluster; run with "
                              "scaling.launcher=ray (scaling.address=HOST:PORT to join one), or set "
                              "data.tokenize_on=auto")
        return True
    return nodes > 1 and rows >= large


def tokenize_on_ray(ds, fn, workdir: str) -> tuple:
    """(the encoded dataset, the nodes that encoded it, the cluster's CPUs): ``ds.map(fn, batched=True,
    batch_size=1000)``'s result, computed by Ray tasks over contiguous shards."""
    import datasets
    import pyarrow as pa
    import ray

    encode = ray.remote(num_cpus=1, max_retries=3)(_encode)
    fn_ref = ray.put(fn)
    cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
    starts = list(range(0, len(ds), SHARD_ROWS))
    pending, done, files, nodes = {}, {}, [], set()
    source = ds.with_format("arrow")
    for index, start in enumerate(starts):
        pending[encode.remote(source[start:start + SHARD_ROWS], fn_ref)] = index  # one shard's table at a time
        while len(pending) >= cpus * IN_FLIGHT_PER_CPU or (index == len(starts) - 1 and pending):
            ready, _ = ray.wait(list(pending), num_returns=1)
            table, node = ray.get(ready[0])
            done[pending.pop(ready[0])] = table
            nodes.add(node)
            while len(files) in done:  # in shard order, each written as it can be
                path = Path(workdir) / f"on-ray-{os.getpid()}-{len(files)}.arrow"
                with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, done[len(files)].schema) as w:
                    w.write_table(done.pop(len(files)))
                files.append(str(path))
    parts = [datasets.Dataset.from_file(f) for f in files]
    features = _common(parts)
    parts = [p if p.features == features else p.cast(features) for p in parts]
    return datasets.concatenate_datasets(parts), nodes, cpus


def _common(parts):
    """The features of all shards: a column that is all None in one shard (a skip reason no record of it has) is
    null-typed there and takes the others' type."""
    import datasets

    features = dict(parts[0].features)
    for p in parts[1:]:
        for name, feature in p.features.items():
            if isinstance(features[name], datasets.Value) and features[name].dtype == "null":
                features[name] = feature
    return datasets.Features(features)


def _encode(table, fn):
    """A Ray task: one shard encoded as the driver's map would (records in 1000-record batches)."""
    import datasets
    import ray

    from scaletrain import envvars

    envvars.apply({envvars.TOKENIZERS_PARALLELISM: "false"})  # one CPU a task: its threads would oversubscribe
    datasets.disable_progress_bars()
    ds = datasets.Dataset(table)
    rows = 1000
    out = ds.map(fn, batched=True, batch_size=rows, writer_batch_size=rows, remove_columns=ds.column_names,
                 keep_in_memory=True, desc=None)
    return out.data.table, ray.get_runtime_context().get_node_id()
