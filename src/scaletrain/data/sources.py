"""Where the records come from: local files loaded with Hugging Face ``datasets`` (JSON, JSONL, CSV, Parquet,
Arrow, ``save_to_disk`` directories), one file or the named datasets of a LLaMA-Factory ``dataset_info.json``.
Nothing is downloaded: a hub dataset is an error that says to fetch it first."""

from __future__ import annotations

import contextlib
import difflib
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from scaletrain.config.schema import DataConfig
from scaletrain.config.stages import PAIR_STAGES
from scaletrain.data.containers import image_columns, webdataset_table, with_references
from scaletrain.data.formats import FORMATTINGS, Columns
from scaletrain.data.spec import is_spec, read_spec
from scaletrain.errors import DataError
from scaletrain.storage.uri import is_uri, local_input
from scaletrain.textfile import guess_encoding, not_utf8

_SUFFIX_FORMAT = {".json": "json", ".jsonl": "jsonl", ".csv": "csv", ".parquet": "parquet", ".pq": "parquet",
                  ".arrow": "arrow", ".txt": "txt", ".tar": "webdataset"}
# "txt": a record per line (LLaMA-Factory's pre-training files, such as wiki_demo.txt), in a "text" column.
_BUILDER = {"json": "json", "jsonl": "json", "csv": "csv", "parquet": "parquet", "arrow": "arrow", "txt": "text"}
INFO_FILE = "dataset_info.json"


@dataclass(frozen=True)
class Source:
    """One dataset: its file, how its records are written, and the config key to name in errors."""

    name: str
    path: str
    key: str  # "data.train_file", "data.dataset[0] (alpaca_en)", ...
    formatting: str
    columns: Columns
    file_format: str = "auto"
    num_samples: int | None = None
    extra: dict = field(default_factory=dict)
    origin: str = ""  # the URI ``path`` is the driver's local copy of (images inside it are read from there)


def sources(d: DataConfig, task: str, stage: str = "sft") -> list[Source]:
    """The training sources of the config (dataset_info.json entries, or train_file)."""
    if d.train_file and is_spec(d.train_file):  # LLaMA-Factory v1's dataset spec file (data/spec.py)
        spec = read_spec(local_input(d.train_file, "data.train_file"), "data.train_file")
        return [Source(e.name, e.path, f"data.train_file ({e.name})", e.formatting,
                       Columns.from_config(d, e.formatting), num_samples=e.size) for e in spec]
    if d.train_file:
        columns = Columns.from_config(d, d.formatting)
        return [Source("train_file", local_input(d.train_file, "data.train_file"), "data.train_file", d.formatting,
                       columns, d.format, origin=d.train_file if is_uri(d.train_file) else "")]
    return named_sources(d, d.dataset or [], "data.dataset", stage)


def eval_sources(d: DataConfig, stage: str = "sft") -> list[Source]:
    """The evaluation sources the config names (eval_file, or LLaMA-Factory's eval_dataset entries); none: the
    evaluation set is held out of the training data (data.eval_ratio)."""
    if d.eval_file and is_spec(d.eval_file):  # LLaMA-Factory v1's dataset spec file (data/spec.py)
        spec = read_spec(local_input(d.eval_file, "data.eval_file"), "data.eval_file")
        return [Source(e.name, e.path, f"data.eval_file ({e.name})", e.formatting,
                       Columns.from_config(d, e.formatting), num_samples=e.size) for e in spec]
    if d.eval_file:
        return [Source("eval_file", local_input(d.eval_file, "data.eval_file"), "data.eval_file", d.formatting,
                       Columns.from_config(d, d.formatting), d.format,
                       origin=d.eval_file if is_uri(d.eval_file) else "")]
    return named_sources(d, d.eval_dataset, "data.eval_dataset", stage) if d.eval_dataset else []


