"""Checkpointing: the ``Checkpointer`` component (manager.py) and the storage half it writes through
(storage.py: layout, manifest and checksums, atomic commit, agreement on write errors)."""

from scaletrain.checkpoint.manager import Checkpointer, Restored, rng_state, set_rng_state
from scaletrain.checkpoint.storage import LOCAL, LocalStorage, Storage, list_checkpoints, resume_point, verify

__all__ = ["LOCAL", "Checkpointer", "LocalStorage", "Restored", "Storage", "list_checkpoints", "resume_point",
           "rng_state", "set_rng_state", "verify"]
