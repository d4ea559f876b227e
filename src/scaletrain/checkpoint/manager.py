"""``Checkpointer``: save and restore everything a resume needs; it owns its own state.

Like torchtitan's ``CheckpointManager``, it is built once with the parts to save and keeps what belongs to
checkpointing: the async save in flight, the process group its background writer uses, and what a restore
found. The model and optimizer are saved sharded with ``torch.distributed.checkpoint``: every rank writes its
own shard (FSDP's DTensors; DDP's replicated tensors once), nothing is gathered onto one rank, and a resume loads
each rank's part into the sharding it has now, on any world size (DCP reshards). The small states (scheduler,
grad scaler, training progress: anything with ``state_dict``/``load_state_dict``) and the world size and
accumulation the run had go into one file; each rank's RNG into its own. The files, the manifest and the commit
are the storage half's (``storage.py``).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch
import torch.distributed as dist

from scaletrain.checkpoint import storage as st
from scaletrain.comm.context import DistContext
from scaletrain.config.schema import CheckpointConfig

log = st.log


class Stateful(Protocol):
    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


@dataclass(frozen=True)
class Restored:
    """What a restore found: the checkpoint, and the world size and accumulation the run was saved with."""

    path: Path
    world_size: int | None
    accumulation: int | None


@dataclass
class _Pending:
    """An async save whose shards are still being written: the rest is written once they are."""

    future: object
    tmp: Path
    final: Path
    step: int
    small: dict
    rng: dict


class Checkpointer:
    """``states``: the small parts, saved by name (None: nothing to save, e.g. no grad scaler)."""

    def __init__(self, root: Path, ctx: DistContext, cfg: CheckpointConfig, model: torch.nn.Module,
                 optimizer: torch.optim.Optimizer, trainable_only: bool, states: dict[str, Stateful | None],
                 storage: st.Storage = st.LOCAL, rank_states: dict[str, Stateful] | None = None):
        self.root, self.ctx, self.cfg, self.storage = Path(root), ctx, cfg, storage
        self.model, self.optimizer, self.trainable_only, self.states = model, optimizer, trainable_only, states
        self.rank_states = rank_states or {}  # each rank's own (GRPO's rollouts), beside its RNG
        self.pending: _Pending | None = None
        self.restored: Restored | None = None
        self._group = None
        self.fail_next_write = False  # fault injection (worker/faults.py: ioerror): the next save's write fails

    def save(self, step: int, meta: dict) -> Path:
        """Collective: every rank calls it. Keeps the newest ``cfg.save_total_limit``; returns the checkpoint's
        path (with ``async_save`` it is complete once ``flush`` or the next save returns: training goes on while
        DCP writes the shards from a copy staged in host memory). ``meta``: saved beside the states (the world
        size and accumulation the run has)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

        self.flush()  # the previous async save first: one at a time, in order
        final = self.root / st.step_name(step)
        tmp = self.storage.staging(final)
        # a LoRA run keeps only the trainable adapter
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer,
                                            options=StateDictOptions(ignore_frozen_params=self.trainable_only))
        failed = st.writing(lambda: self.storage.fresh(tmp)) if self.ctx.is_main else None
        st.agree(self.storage, failed, tmp)
        small = {**meta, **{name: s.state_dict() if s is not None else None for name, s in self.states.items()}}
        sharded = {"model": model_sd, "optim": optim_sd}
        writer = (st.failing_writer if self.fail_next_write else self.storage.dcp_writer)(tmp / st.STATE_DIR)
        self.fail_next_write = False
        import torch.distributed.checkpoint as dcp

        if self.cfg.async_save:
            future = dcp.async_save(sharded, storage_writer=writer, process_group=self._writer_group())
            self.pending = _Pending(future, tmp, final, step, small, self._rank_file())
            return final
        st.agree(self.storage, st.writing(lambda: dcp.save(sharded, storage_writer=writer)), tmp)
        self._complete(tmp, final, step, small, self._rank_file())
        return final

    def _rank_file(self) -> dict:
        return {**rng_state(), "rank_states": {name: s.state_dict() for name, s in self.rank_states.items()}}

    def flush(self) -> None:
        """Collective: wait for an async save in flight and complete it (manifest, commit, rotation)."""
        pending, self.pending = self.pending, None
        if pending is None:
            return
        st.agree(self.storage, st.writing(pending.future.result), pending.tmp)
        self._complete(pending.tmp, pending.final, pending.step, pending.small, pending.rng)

    def _writer_group(self):
        """A gloo group of its own for the background writer's collectives (they must not interleave with the
        training's on the default group)."""
        if self._group is None and dist.is_available() and dist.is_initialized():
            self._group = dist.new_group(backend="gloo")
        return self._group

    def _complete(self, tmp: Path, final: Path, step: int, small: dict, rng: dict) -> None:
        rank, storage = self.ctx.world_rank, self.storage
        failed = st.writing(lambda: storage.save_torch(rng, tmp / st.rng_file(rank)))
        if self.ctx.is_main and failed is None:
            failed = st.writing(lambda: storage.save_torch(small, tmp / st.TRAINER_STATE))
        st.agree(storage, failed, tmp)
        # the manifest last: it is what makes the checkpoint exist
        st.agree(storage, st.writing(lambda: st.write_manifest(storage, tmp, step)) if self.ctx.is_main else None, tmp)
        if self.ctx.is_main:
            storage.commit(tmp, final)
            st.rotate(storage, self.root, self.cfg.save_total_limit)
        st.barrier()

    def saved(self) -> list[str]:
        """The names of the checkpoints there are, oldest first."""
        return [p.name for p in self.storage.checkpoints(self.root)]

    def restore_latest(self) -> Restored | None:
        """Load the newest whole checkpoint (collective), falling back past broken newer ones with a warning."""
        ckpt, unusable = st.resume_point(self.root, self.storage)
        for name, problem in unusable:
            log.warning("checkpoint %s is unusable (%s); falling back to the previous one", name, problem)
        return self.restore(ckpt) if ckpt is not None else None

    def restore(self, ckpt: Path) -> Restored:
        """Load ``ckpt`` into the model, optimizer and states, in the sharding they have now (collective). The
        RNG is restored only on the world size it was saved with (another size draws differently anyway)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

        strict = not self.trainable_only
        legacy = isinstance(self.storage, st.LocalStorage) and (ckpt / st.LEGACY_MODEL).is_file()
        if legacy:  # an earlier version's full-state checkpoint
            model_sd = torch.load(ckpt / st.LEGACY_MODEL, weights_only=True)
            optim_sd = torch.load(ckpt / st.LEGACY_OPTIM, weights_only=True)
            opts = StateDictOptions(full_state_dict=True, strict=strict)
        else:
            import torch.distributed.checkpoint as dcp

            opts = StateDictOptions(ignore_frozen_params=self.trainable_only, strict=strict)
            model_sd, optim_sd = get_state_dict(self.model, self.optimizer, options=opts)  # the shapes to load into
            sharded = {"model": model_sd, "optim": optim_sd}
            dcp.load(sharded, storage_reader=self.storage.dcp_reader(ckpt / st.STATE_DIR))
            model_sd, optim_sd = sharded["model"], sharded["optim"]
        set_state_dict(self.model, self.optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd, options=opts)
        small = self.storage.load_torch(ckpt / st.TRAINER_STATE)
        for name, state in self.states.items():
            if state is not None and small.get(name):
                state.load_state_dict(small[name])
        world_size = small.get("world_size")
        if world_size in (None, self.ctx.world_size):
            rng = self.storage.load_torch(ckpt / st.rng_file(self.ctx.world_rank))
            if rng is not None:
                set_rng_state(rng)
                for name, state in self.rank_states.items():
                    if (rng.get("rank_states") or {}).get(name) is not None:
                        state.load_state_dict(rng["rank_states"][name])
        self.restored = Restored(ckpt, world_size, small.get("accumulation"))
        return self.restored


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
