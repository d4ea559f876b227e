"""The storage half of checkpointing: the layout of one checkpoint, its manifest of checksums, the atomic commit
and every rank agreeing on a write error. Behind ``Storage``, a small interface with two backends:
``LocalStorage``, a POSIX filesystem all ranks share (the run directory), and ``ObjectStorage``, an object store
(S3, GCS, Azure through fsspec; object_storage.py) that every rank writes its shards to directly, where there
is no atomic rename and the manifest, written last, is the commit marker.

Layout of ``checkpoints/step-<N>/``: ``state/`` (DCP's shards and ``.metadata``), ``trainer_state.pt`` (the
small states and the world size and accumulation the run had), ``rng-rank<R>.pt`` per rank and
``manifest.json`` (sha256 of every other file). Written under ``.tmp-step-<N>`` and committed once whole.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Protocol

import torch
import torch.distributed as dist

log = logging.getLogger("scaletrain.checkpoint")

MANIFEST = "manifest.json"
STATE_DIR = "state"  # DCP's shards and metadata
TRAINER_STATE = "trainer_state.pt"
LEGACY_MODEL, LEGACY_OPTIM = "model.pt", "optimizer.pt"  # full-state checkpoints of earlier versions
STEP_PREFIX, TMP_PREFIX = "step-", ".tmp-"


def step_name(step: int) -> str:
    return f"{STEP_PREFIX}{step}"


def rng_file(rank: int) -> str:
    return f"rng-rank{rank}.pt"


class Storage(Protocol):
    """Where checkpoint files live. Paths are ``Path``s of this storage's namespace."""

    def staging(self, final: Path) -> Path: ...  # where a checkpoint is written before it is committed

    def fresh(self, path: Path) -> None: ...  # an empty directory at ``path`` (a leftover there is removed)

    def commit(self, tmp: Path, final: Path) -> None: ...  # ``tmp`` becomes ``final``, whole or not at all

    def remove(self, path: Path) -> None: ...

    def checkpoints(self, root: Path) -> list[Path]: ...  # committed step directories, oldest first

    def files(self, path: Path) -> list[str]: ...  # every file below ``path``, relative to it

    def sha256(self, path: Path) -> str | None: ...  # None when the file is missing

    def read_text(self, path: Path) -> str | None: ...  # None when the file is missing

    def write_text(self, path: Path, text: str) -> None: ...

    def save_torch(self, obj, path: Path) -> None: ...

    def load_torch(self, path: Path): ...  # None when the file is missing

    def free_bytes(self, path: Path) -> int | None: ...  # None: the storage has no such limit to report

    def dcp_writer(self, path: Path): ...  # DCP's StorageWriter for the shards below ``path``

    def dcp_reader(self, path: Path): ...

    def describe(self, path: Path) -> str: ...  # ``path`` as the user knows it (a URI for an object store)


