"""LLaMA-Factory v1's dataset spec files (``data/v1_sft_demo.yaml``): named datasets, each a ``path`` (a local file,
or a hub id), a ``source``, a ``converter`` (how its rows are written), ``size`` (the rows taken) and ``split``.
Read wherever a data set is named (``data.train_file`` may be one); a hub dataset is one line (scaletrain never
downloads), as is a converter it does not read.

A path is read as v1 reads it, from the directory the job runs in, else beside the spec file.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from scaletrain.errors import DataError

SUFFIXES = (".yaml", ".yml")
# v1's converter -> the record format here; none: v1's own rows (messages of typed parts, data/parts.py); pair:
# orca_dpo_pairs' rows, ``chosen`` and ``rejected`` two whole conversations (data/pairs.py reads them as v1's pairs)
CONVERTERS = {"alpaca": "alpaca", "sharegpt": "sharegpt", "pair": "messages", None: "messages"}
NOT_READ: dict[str, str] = {}
LOCAL = ("local", None)


@dataclass(frozen=True)
class Entry:
    name: str
    path: str
    formatting: str
    size: int | None


def is_spec(path: str) -> bool:
    return Path(str(path)).suffix.lower() in SUFFIXES


def read_spec(path: str, key: str) -> list[Entry]:
    """The spec file's datasets, each checked; errors name ``key``, the file and the dataset."""
    import yaml

    p = Path(path).expanduser()
    try:
        spec = yaml.safe_load(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DataError(f"{key}={path}: file not found") from None
    except yaml.YAMLError as e:
        raise DataError(f"{key}={path}: not a valid YAML ({str(e).splitlines()[0]}); fix the syntax") from None
    if not isinstance(spec, dict) or not spec or not all(isinstance(v, dict) for v in spec.values()):
        raise DataError(f"{key}={path}: not a dataset spec file (a mapping of dataset names, each with a path: "
                        f"LLaMA-Factory v1's form); give a data file or a spec file")
    out = []
    for name, entry in spec.items():
        where = f"{key}={path}: dataset {name}"
        if "path" not in entry:
            raise DataError(f"{where} has no path; give the file it reads")
        source, converter = entry.get("source"), entry.get("converter")
        if converter in NOT_READ:
            raise DataError(f"{where}: converter {converter} ({NOT_READ[converter]}) is not read yet; write the "
                            f"rows as chosen/rejected pairs and train with train.stage=dpo")
        if converter not in CONVERTERS:
            raise DataError(f"{where}: converter {converter!r} is not one LLaMA-Factory v1 has (alpaca, sharegpt, "
                            f"pair, or none for its own rows)")
        file = Path(str(entry["path"])).expanduser()
        found = next((f for f in (file, p.parent / file) if f.is_file()), None) if not file.is_absolute() else (
            file if file.is_file() else None)
        if found is None:
            written = str(entry["path"])
            if source not in LOCAL or (not Path(written).suffix and written.count("/") == 1):  # "org/name"
                raise DataError(f"{where}: {written} is a hub dataset{f' (source {source})' if source else ''}; "
                                f"scaletrain never downloads: fetch it to a local file and give its path")
            raise DataError(f"{where}: {written} not found (read from the working directory, then beside "
                            f"{p.name})")
        if entry.get("split") not in (None, "train"):
            raise DataError(f"{where}: split {entry['split']} of a local file: a file is one split; give the file "
                            f"of that split")
        size = entry.get("size")
        if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
            raise DataError(f"{where}: size {size!r}: the number of rows to take (>= 1)")
        out.append(Entry(str(name), str(found), CONVERTERS[converter], size))
    return out
