"""A run named on the command line (``--resume``, ``report``, ``watch``): a local directory, or a URI fetched into
a mirror with the ``storage.*`` overrides given beside it. Here, above both the config schema and the mirror, so
that storage/ never imports the config it is configured by."""

from __future__ import annotations

from pathlib import Path

from scaletrain.config.schema import StorageConfig
from scaletrain.storage.mirror import fetch_run
from scaletrain.storage.uri import is_uri


def local_run(run_dir: str, overrides: list[str], what: str) -> Path:
    """The local directory of ``run_dir``: itself, or for a URI the mirror it is fetched into (with the
    ``storage.*`` overrides given on the command line: its endpoint, where mirrors go)."""
    if not is_uri(run_dir):
        return Path(run_dir).expanduser().resolve()
    given = dict(o.split("=", 1) for o in overrides if o.startswith("storage.") and "=" in o)
    storage_cfg = StorageConfig(**{k.removeprefix("storage."): v for k, v in given.items()})
    return fetch_run(run_dir, storage_cfg, what)