def named_sources(d: DataConfig, names: list[str], setting: str, stage: str) -> list[Source]:
    """The entries ``names`` of ``d.dataset_dir``'s dataset_info.json; errors name ``setting`` (the key or flag)."""
    info_path = Path(d.dataset_dir).expanduser() / INFO_FILE
    if not info_path.is_file():
        raise DataError(f"data.dataset_dir={d.dataset_dir}: no {INFO_FILE} there; point it at LLaMA-Factory's data "
                        f"folder (or one with a {INFO_FILE} describing your files)")
    try:
        info = json.loads(info_path.read_text())
    except json.JSONDecodeError as e:
        raise DataError(f"{info_path}: line {e.lineno}: {e.msg}; fix the JSON") from None
    out = []
    for i, name in enumerate(names):
        if name not in info:
            near = difflib.get_close_matches(name, list(info), n=3, cutoff=0.5)
            hint = f"did you mean {' or '.join(near)}?" if near else f"it has {', '.join(sorted(info)[:12])}"
            raise DataError(f"{setting}: {name} is not in {info_path}; {hint}")
        entry = info[name]
        key = f"{setting}[{i}] ({name})"
        if "file_name" not in entry:
            remote = next((k for k in ("hf_hub_url", "ms_hub_url", "om_hub_url", "script_url", "cloud_file_name")
                           if k in entry), None)
            raise DataError(f"{key}: {info_path} gives it as {remote or 'no file_name'}; scaletrain never downloads: "
                            f"fetch it to a local file and give its file_name")
        # Pre-training (data.formatting=text, LLaMA-Factory's stage: pt) reads every entry as text, and LF names
        # a pt dataset's text column "prompt" ({"columns": {"prompt": "text"}}).
        formatting = "text" if d.formatting == "text" else entry.get("formatting", "alpaca")
        mapped = dict(entry.get("columns", {}))
        if formatting == "text" and "prompt" in mapped:
            mapped["text"] = mapped.pop("prompt")
        if formatting not in FORMATTINGS:
            raise DataError(f"{key}: formatting {formatting!r} in {info_path}; use one of {', '.join(FORMATTINGS)}")
        if bool(entry.get("ranking")) != (stage in PAIR_STAGES):
            raise DataError(f"{key}: a preference (ranking) dataset; train on it with train.stage=dpo" if
                            entry.get("ranking") else f"{key}: not a preference dataset (no \"ranking\": true in "
                            f"{info_path}); train.stage=dpo trains on chosen/rejected pairs: give one")
        if media := sorted(set(mapped) & set(UNSUPPORTED_MEDIA)):
            raise DataError(f"{key}: its {media[0]} column in {info_path}: {media[0]} are not supported (images are, "
                            f"with a vision-language model); leave it out of data.dataset")
        columns = Columns.from_config(d, formatting).with_overrides(mapped, entry.get("tags", {}))
        path = Path(entry["file_name"])
        path = path if path.is_absolute() else info_path.parent / path
        out.append(Source(name, str(path), key, formatting, columns, num_samples=entry.get("num_samples"),
                          extra={"info": str(info_path), "mapped": set(mapped)
                                 | set(entry.get("tags", {}))}))
    return out


def file_format(path: str, fmt: str, key: str) -> str:
    p = Path(path)
    if fmt != "auto":
        return fmt
    if p.is_dir():  # WebDataset shards, or a saved datasets.Dataset
        return "webdataset" if any(p.glob("*.tar")) else "disk"
    found = _SUFFIX_FORMAT.get(p.suffix.lower())
    if not found:
        raise DataError(f"{key}={path}: cannot tell the format from '{p.suffix}'; set data.format to json, jsonl, "
                        f"csv, parquet, arrow, txt or webdataset")
    return found


TEXT_FORMATS = ("json", "jsonl", "csv", "txt")


@dataclass
class Loaded:
    """A file's records (a ``datasets.Dataset``), the records that are not records (a JSON line holding an array:
    reason -> positions), and how to name a position: the file's line for JSON Lines, the row index otherwise."""

    ds: object
    path: Path
    fmt: str
    bad: dict = field(default_factory=dict)
    lines: list | None = None  # the file line of each record (JSON Lines), found when first asked

    @property
    def unit(self) -> str:
        return "line" if self.fmt == "jsonl" else "record"

    def position(self, index: int) -> int:
        """The line (JSON Lines) or the record number (from 1) of the record at 0-based ``index``."""
        if self.lines is None and self.fmt != "jsonl":
            return index + 1
        if self.lines is None:  # datasets skips blank lines: count the others
            with open(self.path, "rb") as f:
                self.lines = [n for n, line in enumerate(f, 1) if line.strip()]
        return self.lines[index] if index < len(self.lines) else index + 1


