"""``data.streaming``: the training records read from their shards while training runs, with no prepare step.

Every worker reads the same seeded stream of records (the shards in a per-epoch order, then a shuffle buffer)
and keeps every N-th one (N: the data-parallel ranks), as ``worker/sampler.py`` does with a prepared split, so
a step's examples depend on the global batch only. The stream's position (epoch, the shard being read, the row
in it, the ids waiting in the shuffle buffer and the buffer's RNG) is the same on every rank at a step boundary
and goes into every checkpoint: a resume, at any world size, opens the shard it stopped in at the row it
stopped at (the shards before it are not read again) and refills the buffer with exactly the records that were
waiting in it, so each record of an epoch trains once.

Written here rather than with ``datasets``' streaming: an ``IterableDataset``'s ``state_dict`` restarts its
shuffle buffer empty on resume (documented in its "Stateful" section), which repeats and skips records, and it
gives no record a stable id (file, line) to name in an error or in ``data.record_examples``.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field

from scaletrain.errors import DataError

FORMATS = {".jsonl": "jsonl", ".json": "jsonl", ".parquet": "parquet", ".pq": "parquet"}
COMPRESSED = (".gz", ".zst", ".bz2", ".xz")
ROW_BITS = 32  # a record's id: shard index << ROW_BITS | row (its line in JSON Lines)


@dataclass(frozen=True)
class StreamSource:
    """The shards of one streamed source, in sorted order (the order the ids count in)."""

    key: str  # the config key, for errors
    root: str  # what the key says
    shards: tuple[str, ...]
    fmt: str  # jsonl | parquet
    options: dict = field(default_factory=dict)  # fsspec storage options (an S3 endpoint)
    formatting: str = "alpaca"  # how the records are written, and where their fields are (data/formats.py)
    columns: dict = field(default_factory=dict)
    sizes: tuple[int, ...] = ()  # the shards' bytes when listed: a resume needs the same files, unchanged

    def source(self):
        """The ``Source`` the encoders take (data/sources.py)."""
        from scaletrain.data.formats import Columns
        from scaletrain.data.sources import Source

        return Source("stream", self.root, self.key, self.formatting, Columns(**self.columns), "auto")

    def to_spec(self) -> dict:
        return {**asdict(self), "shards": list(self.shards), "sizes": list(self.sizes)}

    @classmethod
    def from_spec(cls, spec: dict) -> StreamSource:
        return cls(**{**spec, "shards": tuple(spec["shards"]), "sizes": tuple(spec.get("sizes", ()))})

    @property
    def fingerprint(self) -> str:
        listed = [f"{name} {size}" for name, size in zip(self.shards, self.sizes or [0] * len(self.shards))]
        return hashlib.sha256("\n".join(listed).encode()).hexdigest()[:16]

    def name(self, rid: int) -> str:
        """A record id as the file and line (or row) an error names."""
        shard, row = rid >> ROW_BITS, rid & ((1 << ROW_BITS) - 1)
        return f"{self.shards[shard]} {'line' if self.fmt == 'jsonl' else 'row'} {row + 1}"


def _fs(root: str, endpoint_url: str | None):
    import fsspec

    if "://" in root and not root.startswith("file://"):
        from scaletrain.storage.uri import Store

        store = Store.of(root, endpoint_url)
        options = store.options()
        return fsspec.filesystem(store.scheme, **options), options, store.scheme + "://"
    return fsspec.filesystem("file"), {}, ""


def _format_of(path: str, fmt: str) -> str | None:
    name = path
    for ext in COMPRESSED:
        name = name.removesuffix(ext)
    return FORMATS.get("." + name.rsplit(".", 1)[-1]) if fmt == "auto" else {"json": "jsonl"}.get(fmt, fmt)


def list_shards(root: str, fmt: str, key: str, endpoint_url: str | None = None, formatting: str = "alpaca",
                columns: dict | None = None) -> StreamSource:
    """The shards a path names: a file, a folder (every JSON Lines or Parquet file under it) or a glob, local or
    on object storage; one line naming ``key`` when there are none or they mix formats."""
    fs, options, scheme = _fs(root, endpoint_url)
    path = root.split("://", 1)[1] if scheme else root
    try:
        if any(c in path for c in "*?["):
            found = fs.glob(path, detail=True)
        elif fs.isdir(path):
            found = fs.find(path, detail=True)
        elif fs.exists(path):
            found = {path: fs.info(path)}
        else:
            found = {}
    except Exception as e:  # noqa: BLE001 - every backend raises its own; the line keeps its words
        raise DataError(f"{key}={root}: cannot list the shards ({type(e).__name__}: {e}); check the path, "
                        f"storage.endpoint_url and the credentials") from None
    shards = sorted(p for p, info in found.items() if info.get("type") != "directory" and _format_of(p, fmt)
                    and not p.rsplit("/", 1)[-1].startswith("."))
    if not shards:
        raise DataError(f"{key}={root}: no JSON Lines or Parquet shard found there; data.streaming reads .jsonl "
                        f"(.json lines) and .parquet files, one or a folder or a glob of them")
    kinds = {_format_of(p, fmt) for p in shards}
    if len(kinds) > 1:
        raise DataError(f"{key}={root}: the shards mix formats ({', '.join(sorted(kinds))}); stream one format, or "
                        f"set data.format")
    if len(shards) >= 1 << (64 - ROW_BITS - 1):
        raise DataError(f"{key}={root}: {len(shards)} shards; at most {1 << (64 - ROW_BITS - 1)} can be streamed")
    return StreamSource(key, root, tuple(scheme + p for p in shards), kinds.pop(), options, formatting,
                        columns or {}, tuple(int(found[p].get("size") or 0) for p in shards))


def read_shard(src: StreamSource, shard: int, start: int = 0) -> Iterator[tuple[int, object]]:
    """(row, raw record) from ``start`` on: a JSON line's bytes (parsed only by the rank that keeps it; blank
    lines are not records), or a Parquet row's dict."""
    import fsspec

    uri = src.shards[shard]
    with fsspec.open(uri, "rb", compression="infer", **src.options) as f:
        if src.fmt == "jsonl":
            for row, line in enumerate(f):
                if row >= start and line.strip():
                    yield row, line
            return
        import pyarrow.parquet as pq

        row = 0
        for batch in pq.ParquetFile(f).iter_batches(batch_size=1024):
            if row + batch.num_rows > start:
                skip = max(0, start - row)
                for i, rec in enumerate(batch.slice(skip).to_pylist()):
                    yield row + skip + i, rec
            row += batch.num_rows


