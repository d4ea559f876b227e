"""Objects from the user's own Python files, named ``path/to/file.py:name`` (reward functions, tools, an
environment class), each failure one line naming the key and the fix. The file is imported as a module of its own
(its file name under a prefix), once per process: two keys naming the same file share its module, so a tool and a
reward function of one file see the same globals."""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

from scaletrain.errors import ConfigError


@functools.lru_cache(maxsize=64)
def _module(path: str, mtime_ns: int):
    """The file imported (once per version of it: the cache is keyed by its modification time)."""
    file = Path(path)
    module_spec = importlib.util.spec_from_file_location(f"scaletrain_user_{file.stem}", file)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


def load_object(spec: str, key: str, what: str = "function"):
    """The object ``spec`` (path/to/file.py:name) names; ``key`` (the config key) and ``what`` (function, class)
    for the one-line errors."""
    path, _, name = spec.rpartition(":")
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"{key}: {spec}: no file {file}; give path/to/file.py:{what}")
    try:
        module = _module(str(file.resolve()), file.stat().st_mtime_ns)
    except Exception as e:  # noqa: BLE001 - the user's file: any error in it is named, in one line
        raise ConfigError(f"{key}: {spec}: importing {file} failed: {type(e).__name__}: {e}") from None
    obj = getattr(module, name, None)
    if obj is None:
        have = sorted(k for k, v in vars(module).items() if callable(v) and not k.startswith("_"))
        raise ConfigError(f"{key}: {spec}: {file} has no {name!r} (it has {', '.join(have) or 'none'})")
    if what == "class" and not isinstance(obj, type):
        raise ConfigError(f"{key}: {spec}: {name!r} in {file} is a {type(obj).__name__}, not a class")
    if not callable(obj):
        raise ConfigError(f"{key}: {spec}: {name!r} in {file} is a {type(obj).__name__}, not a {what}")
    return obj
