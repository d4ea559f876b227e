"""Run directories: ``<output_dir>/<run_name>/``, created once and never reused by another run."""

from __future__ import annotations

import time
from pathlib import Path

from scaletrain.errors import LaunchError

# Owner and group only: configs and logs may hold paths and hostnames users consider private.
DIR_MODE = 0o750
RESOLVED_CONFIG = "config.resolved.yaml"  # the config a run used, secrets redacted


def default_run_name(config_path: str | Path, now: float | None = None) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    return f"{Path(config_path).stem}-{stamp}"


def create_run_dir(output_dir: str | Path, run_name: str | None, config_path: str | Path,
                   now: float | None = None) -> Path:
    """Create a fresh run directory atomically (mkdir fails if it exists, so no run is overwritten)."""
    # Absolute: Ray's storage_path and every worker (whatever its cwd) must resolve it the same way.
    root = Path(output_dir).expanduser().resolve()
    try:
        root.mkdir(parents=True, exist_ok=True, mode=DIR_MODE)
    except OSError as e:
        raise LaunchError(f"output.output_dir={output_dir}: cannot create it ({e.strerror}); choose a writable directory") from None
    if run_name:
        path = root / run_name
        try:
            path.mkdir(mode=DIR_MODE)
        except FileExistsError:
            raise LaunchError(f"output.run_name={run_name}: {path} already exists and is never overwritten; "
                              f"choose another run_name, or continue it with --resume {path}") from None
        return path
    base = default_run_name(config_path, now)
    for i in range(1, 1000):
        path = root / (base if i == 1 else f"{base}-{i}")
        try:
            path.mkdir(mode=DIR_MODE)
            return path
        except FileExistsError:
            continue
    raise LaunchError(f"output.output_dir={output_dir}: could not find a free run name for {base}")