def parse(src: StreamSource, rid: int, raw) -> dict | str:
    """The record, or why it is not one (a skip reason)."""
    if src.fmt != "jsonl":
        return raw
    try:
        rec = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        return f"not a JSON line ({e.msg if hasattr(e, 'msg') else e}; {src.name(rid)})"
    return rec if isinstance(rec, dict) else f"not a JSON object ({src.name(rid)})"


@dataclass
class Position:
    """Where the stream is (a checkpoint keeps it: ``TrainState.stream``)."""

    shards: str = ""  # StreamSource.fingerprint: a resume needs the same shards
    epoch: int = 0
    shard: int = 0  # index into the epoch's shard order of the shard being read
    row: int = 0  # the next row of it to read
    taken: int = 0  # records handed out this epoch
    buffer: list[int] = field(default_factory=list)  # ids waiting in the shuffle buffer, in its order
    rng: list | None = None  # the buffer's random.Random state


class ShardStream:
    """The seeded record stream of every rank: ``next()`` is (id, raw record); epochs follow one another."""

    def __init__(self, src: StreamSource, seed: int, buffer_size: int, position: dict | None = None):
        self.src, self.seed, self.size = src, seed, buffer_size
        self.pos = Position(shards=src.fingerprint)
        self.rng = random.Random(seed)
        self.raw: list = []  # the buffer's records, beside pos.buffer's ids
        if position:
            self._restore(position)
        self._rows = self._read()

    def order(self, epoch: int) -> list[int]:
        order = list(range(len(self.src.shards)))
        random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
        return order

    def _read(self) -> Iterator[tuple[int, object]]:
        order = self.order(self.pos.epoch)
        while self.pos.shard < len(order):
            s = order[self.pos.shard]
            for row, raw in read_shard(self.src, s, self.pos.row):
                self.pos.row = row + 1
                yield s << ROW_BITS | row, raw
            self.pos.shard, self.pos.row = self.pos.shard + 1, 0

    def __iter__(self):
        return self

    def __next__(self) -> tuple[int, object]:
        while True:
            while len(self.raw) < self.size:
                nxt = next(self._rows, None)
                if nxt is None:
                    break
                self.pos.buffer.append(nxt[0])
                self.raw.append(nxt[1])
            if self.raw:
                break
            if self.pos.taken == 0:
                raise DataError(f"{self.src.key}={self.src.root}: the shards hold no record")
            self.pos = Position(shards=self.pos.shards, epoch=self.pos.epoch + 1)  # the next epoch
            self.rng = random.Random(self.seed + self.pos.epoch)
            self._rows = self._read()
        i = self.rng.randrange(len(self.raw))
        rid, raw = self.pos.buffer[i], self.raw[i]
        self.pos.buffer[i], self.raw[i] = self.pos.buffer[-1], self.raw[-1]
        self.pos.buffer.pop()
        self.raw.pop()
        self.pos.taken += 1
        return rid, raw

    def state(self) -> dict:
        state = asdict(self.pos)
        version, internal, gauss = self.rng.getstate()
        state["rng"] = [version, list(internal), gauss]
        return state

    def _restore(self, state: dict) -> None:
        pos = Position(**{**state, "buffer": list(state["buffer"])})
        if pos.shards != self.src.fingerprint:
            raise DataError(f"{self.src.key}={self.src.root}: the shards differ from the ones the checkpoint's "
                            f"stream position counts in ({len(self.src.shards)} now, or one changed size); a resume "
                            f"needs the same files, unchanged (add new data in a new run)")
        self.pos = pos
        version, internal, gauss = pos.rng
        self.rng.setstate((version, tuple(internal), gauss))
        wanted: dict[int, set[int]] = {}
        for rid in pos.buffer:
            wanted.setdefault(rid >> ROW_BITS, set()).add(rid & ((1 << ROW_BITS) - 1))
        found: dict[int, object] = {}
        for shard, rows in wanted.items():  # only the shards whose records wait in the buffer are read again
            last = max(rows)
            for row, raw in read_shard(self.src, shard, min(rows)):
                if row in rows:
                    found[shard << ROW_BITS | row] = raw
                if row >= last:
                    break
        missing = [rid for rid in pos.buffer if rid not in found]
        if missing:
            raise DataError(f"{self.src.key}={self.src.root}: {self.src.name(missing[0])} is gone (the checkpoint's "
                            f"shuffle buffer holds it); a resume needs the same files")
        self.raw = [found[rid] for rid in pos.buffer]


