"""Save and restore everything a resume needs, atomically and with checksums.

Layout: ``checkpoints/step-<N>/`` holds ``state/`` (``torch.distributed.checkpoint``: every rank writes its
own shard of the model and optimizer state, replicated tensors once, plus DCP's ``.metadata``),
``trainer_state.pt`` (step, epoch, data position, the world size and accumulation it was saved with,
scheduler, grad-scaler), ``rng-rank<R>.pt`` per rank and ``manifest.json`` (sha256 of every file).
Nothing is gathered onto one rank: FSDP's savings last through the save, and a resume loads each rank's part
in the sharding it has now, on any world size (DCP reshards). A checkpoint is written under
``.tmp-step-<N>`` and renamed once complete, so a crash leaves either a whole checkpoint or an ignorable
temporary directory. Written on a filesystem all ranks share (the run directory). Checkpoints of earlier
versions (``model.pt``/``optimizer.pt``, full state) still resume.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from scaletrain.rundir import RunDir

if TYPE_CHECKING:
    from scaletrain.worker.trainer import Trainer

log = logging.getLogger("scaletrain.checkpoint")

MANIFEST = "manifest.json"
STATE_DIR = "state"  # DCP's shards and metadata


@dataclass
class TrainState:
    step: int = 0  # optimizer steps done
    epoch: int = 0
    micro_batches_in_epoch: int = 0  # data position inside `epoch`


def _barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def rng_state() -> dict:
    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    try:
        import numpy as np

        state["numpy"] = np.random.get_state()
    except ImportError:
        pass
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
    if "numpy" in state:
        import numpy as np

        np.random.set_state(state["numpy"])


@dataclass
class _Pending:
    """An async save whose shards are still being written: the rest is written once they are."""

    future: object
    tmp: Path
    final: Path
    step: int
    keep: int
    trainer_state: dict
    rng: dict


def save(t: Trainer, keep: int) -> Path:
    """Collective: every rank calls it. Keeps the newest ``keep``; returns the checkpoint's directory (with
    checkpoint.async_save it is complete once ``flush`` or the next save returns: training goes on while DCP
    writes the shards from a copy staged in host memory)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    flush(t)  # the previous async save first: one at a time, in order
    state, rank, scaler = t.progress, t.ctx.world_rank, t.precision.scaler
    root = t.run_dir.checkpoints
    final = root / f"step-{state.step}"
    tmp = root / f".tmp-step-{state.step}"
    # Sharded (FSDP: each rank its DTensor shards; DDP: DCP writes each replicated tensor once); a LoRA run keeps
    # only the trainable adapter.
    model_sd, optim_sd = get_state_dict(t.model, t.optimizer, options=StateDictOptions(ignore_frozen_params=t.lora))
    failed = _writing(tmp, lambda: _fresh(tmp)) if rank == 0 else None
    _agree(failed, tmp, root)
    trainer_state = {"train_state": asdict(state), "world_size": t.ctx.world_size,
                     "accumulation": t.cfg.train.gradient_accumulation_steps, "scheduler": t.scheduler.state_dict(),
                     "scaler": scaler.state_dict() if scaler is not None else None}
    if t.cfg.checkpoint.async_save:
        import torch.distributed.checkpoint as dcp

        future = dcp.async_save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(tmp / STATE_DIR),
                                process_group=_checkpoint_group(t))
        t.pending_save = _Pending(future, tmp, final, state.step, keep, trainer_state, rng_state())
        return final
    failed = _writing(tmp, lambda: _dcp_save({"model": model_sd, "optim": optim_sd}, tmp / STATE_DIR))
    _agree(failed, tmp, root)
    _complete(t, tmp, final, state.step, keep, trainer_state, rng_state())
    return final


def flush(t: Trainer) -> None:
    """Collective: wait for an async save in flight and complete it (manifest, rename, rotation)."""
    pending, t.pending_save = getattr(t, "pending_save", None), None
    if pending is None:
        return
    root = pending.tmp.parent
    failed = _writing(pending.tmp, lambda: _result(pending.future))
    _agree(failed, pending.tmp, root)
    _complete(t, pending.tmp, pending.final, pending.step, pending.keep, pending.trainer_state, pending.rng)


def _result(future) -> None:
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        future.result()
    except CheckpointException as e:
        _raise_os_cause(e)
        raise