def load(path: str, fmt: str, key: str, hf_cache: str, encoding: str = "utf-8", origin: str = "") -> Loaded:
    """The file's records, or a DataError naming the file (and its line), the key and the fix. ``origin``: the URI
    ``path`` is a local copy of (the images inside the file are referenced there: every node reads them)."""
    import datasets

    p = Path(path).expanduser()
    if not p.exists():
        raise not_found(key, path)
    fmt = file_format(str(p), fmt, key)
    if p.is_file() and p.stat().st_size == 0 or _blank(p, fmt):
        raise DataError(f"{key}={path}: the file has no records (it is empty or blank); point it at a file of "
                        f"records")
    parse = _as_utf8(p, encoding, key, hf_cache) if fmt in TEXT_FORMATS else p
    loaded = None
    try:
        if fmt == "disk":
            ds = datasets.load_from_disk(str(p))
            if isinstance(ds, datasets.DatasetDict):
                ds = ds["train"] if "train" in ds else next(iter(ds.values()))
        elif fmt == "webdataset":
            ds = webdataset_table(p, key, path, hf_cache, origin)
        else:
            kwargs = {"field": "data"} if fmt == "json" and _has_data_field(parse) else {}
            with _quiet_datasets():  # its parser's failures are reported here, in one line naming the file's line
                ds = datasets.load_dataset(_BUILDER[fmt], data_files=str(parse), split="train", cache_dir=hf_cache,
                                           keep_in_memory=False, **kwargs)  # memory-mapped: any size
    except DataError:
        raise
    except Exception as e:  # noqa: BLE001 - datasets wraps the parser's error several levels deep
        if fmt not in ("json", "jsonl"):
            raise DataError(f"{key}={path}: cannot parse as {fmt}: {_root_message(e)}") from None
        loaded = _json_records(parse, p, fmt, key, _root_message(e))  # the line at fault, or the odd records
        ds = loaded.ds
    if fmt == "txt":  # blank lines separate paragraphs; they are not records
        ds = ds.filter(lambda r: bool(r["text"].strip()))
    if len(ds) == 0:
        raise DataError(f"{key}={path}: the file has no records; point it at a non-empty file")
    if fmt in ("parquet", "arrow", "disk") and image_columns(ds):  # images' bytes in the file: referenced (#73)
        ds = with_references(ds, p if fmt != "disk" else Path(ds.cache_files[0]["filename"]), origin)
    return loaded or Loaded(ds, parse, fmt)


@contextlib.contextmanager
def _quiet_datasets():
    """datasets logs a parse failure ("Failed to load JSON from file <a private copy> ... in row 16") before it
    raises; scaletrain words the error itself (with the file's own line), so the log line would be a second,
    differently numbered message."""
    import logging

    logger = logging.getLogger("datasets")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


def _blank(p: Path, fmt: str) -> bool:
    """A text file of whitespace only (datasets says 'Instruction "train" corresponds to no data!')."""
    if fmt not in TEXT_FORMATS or not p.is_file() or p.stat().st_size > 1 << 20:
        return False
    return not p.read_bytes().strip()


def _as_utf8(p: Path, encoding: str, key: str, scratch: str) -> Path:
    """The file to parse: itself when it is UTF-8 (checked: the parser would keep invalid bytes as they are), or
    a UTF-8 copy when ``data.encoding`` names another encoding. Read in blocks (a file of any size); only a file
    that fails is read whole, for the error's line and the encoding it looks like."""
    out = Path(scratch) / "utf8" / p.name
    if _streamed(p, encoding, None if encoding == "utf-8" else out):
        return p if encoding == "utf-8" else out
    data = p.read_bytes()
    if encoding == "utf-8":
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as e:
            guess = guess_encoding(data)
            fix = (f"set data.encoding={guess}, or convert the file: iconv -f {guess} -t utf-8 {p.name} > "
                   f"{p.stem}.utf8{p.suffix}" if guess else f"is {key} the right file?")
            raise DataError(f"{key}={p}: {not_utf8(data, e)}: {fix}") from None
    try:
        data.decode(encoding)
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        guess = guess_encoding(data)
        raise DataError(f"{key}={p}: line {line} is not {encoding} (offset {e.start}); "
                        + (f"it looks like {guess}: set data.encoding={guess}" if guess else
                           "it is not text in any usual encoding: is it the right file?")) from None
    raise AssertionError(f"{p}: decoded whole after failing in blocks")  # not reached: the same decoder


TEXT_BLOCK = 1 << 24  # bytes decoded at a time


def _streamed(p: Path, encoding: str, out: Path | None) -> bool:
    """Decode the file block by block (writing its UTF-8 text to ``out`` when given); False when it fails."""
    import codecs

    decoder = codecs.getincrementaldecoder(encoding)()
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
    try:
        sink = open(out, "w", encoding="utf-8") if out is not None else contextlib.nullcontext()  # noqa: SIM115
        with open(p, "rb") as src, sink as dst:
            while block := src.read(TEXT_BLOCK):
                text = decoder.decode(block)
                if dst is not None:
                    dst.write(text)
            text = decoder.decode(b"", final=True)
            if dst is not None:
                dst.write(text)
    except UnicodeDecodeError:
        return False
    return True