class StreamEncoder:
    """Records to training examples with the same encoder a prepared run uses (``data/encoders.py``): the same
    template, truncation and labels; a record it cannot train on is a skip, counted with its reason."""

    def __init__(self, src: StreamSource, cfg, tokenizer, sample: list[dict], source=None):
        import datasets

        from scaletrain.data.encoders import encoder_for
        from scaletrain.data.templates import resolve_template

        template = resolve_template(cfg.data.template, tokenizer)
        self.fn = encoder_for(datasets.Dataset.from_list(sample), source or src.source(), cfg, tokenizer, template,
                              None)
        self.columns = list(dict.fromkeys(k for r in sample for k in r))  # a column no record of a batch has: None

    def __call__(self, records: list[dict]) -> tuple[list[dict], list[str]]:
        """The examples (input_ids, labels) of the records that train, and the skip reason of each record ('' when
        it trains)."""
        if not records:
            return [], []
        keys = list(dict.fromkeys([*self.columns, *(k for r in records for k in r)]))
        out = self.fn({k: [r.get(k) for r in records] for k in keys})
        reasons = [why or "" for why in out["_skip"]]
        rows = [{"input_ids": out["input_ids"][i], "labels": out["labels"][i]}
                for i, why in enumerate(reasons) if not why]
        return rows, reasons