class LocalStorage:
    """A filesystem every rank sees (the run directory): commit is an atomic rename."""

    def staging(self, final: Path) -> Path:
        return final.with_name(f"{TMP_PREFIX}{final.name}")

    def fresh(self, path: Path) -> None:
        if path.exists():
            shutil.rmtree(path)  # our own leftover from a crash at this very step
        path.mkdir(parents=True, mode=0o750)

    def commit(self, tmp: Path, final: Path) -> None:
        if final.exists():
            # Only after resuming past it (it failed verification): keep it for inspection, out of the way.
            aside = final.with_name(f"{final.name}.unusable-{int(time.time())}")
            os.replace(final, aside)
            log.warning("moved the earlier %s aside to %s", final.name, aside.name)
        os.replace(tmp, final)

    def remove(self, path: Path) -> None:
        shutil.rmtree(path, ignore_errors=True)

    def checkpoints(self, root: Path) -> list[Path]:
        if not root.is_dir():
            return []
        found = [p for p in root.iterdir() if p.is_dir() and p.name.startswith(STEP_PREFIX)
                 and p.name[len(STEP_PREFIX):].isdigit()]
        return sorted(found, key=lambda p: int(p.name[len(STEP_PREFIX):]))

    def files(self, path: Path) -> list[str]:
        return sorted(str(p.relative_to(path)) for p in path.rglob("*") if p.is_file())

    def sha256(self, path: Path) -> str | None:
        if not path.is_file():
            return None
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        return h.hexdigest()

    def read_text(self, path: Path) -> str | None:
        return path.read_text() if path.is_file() else None

    def write_text(self, path: Path, text: str) -> None:
        path.write_text(text)

    def save_torch(self, obj, path: Path) -> None:
        with open(path, "wb") as f:
            sink = _KeepsWriteError(f)
            try:
                torch.save(obj, sink)
            except RuntimeError:
                if sink.error is not None:
                    raise sink.error from None
                raise

    def load_torch(self, path: Path):
        return torch.load(path, weights_only=False) if path.is_file() else None

    def free_bytes(self, path: Path) -> int:
        """Free bytes on the filesystem holding ``path`` (or its nearest existing parent)."""
        p = Path(path)
        while not p.exists() and p != p.parent:
            p = p.parent
        return shutil.disk_usage(p).free

    def dcp_writer(self, path: Path):
        from torch.distributed.checkpoint import FileSystemWriter

        return FileSystemWriter(str(path))

    def dcp_reader(self, path: Path):
        from torch.distributed.checkpoint import FileSystemReader

        return FileSystemReader(str(path))

    def describe(self, path: Path) -> str:
        return str(path)



LOCAL = LocalStorage()


def failing_writer(path: Path):
    """A DCP writer whose write fails midway with an I/O error, after its first file exists (fault injection: a
    storage fault that is not a full disk)."""
    import errno

    from torch.distributed.checkpoint import FileSystemWriter

    class Failing(FileSystemWriter):
        def write_data(self, plan, planner):
            Path(path).mkdir(parents=True, exist_ok=True)
            (Path(path) / "__partial__.distcp").write_bytes(b"\0" * 4096)  # some bytes landed, then the device failed
            raise OSError(errno.EIO, "Input/output error (injected)", str(path))

    return Failing(str(path))


class _KeepsWriteError:
    """A file torch.save writes through that keeps the OSError of a failed write: torch's zip writer turns it
    into a RuntimeError without the errno ("unexpected pos ..."), which says nothing about a full disk."""

    def __init__(self, f):
        self.f, self.error = f, None

    def write(self, b):
        try:
            return self.f.write(b)
        except OSError as e:
            self.error = e
            raise

    def flush(self):
        self.f.flush()


def write_manifest(storage: Storage, tmp: Path, step: int) -> None:
    manifest = {"step": step, "files": {name: storage.sha256(tmp / name) for name in storage.files(tmp)}}
    storage.write_text(tmp / MANIFEST, json.dumps(manifest, indent=1))


def verify(ckpt: Path, storage: Storage = LOCAL) -> str | None:
    """None when the checkpoint is whole, else what is wrong with it."""
    try:
        text = storage.read_text(ckpt / MANIFEST)
    except UnicodeDecodeError:
        return "unreadable manifest"
    if text is None:
        return "no manifest (partial write)"
    try:
        files = {str(name): str(digest) for name, digest in json.loads(text)["files"].items()}
    except (ValueError, KeyError, TypeError, AttributeError):  # not JSON, not the manifest's shape
        return "unreadable manifest"
    for name, digest in files.items():
        actual = storage.sha256(ckpt / name)
        if actual is None:
            return f"{name} is missing"
        if actual != digest:
            return f"{name} fails its checksum"
    return None


def list_checkpoints(root: Path, storage: Storage = LOCAL) -> list[Path]:
    return storage.checkpoints(Path(root))