def _checkpoint_group(t: Trainer):
    """A gloo group of its own for the background writer's collectives (they must not interleave with the
    training's on the default group)."""
    if not (dist.is_available() and dist.is_initialized()):
        return None
    if getattr(t, "checkpoint_group", None) is None:
        t.checkpoint_group = dist.new_group(backend="gloo")
    return t.checkpoint_group


def _complete(t: Trainer, tmp: Path, final: Path, step: int, keep: int, trainer_state: dict, rng: dict) -> None:
    rank, root = t.ctx.world_rank, tmp.parent
    failed = _writing(tmp, lambda: _save(rng, tmp / f"rng-rank{rank}.pt"))
    if rank == 0 and failed is None:
        failed = _writing(tmp, lambda: _save(trainer_state, tmp / "trainer_state.pt"))
    _agree(failed, tmp, root)
    if rank == 0:
        failed = _writing(tmp, lambda: _write_manifest(tmp, step))
    _agree(failed, tmp, root)
    if rank == 0:
        if final.exists():
            # Only after resuming past it (it failed verification): keep it for inspection, out of the way.
            aside = final.with_name(f"{final.name}.unusable-{int(time.time())}")
            os.replace(final, aside)
            log.warning("moved the earlier %s aside to %s", final.name, aside.name)
        os.replace(tmp, final)
        _rotate(root, keep)
    _barrier()


def _fresh(tmp: Path) -> None:
    if tmp.exists():
        shutil.rmtree(tmp)  # our own leftover from a crash at this very step
    tmp.mkdir(parents=True, mode=0o750)


def _dcp_save(state: dict, path: Path) -> None:
    """Collective. A rank whose write fails makes DCP fail on every rank (CheckpointException): its OSError is
    raised here, so that _writing words it like any other write."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        dcp.save(state, checkpoint_id=str(path))
    except CheckpointException as e:
        _raise_os_cause(e)
        raise


def _raise_os_cause(e: BaseException) -> None:
    """Raise the OSError behind a CheckpointException's rank failures, if there is one.
    failures: rank -> (exception, its stack) (torch.distributed.checkpoint.utils._wrap_exception)."""
    for c in getattr(e, "failures", {}).values():
        cause = _os_cause(c[0] if isinstance(c, tuple) else c)
        if cause is not None:
            raise cause from None


def _os_cause(e: BaseException) -> OSError | None:
    while e is not None:
        if isinstance(e, OSError):
            return e
        e = e.__cause__ or e.__context__
    return None


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


def _save(obj, path: Path) -> None:
    with open(path, "wb") as f:
        sink = _KeepsWriteError(f)
        try:
            torch.save(obj, sink)
        except RuntimeError:
            if sink.error is not None:
                raise sink.error from None
            raise


def _write_manifest(tmp: Path, step: int) -> None:
    files = sorted(p for p in tmp.rglob("*") if p.is_file())
    manifest = {"step": step, "files": {str(p.relative_to(tmp)): _sha256(p) for p in files}}
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1))


def _writing(tmp: Path, write) -> str | None:
    """Run ``write``; a failure of the storage (ENOSPC, EACCES, EIO, ...) is returned as one line, not raised,
    so that every rank learns of it at the next agreement and none is left waiting at a barrier."""
    try:
        write()
    except OSError as e:
        return f"{e.strerror or e}" + (f" [errno {e.errno}]" if e.errno else "")
    return None


def _agree(failed: str | None, tmp: Path, root: Path) -> None:
    """Collective: if any rank failed to write, every rank raises the same StorageError, after rank 0 removed the
    partial temporary directory (the previous checkpoint is untouched)."""
    from scaletrain.errors import StorageError

    problems = [failed]
    if dist.is_available() and dist.is_initialized():
        problems = [None] * dist.get_world_size()
        dist.all_gather_object(problems, failed)
    bad = [(r, p) for r, p in enumerate(problems) if p]
    if not bad:
        return
    shutil.rmtree(tmp, ignore_errors=True)
    _barrier()
    free = free_bytes(root)
    ranks = ", ".join(f"rank {r}: {p}" for r, p in bad)
    raise StorageError(f"checkpoint {tmp.name.removeprefix('.tmp-')} could not be written to {root} ({ranks}; "
                       f"{free / 2**20:.0f} MiB free there); the previous checkpoint is intact: free space (or "
                       f"fix permissions), then scaletrain train --resume {root.parent}")


def free_bytes(path: Path) -> int:
    """Free bytes on the filesystem holding ``path`` (or its nearest existing parent)."""
    p = Path(path)
    while not p.exists() and p != p.parent:
        p = p.parent
    return shutil.disk_usage(p).free


def _rotate(root: Path, keep: int) -> None:
    """Keep this run's newest ``keep`` checkpoints (checkpoint.save_total_limit)."""
    for old in list_checkpoints(root)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def list_checkpoints(root: Path) -> list[Path]:
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and p.name.startswith("step-") and p.name[5:].isdigit()]
    return sorted(found, key=lambda p: int(p.name[5:]))