def first_records(src: StreamSource, n: int) -> tuple[list[dict], list[tuple[str, str]]]:
    """The first ``n`` records of the first shard in listing order (the driver's check and first example), and the
    lines among them that are not records: (where, why)."""
    records, bad = [], []
    for row, raw in read_shard(src, 0):
        rec = parse(src, row, raw)
        if isinstance(rec, str):
            bad.append((src.name(row), rec))
        else:
            records.append(rec)
        if len(records) + len(bad) >= n:
            break
    return records, bad


SAMPLE = 64  # records the driver encodes before any worker starts: the column checks and main.log's first example


def streamed_source(cfg):
    """The one source the config streams (``data.train_file`` as given, or a ``dataset_info.json`` entry)."""
    from scaletrain.data.formats import Columns
    from scaletrain.data.sources import Source, named_sources

    d = cfg.data
    if d.train_file:
        return Source("train_file", d.train_file, "data.train_file", d.formatting,
                      Columns.from_config(d, d.formatting), d.format)
    src = named_sources(d, d.dataset, "data.dataset", cfg.train.stage)[0]
    return src


def prepare_stream(cfg, tokenizer):
    """The driver's part of a streamed run: the shards listed, the first records encoded (every column and
    template error before a worker starts), the eval split prepared as usual (``data.eval_file``); a
    ``PreparedData`` whose ``train`` is that sample and whose ``stream`` the workers read."""
    import datasets

    from scaletrain.data.prepare import PreparedData, prepare_data

    datasets.disable_progress_bars()
    d = cfg.data
    source = streamed_source(cfg)
    src = list_shards(source.path, d.format, source.key, cfg.storage.endpoint_url, source.formatting,
                      asdict(source.columns))
    sample, bad = first_records(src, SAMPLE)
    if not sample:
        why = f": {bad[0][1]}" if bad else ""
        raise DataError(f"{src.key}={src.root}: no record in the first lines of {src.shards[0]}{why}")
    encode = StreamEncoder(src, cfg, tokenizer, sample, source)
    rows, reasons = encode(sample)
    if not rows:
        raise DataError(f"{src.key}={src.root}: none of the first {len(sample)} records of {src.shards[0]} can be "
                        f"trained on: {next(r for r in reasons if r)}; fix the data or the columns/formatting keys")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    notes = [f"data: streaming {len(src.shards)} {src.fmt} shard(s) from {src.root}: every worker reads them in one "
             f"seeded order through a shuffle buffer of {d.buffer_size} records and keeps every N-th (N: the "
             f"data-parallel ranks), tokenized on the fly; no exact epochs (train.max_steps={cfg.train.max_steps} "
             f"sets the length), no length balancing, no packing; a resume continues at the exact record"]
    if skipped := sum(1 for r in reasons if r) + len(bad):
        notes.append(f"data: {skipped} of the first {len(sample) + len(bad)} records cannot be trained on and are "
                     f"skipped as they come (data.max_bad_ratio={d.max_bad_ratio:g} is checked as the stream goes)")
    if d.eval_file or d.eval_dataset:
        dev = d.model_copy(update={"streaming": False, "train_file": d.eval_file, "dataset": d.eval_dataset,
                                   "eval_file": None, "eval_dataset": None, "eval_ratio": 0.0})
        ev = prepare_data(cfg.model_copy(update={"data": dev}), tokenizer)
        evals, eval_path = ev.train, ev.train_path
        notes += [n for n in ev.notes if "cache hit" in n or "skipped" in n]
    else:
        evals, eval_path = datasets.Dataset.from_dict({"input_ids": [], "labels": []}), ""
        notes.append("data: no evaluation set (a stream holds none out); give data.eval_file to evaluate")
    return PreparedData(datasets.Dataset.from_list(rows), evals, pad, "", eval_path, notes=notes, stream=src)
