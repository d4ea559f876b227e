"""Packing: tokenized examples -> rows of at most ``max_length`` tokens, and per-example lengths for balancing.

First-fit decreasing inside a seeded window of examples: the order is the same on every run of the config
(and so resumable), rows are nearly full, and no example is split. Each row carries ``position_ids`` that
restart at 0 for every example, so attention never crosses an example: a model on SDPA attends per example
(``attention.py``); with no attention mask, transformers builds a block-diagonal causal mask for eager
attention (``masking_utils.find_packed_sequence_indices``) and runs varlen for flash-attention kernels. The
first token of each example is no target (its label is ignored): it would be predicted from the previous
example's last token. ``example_ids`` names each row's members (their rows in the unpacked split): what a
record of the examples trained reads (``worker/seen.py``).

The plan is made from the examples' lengths alone (an Arrow pass, ``data/lengths.py``) and the rows are built
with Arrow and numpy a batch of rows at a time, written to an Arrow file: no token id becomes a Python object, so
the driver's memory does not grow with the set (issue #46: 10M rows of 500 tokens are over 100 GB as lists). The
split's Arrow files are memory-mapped (``datasets``), and the rows take examples from all over them: every page
read (and the 64 KiB the kernel maps around it) would stay in the driver's resident set until the pass ends (~1.9
GB of a 2M-row cache). The pages of those mappings are handed back (``release``) whenever they pass
``MAPPED_BUDGET``.
"""

from __future__ import annotations

import os
from pathlib import Path

from scaletrain.data.encode import IGNORE_INDEX

WINDOW = 1000  # examples sorted together: larger packs tighter, smaller keeps the order closer to the shuffle
TOKENS_PER_BATCH = 1 << 20  # packed rows built and written at a time: ~40 bytes a token while built
TAKE = 1024  # examples copied out of the mapped split at a time: ~320 MB of its pages mapped (measured, 2M rows)
# Bytes of the split's file pages kept resident before they are released. Releasing costs time (the pages read
# next fault in again: packing 2M rows took 73 s releasing every TAKE examples against 48 s never), so a split
# smaller than this is never released, and a larger one holds about this much (issue #46: the driver's RSS).
MAPPED_BUDGET = 768 << 20


def plan(lengths, max_length: int, seed: int):
    """(members, counts): the examples of every row in row order (int64, flat) and how many each row holds."""
    import numpy as np

    lengths = np.asarray(lengths, dtype=np.int64)
    order = np.random.default_rng(seed).permutation(len(lengths))  # 8 bytes an example, not a Python list
    members, counts = [], []
    for w in range(0, len(order), WINDOW):
        window = order[w:w + WINDOW]
        window = window[np.argsort(-lengths[window], kind="stable")].tolist()  # longest first
        bins: list[list[int]] = []
        room: list[int] = []
        for i in window:
            n = int(lengths[i])
            slot = next((b for b, free in enumerate(room) if free >= n), None)
            if slot is None:
                bins.append([i])
                room.append(max_length - n)
            else:
                bins[slot].append(i)
                room[slot] -= n
        members.append(np.fromiter((i for b in bins for i in b), dtype=np.int64))
        counts.append(np.fromiter((len(b) for b in bins), dtype=np.int32))
    if not members:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int32)
    return np.concatenate(members), np.concatenate(counts)