def resume_point(root: Path, storage: Storage = LOCAL) -> tuple[Path | None, list[tuple[str, str]]]:
    """The newest whole checkpoint under ``root`` (a run's checkpoints folder), and the newer ones that are not
    (name, what is wrong), newest first."""
    unusable = []
    for ckpt in reversed(storage.checkpoints(Path(root))):
        problem = verify(ckpt, storage)
        if problem is None:
            return ckpt, unusable
        unusable.append((ckpt.name, problem))
    return None, unusable


def rotate(storage: Storage, root: Path, keep: int) -> None:
    """Keep the newest ``keep`` checkpoints (checkpoint.save_total_limit)."""
    for old in storage.checkpoints(root)[:-keep]:
        storage.remove(old)


def writing(write) -> str | None:
    """Run ``write``; a failure of the storage (ENOSPC, EACCES, EIO, ...) is returned as one line, not raised,
    so that every rank learns of it at the next agreement and none is left waiting at a barrier. DCP's
    CheckpointException carries the OSError of the rank that failed (in its failures' causes): it is worded
    the same way, so DCP's writes and scaletrain's own take one path."""
    try:
        write()
    except OSError as e:
        return _one_line(e)
    except (Exception, _checkpoint_exception()) as e:  # DCP's CheckpointException is a BaseException
        cause = os_cause(e)
        if cause is not None:
            return _one_line(cause)
        if isinstance(e, _checkpoint_exception()):  # a rank's write failed and the errno was lost on the way
            return _innermost(e)
        raise
    return None


def _innermost(e: BaseException) -> str:
    """``Type: first line`` of the first rank failure of a CheckpointException (torch's stream writer reports a
    full disk as a RuntimeError without the errno: agree() adds the free space, which tells it)."""
    for c in getattr(e, "failures", {}).values():
        inner = c[0] if isinstance(c, tuple) else c
        return f"{type(inner).__name__}: {(str(inner).splitlines() or [''])[0][:200]}"
    return f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"


def _checkpoint_exception() -> type[BaseException]:
    from torch.distributed.checkpoint.api import CheckpointException

    return CheckpointException


def _one_line(e: OSError) -> str:
    return f"{e.strerror or e}" + (f" [errno {e.errno}]" if e.errno else "")


def os_cause(e: BaseException) -> OSError | None:
    """The OSError behind an exception: its causes, or a CheckpointException's rank failures (rank -> (exception,
    its stack), torch.distributed.checkpoint.utils._wrap_exception)."""
    for c in getattr(e, "failures", {}).values():
        found = os_cause(c[0] if isinstance(c, tuple) else c)
        if found is not None:
            return found
    while e is not None:
        if isinstance(e, OSError):
            return e
        e = e.__cause__ or e.__context__
    return None


def agree(storage: Storage, failed: str | None, tmp: Path) -> None:
    """Collective: if any rank failed to write, every rank raises the same StorageError, after the partial
    temporary directory is removed (the previous checkpoint is untouched)."""
    from scaletrain.errors import StorageError

    problems = [failed]
    if dist.is_available() and dist.is_initialized():
        problems = [None] * dist.get_world_size()
        dist.all_gather_object(problems, failed)
    bad = [(r, p) for r, p in enumerate(problems) if p]
    if not bad:
        return
    storage.remove(tmp)
    barrier()
    root = tmp.parent
    free = storage.free_bytes(root)
    ranks = ", ".join(f"rank {r}: {p}" for r, p in bad)
    text = " ".join(p for _, p in bad).lower()
    fix = ("free space" if "no space" in text or "quota" in text else "fix permissions" if "permission" in text
           else "check the storage (its device, mount or network: the error above)")
    space = f"; {free / 2**20:.0f} MiB free there" if free is not None else ""
    raise StorageError(f"checkpoint {tmp.name.removeprefix(TMP_PREFIX)} could not be written to "
                       f"{storage.describe(root)} ({ranks}{space}); the previous checkpoint is intact: {fix}, then "
                       f"scaletrain train --resume {storage.describe(root.parent)}")


def barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
