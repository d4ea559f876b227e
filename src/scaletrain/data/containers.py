"""Images kept inside the data's own files (#73), referenced where their bytes are instead of copied: Parquet or
Arrow files whose image column holds the bytes (Hugging Face ``datasets``' ``Image`` feature: a struct of ``bytes``
and ``path``, as verl's and LLaMA-Factory's users keep them), and WebDataset tar shards (a sample's members share a
key: ``000001.json`` the record, ``000001.jpg`` / ``000001.0.png``... its images).

A reference names the file and where in it the image is, so a data-loading worker reads that one image while
training (data/pixels.py):

- ``row://COLUMN/ROW/K::PATH``: the K-th image of row ROW of a Parquet/Arrow file's COLUMN (read by row group with
  pyarrow, the last few groups kept per process);
- ``tar://MEMBER::SHARD``: fsspec's own chained URL for a tar member (its tar file system indexes a shard once per
  process and seeks to the member).

WebDataset shards are read with the standard ``tarfile`` here, not the ``webdataset`` package: the cache needs each
sample's member names for random access later, and webdataset's pipeline only streams samples in order.
"""

from __future__ import annotations

import functools
import json
import tarfile
from pathlib import Path

from scaletrain.errors import DataError

ROW = "row://"
TAR = "tar://"
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif", ".tif", ".tiff")


def in_container(where: str) -> bool:
    """An image inside a data file (its bytes are covered by the file's content hash)."""
    return where.startswith((ROW, TAR))


def is_image_struct(arrow_type) -> bool:
    """``datasets``' Image feature in Arrow: struct<bytes: binary, path: string>."""
    import pyarrow as pa

    return pa.types.is_struct(arrow_type) and {f.name for f in arrow_type} == {"bytes", "path"}


def image_columns(ds) -> list[str]:
    """The columns of a loaded table that hold images (an Image struct, or a list of them)."""
    import pyarrow as pa

    out = []
    for f in ds.data.table.schema:
        inner = f.type.value_type if pa.types.is_list(f.type) or pa.types.is_large_list(f.type) else f.type
        if is_image_struct(inner):
            out.append(f.name)
    return out


def with_references(ds, path: Path, origin: str = ""):
    """``ds`` (a Parquet/Arrow file's records) with each image column made a list of references: ``row://`` where
    the row holds the bytes (in ``origin``, the URI ``path`` was copied from, when there is one), the struct's own
    ``path`` where it holds only a path."""
    import pyarrow as pa
    import pyarrow.compute as pc

    where = origin or path.absolute()
    for column in image_columns(ds):
        refs, row = [], 0
        for values in ds.data.table.column(column).chunks:  # memory-mapped chunks: the bytes are never copied
            single = not (pa.types.is_list(values.type) or pa.types.is_large_list(values.type))
            items = values if single else values.flatten()
            has_bytes = pc.struct_field(items, "bytes").is_valid().to_pylist()  # struct_field: the slice's own rows
            paths = pc.struct_field(items, "path").to_pylist()
            lengths = [1] * len(values) if single else values.value_lengths().fill_null(0).to_pylist()
            i = 0
            for n in lengths:
                refs.append([f"{ROW}{column}/{row}/{k}::{where}" if has_bytes[i + k] else paths[i + k]
                             for k in range(n)])
                i += n
                row += 1
        ds = ds.remove_columns([column]).add_column(column, refs)
    return ds


def row_bytes(where: str) -> bytes:
    """The bytes a ``row://`` reference points to (FileNotFoundError / IndexError / KeyError when they are not)."""
    spec, path = where[len(ROW):].split("::", 1)
    column, row, k = spec.rsplit("/", 2)
    row, k = int(row), int(k)
    starts, group_rows = _layout(path)
    group = max(g for g, start in enumerate(starts) if start <= row)
    value = _group(path, group, column)[row - starts[group]].as_py()
    item = value if isinstance(value, dict) else value[k]
    if not item or item.get("bytes") is None:
        raise KeyError(f"no image bytes at {column}[{row}][{k}]")
    return item["bytes"]


@functools.lru_cache(maxsize=64)
def _layout(path: str) -> tuple[list[int], list[int]]:
    """The first row and row count of each row group (Parquet) or record batch (Arrow) of the file."""
    groups = [len(b) for b in _batches(path)] if not path.endswith((".parquet", ".pq")) else None
    if groups is None:
        meta = _parquet(path).metadata
        groups = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
    starts = [sum(groups[:g]) for g in range(len(groups))]
    return starts, groups