def pack(split, max_length: int, seed: int, workdir: str | Path | None = None):
    """A new ``datasets.Dataset`` of packed rows: input_ids, labels, position_ids, examples and example_ids (per
    row), memory-mapped from an Arrow file in ``workdir`` (a temporary directory when None; the caller saves it)."""
    import tempfile

    import datasets
    import numpy as np
    import psutil
    import pyarrow as pa

    from scaletrain.data.lengths import list_lengths

    members, counts = plan(list_lengths(split, "input_ids"), max_length, seed)
    row_ends = np.cumsum(counts, dtype=np.int64)
    joined = [c for c in JOINED if c in split.column_names]  # a vision-language example's images (#62)
    source = split.select_columns(["input_ids", "labels", *joined]).with_format("arrow")
    spans = mapped_spans(f["filename"] for f in split.cache_files)  # while ``split`` lives, as it does here
    ceiling = psutil.Process().memory_info().shared + MAPPED_BUDGET
    fd, path = tempfile.mkstemp(prefix="packed-", suffix=".arrow",
                                dir=workdir or tempfile.mkdtemp(prefix="scaletrain-pack-"))
    os.close(fd)
    with pa.OSFile(path, "wb") as sink:
        writer = None
        step = max(1, TOKENS_PER_BATCH // max_length)
        for first in range(0, len(counts), step):
            last = min(first + step, len(counts))
            lo, hi = (int(row_ends[first - 1]) if first else 0), int(row_ends[last - 1])
            batch = _rows(source, members[lo:hi], counts[first:last], spans, ceiling, joined)
            if writer is None:
                writer = pa.ipc.new_stream(sink, batch.schema)
            writer.write_batch(batch)
        if writer is None:  # no rows: an empty file of the same columns
            schema = pa.schema([("input_ids", pa.list_(pa.int32())), ("labels", pa.list_(pa.int64())),
                                ("position_ids", pa.list_(pa.int32())), ("examples", pa.int32()),
                                ("example_ids", pa.list_(pa.int64()))])
            writer = pa.ipc.new_stream(sink, schema)
        writer.close()
    return datasets.Dataset.from_file(path)


def _rows(source, members, counts, spans, ceiling, joined=()):
    """One Arrow batch of packed rows: the members' token lists concatenated (``members`` in row order), and their
    ``joined`` columns (images: pixels, grids, image-token masks) concatenated the same way."""
    import numpy as np
    import pyarrow as pa

    ids, labels, *others = _gather(source, members, spans, ceiling, ("input_ids", "labels", *joined))
    lengths = np.asarray(ids.value_lengths(), dtype=np.int64)
    starts = np.zeros(len(lengths), dtype=np.int64)  # each member's first token in the flat row values
    np.cumsum(lengths[:-1], out=starts[1:])
    flat_labels = labels.flatten().to_numpy(zero_copy_only=False).copy()
    flat_labels[starts[lengths > 0]] = IGNORE_INDEX  # an example's first token is predicted from no context
    positions = np.arange(int(lengths.sum()), dtype=np.int32) - np.repeat(starts, lengths).astype(np.int32)
    member_ends = np.cumsum(counts, dtype=np.int64)
    row_offsets = np.zeros(len(counts) + 1, dtype=np.int32)
    row_offsets[1:] = np.concatenate([[0], np.cumsum(lengths)])[member_ends]
    member_offsets = np.zeros(len(counts) + 1, dtype=np.int32)
    member_offsets[1:] = member_ends

    def listed(values, offsets=row_offsets):
        return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()),
                                        values if isinstance(values, pa.Array) else pa.array(values))

    columns = {"input_ids": listed(ids.flatten()), "labels": listed(pa.array(flat_labels, labels.type.value_type)),
               "position_ids": listed(positions), "examples": pa.array(counts, pa.int32()),
               "example_ids": listed(members, member_offsets)}
    columns.update(_joined(dict(zip(joined, others)), member_ends))
    return pa.record_batch(columns)


# What a packed row of image examples carries besides its tokens (data/vision.py), each its members' lists end to
# end: where its images are, their grids and token counts.
JOINED = ("image_refs", "image_grid_thw", "image_tokens")


def _joined(columns: dict, member_ends):
    """Each column's members' lists concatenated per packed row."""
    import numpy as np
    import pyarrow as pa

    out = {}
    ends = np.concatenate([[0], member_ends]).astype(np.int64)
    for name, values in columns.items():
        lengths = np.asarray(values.value_lengths(), dtype=np.int64)
        offsets = np.concatenate([[0], np.cumsum(lengths)])[ends]
        out[name] = pa.LargeListArray.from_arrays(pa.array(offsets, pa.int64()), values.flatten())
    return out


def _gather(source, members, spans, ceiling, names=("input_ids", "labels")):
    """The members' ``names`` columns (input_ids and labels), copied out of the memory-mapped split ``TAKE`` examples
    at a time; when this process's resident shared pages (file-backed: psutil's ``shared``) pass ``ceiling``, the
    split's pages are released."""
    import psutil
    import pyarrow as pa

    proc = psutil.Process()
    taken_columns: list[list] = [[] for _ in names]
    for at in range(0, len(members), TAKE):
        taken = source[members[at:at + TAKE].tolist()]
        for out, name in zip(taken_columns, names):
            out.append(taken.column(name).combine_chunks())
        if spans and proc.memory_info().shared > ceiling:
            release(spans)
    return tuple(pa.concat_arrays(c) for c in taken_columns)


MADV_DONTNEED = 4  # <sys/mman.h> on Linux


def mapped_spans(files) -> list[tuple[int, int]]:
    """The address ranges of this process's read-only memory maps of ``files`` (psutil's ``memory_maps``; Linux only,
    where ``release`` can act: elsewhere none). Valid while the object that mapped them (a ``datasets.Dataset``) is
    alive: read them again after it may have been dropped."""
    import sys

    import psutil

    if not sys.platform.startswith("linux"):
        return []
    wanted = {os.path.realpath(f) for f in files}
    try:
        maps = psutil.Process().memory_maps(grouped=False)
    except psutil.Error:
        return []
    return [tuple(int(x, 16) for x in m.addr.split("-")) for m in maps
            if m.path in wanted and m.perms.startswith("r") and "w" not in m.perms]


def release(spans) -> int:
    """Drop this process's resident pages in ``spans`` (from ``mapped_spans``): ``madvise(MADV_DONTNEED)``. The
    mapping stays valid and a later read faults the page back in from the page cache, so nothing the process holds
    changes; only what it keeps resident does. Written here because neither ``datasets`` nor pyarrow exposes the
    mapping they make (pyarrow's ``MemoryMappedFile`` has no madvise). Returns the bytes of the ranges released."""
    if not spans:
        return 0
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)  # the process's own symbols, libc's among them (no ldconfig run)
    libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    for start, end in spans:
        libc.madvise(start, end - start, MADV_DONTNEED)
    return sum(end - start for start, end in spans)