def verify(ckpt: Path) -> str | None:
    """None when the checkpoint is whole, else what is wrong with it."""
    mf = ckpt / MANIFEST
    if not mf.is_file():
        return "no manifest (partial write)"
    try:
        files = json.loads(mf.read_text())["files"]
        files = {str(name): str(digest) for name, digest in files.items()}
    except (ValueError, KeyError, TypeError, AttributeError):  # not JSON, not UTF-8, not the manifest's shape
        return "unreadable manifest"
    for name, digest in files.items():
        p = ckpt / name
        if not p.is_file():
            return f"{name} is missing"
        if _sha256(p) != digest:
            return f"{name} fails its checksum"
    return None


def resume_point(run_dir) -> tuple[Path | None, list[tuple[str, str]]]:
    """The newest whole checkpoint, and the newer ones that are not (name, what is wrong), newest first."""
    unusable = []
    for ckpt in reversed(list_checkpoints(RunDir(run_dir).checkpoints)):
        problem = verify(ckpt)
        if problem is None:
            return ckpt, unusable
        unusable.append((ckpt.name, problem))
    return None, unusable


def latest_valid(run_dir) -> Path | None:
    """Newest checkpoint that passes its checksums; a broken newer one is skipped with a warning."""
    for ckpt in reversed(list_checkpoints(RunDir(run_dir).checkpoints)):
        problem = verify(ckpt)
        if problem is None:
            return ckpt
        log.warning("checkpoint %s is unusable (%s); falling back to the previous one", ckpt.name, problem)
    return None


def restore(ckpt: Path, t: Trainer) -> TrainState:
    """Load ``ckpt`` into the trainer (collective). The sharded state loads into the sharding the trainer has now,
    on any world size; the data position is carried as optimizer steps into the epoch (the samples of a step
    depend on the global batch only, worker/sampler.py), so a resume on another world size with the same global
    batch repeats and skips nothing. Returns the progress (also set on the trainer)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

    if (ckpt / "model.pt").is_file():  # an earlier version's full-state checkpoint
        model_sd = torch.load(ckpt / "model.pt", weights_only=True)
        optim_sd = torch.load(ckpt / "optimizer.pt", weights_only=True)
        opts = StateDictOptions(full_state_dict=True, strict=not t.lora)
    else:
        import torch.distributed.checkpoint as dcp

        opts = StateDictOptions(ignore_frozen_params=t.lora, strict=not t.lora)
        model_sd, optim_sd = get_state_dict(t.model, t.optimizer, options=opts)  # the shapes to load into
        state = {"model": model_sd, "optim": optim_sd}
        dcp.load(state, checkpoint_id=str(ckpt / STATE_DIR))
        model_sd, optim_sd = state["model"], state["optim"]
    set_state_dict(t.model, t.optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd, options=opts)
    saved = torch.load(ckpt / "trainer_state.pt", weights_only=False)
    t.scheduler.load_state_dict(saved["scheduler"])
    if t.precision.scaler is not None and saved["scaler"]:
        t.precision.scaler.load_state_dict(saved["scaler"])
    progress = TrainState(**saved["train_state"])
    saved_accum = saved.get("accumulation", t.cfg.train.gradient_accumulation_steps)
    t.restored_world_size, t.restored_accumulation = saved.get("world_size"), saved_accum
    if saved.get("world_size", t.ctx.world_size) == t.ctx.world_size:
        rng_file = ckpt / f"rng-rank{t.ctx.world_rank}.pt"
        if rng_file.exists():
            set_rng_state(torch.load(rng_file, weights_only=False))
    # micro-batches per rank -> optimizer steps into the epoch -> this world size's micro-batches
    steps_in_epoch = progress.micro_batches_in_epoch // saved_accum
    progress.micro_batches_in_epoch = steps_in_epoch * t.cfg.train.gradient_accumulation_steps
    t.progress = progress
    return t.progress