@functools.lru_cache(maxsize=4)  # a few row groups per process: a shuffled epoch reads each group's images anyway
def _group(path: str, group: int, column: str):
    if path.endswith((".parquet", ".pq")):
        return _parquet(path).read_row_group(group, columns=[column]).column(column)
    return _batches(path)[group].column(column)


@functools.lru_cache(maxsize=8)
def _parquet(path: str):
    """A Parquet file, local or on object storage (fsspec: a row group's byte range is read, never the file)."""
    import pyarrow.parquet as pq

    if "://" not in path:
        return pq.ParquetFile(path)
    import fsspec

    return pq.ParquetFile(fsspec.open(path, "rb").open())


@functools.lru_cache(maxsize=8)
def _batches(path: str) -> list:
    """An Arrow file's record batches, memory-mapped (``datasets`` writes the IPC stream format)."""
    import pyarrow as pa

    source = pa.memory_map(path)
    try:
        return pa.ipc.open_stream(source).read_all().to_batches()
    except pa.ArrowInvalid:
        return pa.ipc.open_file(pa.memory_map(path)).read_all().to_batches()


def shards(path: Path) -> list[Path]:
    """A WebDataset source's shards: the .tar file, or a directory's .tar files in name order."""
    return sorted(path.glob("*.tar")) if path.is_dir() else [path]


def webdataset_records(path: Path, images: str = "images", origin: str = ""):
    """Each sample of the shards as a record: its ``.json`` member's fields, and ``images`` the references of its
    image members (in name order: ``000001.0.jpg`` before ``000001.1.jpg``); a sample without a .json member is
    left out (it is counted by the caller as no record). A shard that cannot be read raises tarfile.ReadError /
    OSError naming nothing: the caller names the shard."""
    for shard in shards(path):
        try:
            samples, order = _samples(shard)
        except (tarfile.TarError, OSError, ValueError) as e:  # json's errors are ValueErrors
            why = "not a tar file" if isinstance(e, tarfile.ReadError) else f"{type(e).__name__}: {e}"
            raise ShardError(f"{shard}: {why}") from None
        where = origin or str(shard.absolute())  # origin: the URI of a single shard copied to ``path``
        for key in order:
            sample = samples[key]
            if isinstance(sample["record"], dict):
                yield {**sample["record"], images: [f"{TAR}{m}::{where}" for m in sorted(sample["images"])]}


class ShardError(Exception):
    """A WebDataset shard that cannot be read: "SHARD: why"."""


def _samples(shard: Path) -> tuple[dict[str, dict], list[str]]:
    """A shard's samples by key ({"record": its JSON, "images": its image members}) and the keys in order."""
    samples: dict[str, dict] = {}
    order: list[str] = []
    with tarfile.open(shard) as tar:
        for member in tar:
            if not member.isfile():
                continue
            folder, _, name = member.name.rpartition("/")
            key = f"{folder}/{name.split('.', 1)[0]}" if folder else name.split(".", 1)[0]
            if key not in samples:
                samples[key] = {"record": None, "images": []}
                order.append(key)
            lower = name.lower()
            if lower.endswith(".json"):
                samples[key]["record"] = json.loads(tar.extractfile(member).read())
            elif lower.endswith(IMAGE_SUFFIXES):
                samples[key]["images"].append(member.name)
    return samples, order


def webdataset_table(p: Path, key: str, path: str, hf_cache: str, origin: str = ""):
    """WebDataset shards' samples as records (data/containers.py), written to an Arrow cache as they are read (the
    driver's memory bounded by a writer batch, not the set)."""
    import datasets

    def records():
        yield from webdataset_records(p, origin=origin)

    try:
        return datasets.Dataset.from_generator(records, cache_dir=hf_cache, keep_in_memory=False)
    except Exception as e:  # noqa: BLE001 - datasets wraps the generator's error (tarfile's, json's)
        cause = e
        while not isinstance(cause, ShardError) and (cause.__cause__ or cause.__context__) is not None:
            cause = cause.__cause__ or cause.__context__
        shard, _, why = str(cause).partition(": ") if isinstance(cause, ShardError) else ("", "", str(cause))
        raise DataError(f"{key}={path}: WebDataset shard {shard or '?'} cannot be read ({why}); check the shards "
                        f"(tar files of samples: KEY.json and its images KEY.jpg / KEY.0.png ...)") from None
