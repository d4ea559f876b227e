"""Checkpointing: the ``Checkpointer`` component (manager.py) and the storage half it writes through
(storage.py: layout, manifest and checksums, atomic commit, agreement on write errors; object_storage.py: the
object-store backend). ``checkpoints_of`` chooses the backend, here above both, so neither imports the other."""

from __future__ import annotations

from pathlib import Path

from scaletrain.checkpoint.manager import Checkpointer, Restored, rng_state, set_rng_state
from scaletrain.checkpoint.object_storage import ObjectStorage
from scaletrain.checkpoint.storage import LOCAL, LocalStorage, Storage, list_checkpoints, resume_point, verify
from scaletrain.rundir import RunDir

__all__ = ["LOCAL", "Checkpointer", "LocalStorage", "ObjectStorage", "Restored", "Storage", "checkpoints_of",
           "list_checkpoints", "resume_point", "rng_state", "set_rng_state", "verify"]


def checkpoints_of(run_dir: str | Path, store=None) -> tuple[Path, Storage]:
    """Where a run's checkpoints live, and their storage: the run directory's folder, or the folder of its store
    (storage/uri.py ``Store``) when the run lives on object storage."""
    if store is None:
        return RunDir(run_dir).checkpoints, LOCAL
    return ObjectStorage.root_of(store.child(RunDir.CHECKPOINTS)), ObjectStorage(store)