def _json_records(parse: Path, p: Path, fmt: str, key: str, parser_error: str) -> Loaded:
    """Read a JSON (Lines) file that the fast parser refused: a syntax error names the file's own line; records
    that are not objects are set aside (reason -> lines) for the caller to count."""
    import datasets

    text = parse.read_text(encoding="utf-8")
    bad: dict[str, list[int]] = {}
    if fmt == "jsonl":
        records, lines = [], []
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{key}={p}: line {n} is not JSON ({e.msg} at column {e.colno}); fix or remove "
                                f"that line") from None
            if isinstance(value, dict):
                records.append(value)
                lines.append(n)
            else:
                bad.setdefault(f"a JSON {_json_type(value)} instead of an object", []).append(n)
    else:
        try:
            value = json.loads(text)
        except json.JSONDecodeError as e:
            raise DataError(f"{key}={p}: line {e.lineno} is not JSON ({e.msg} at column {e.colno}); fix the "
                            f"file") from None
        value = value.get("data", value) if isinstance(value, dict) else value
        if not isinstance(value, list):
            raise DataError(f"{key}={p}: holds a JSON {_json_type(value)}, not a list of records; write one "
                            f"object per record")
        records, lines = [], []
        for i, v in enumerate(value, 1):
            if isinstance(v, dict):
                records.append(v)
                lines.append(i)
            else:
                bad.setdefault(f"a JSON {_json_type(v)} instead of an object", []).append(i)
    if not bad:  # every record an object, and still refused: types that differ between records
        raise DataError(f"{key}={p}: cannot parse as {fmt}: {parser_error}; give each column one type in every "
                        f"record")
    try:
        ds = datasets.Dataset.from_list(records)
    except Exception as e:  # noqa: BLE001 - pyarrow's type errors come as several classes
        raise DataError(f"{key}={p}: cannot parse as {fmt}: {_root_message(e)}") from None
    return Loaded(ds, parse, fmt, bad, lines)


def _json_type(value) -> str:
    return {list: "array", str: "string", bool: "boolean", type(None): "null", int: "number",
            float: "number"}.get(type(value), type(value).__name__)


def _has_data_field(p: Path) -> bool:
    """A JSON object with a "data" list (some exports wrap the records so)."""
    with open(p, "rb") as f:
        head = f.read(4096).lstrip()
    return head.startswith(b"{") and b'"data"' in head


def _root_message(e: BaseException) -> str:
    while e.__cause__ is not None or e.__context__ is not None:
        e = e.__cause__ or e.__context__
    text = str(e).strip().splitlines()
    return text[0][:300] if text else type(e).__name__


MEDIA_COLUMNS = ("images", "videos", "audios")  # LLaMA-Factory's names for a row's images, videos, audios
UNSUPPORTED_MEDIA = ("videos", "audios")


def require_columns(ds, columns: dict[str, str], key: str, path: str, hint: str = "",
                    info: str | None = None, images: str | None = None) -> None:
    """``columns`` maps a config key (``text_column``) to the column name it holds; ``info``: the
    dataset_info.json whose entry mapped the columns (the fix is there, not in a data.* key); ``images``: the
    images column a vision-language model reads (None: a text model, which would not see them)."""
    have = set(ds.column_names)
    if media := sorted(have & set(UNSUPPORTED_MEDIA)):
        raise DataError(f"{key}={path}: its rows have a '{media[0]}' column (LLaMA-Factory's multimodal data); "
                        f"{media[0]} are not supported (images are, with a vision-language model): give rows "
                        f"without them")
    if images is None and "images" in have:
        raise DataError(f"{key}={path}: its rows have an 'images' column, and model.name_or_path is a text model "
                        f"that would not see them; use a vision-language model (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, "
                        f"Gemma 3) or text-only data")
    for setting, col in columns.items():
        if col not in have:
            fix = (f"fix the \"columns\" of this entry in {info}" if info else f"set data.{setting} to one of them")
            raise DataError(f"{key}={path}: column '{col}' is missing (columns: {', '.join(sorted(have))}); "
                            f"{fix}{hint}")


def content_hash(path: str) -> str:
    """sha256 of a file, or of every file of a directory (names and contents)."""
    h = hashlib.sha256()
    p = Path(path).expanduser()
    files = sorted(q for q in p.rglob("*") if q.is_file()) if p.is_dir() else [p]
    for q in files:
        h.update(str(q.relative_to(p) if p.is_dir() else q.name).encode())
        with open(q, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


DEMO_FILES = ("sentiment.jsonl", "sentiment.csv", "reviews.jsonl", "alpaca.json", "chat.jsonl")


def not_found(key: str, path: str) -> DataError:
    p = Path(path)
    if p.name in DEMO_FILES:  # an example config's data, not generated yet
        return DataError(f"{key}={path}: file not found; it is example data scaletrain generates: python -m "
                         f"scaletrain.data.demo {p.parent} (make demo does it too)")
    return DataError(f"{key}={path}: file not found; check the path (relative paths are from the working directory)")


def exists(src: Source) -> None:
    if not Path(src.path).expanduser().exists():
        raise not_found(src.key, src.path)


def check_files(d: DataConfig, task: str, stage: str = "sft") -> None:
    """Every data file the config names exists and has a format scaletrain reads (doctor; train reads them)."""
    for src in sources(d, task, stage) + eval_sources(d, stage):
        exists(src)
        file_format(src.path, src.file_format, src.key)
