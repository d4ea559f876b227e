"""What a restart on another number of workers says (elastic, or --resume with another size): when, from N to
M, why, the batch it keeps, the steps trained again (after the checkpoint, before the restart) and, elastic,
the time since the last step before it."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from scaletrain.config.batch import global_batch
from scaletrain.metrics.records import read_jsonl

if TYPE_CHECKING:
    from scaletrain.worker.trainer import Trainer


def resize_note(t: Trainer) -> str | None:
    """None when the run restarted on the size that trained last (or this is not rank 0). The size that trained
    last is the last train record's, else the checkpoint's: a group that shrank and trained past the checkpoint
    then grew back restores a checkpoint of its new size, yet its own steps are trained again on another one."""
    restored = t.checkpointer.restored
    if restored is None or not t.ctx.is_main:
        return None
    trained = [r for r in read_jsonl(t.run_dir.metrics) if r.get("kind") == "train"]
    last = trained[-1] if trained else {}
    old, new = last.get("scaling/workers", restored.world_size), t.ctx.world_size
    if old == new:
        return None
    accumulation = last.get("scaling/gradient_accumulation_steps",
                            restored.accumulation if old == restored.world_size else "?")  # (records before it)
    done = max((r["step"] for r in trained), default=0)
    tr = t.cfg.train
    elastic = t.cfg.scaling.min_workers is not None  # (on its minimum, the config a worker gets is not a range)
    if not elastic:
        why = f"resumed with scaling.num_workers={new}"
    elif new > old:
        why = "elastic: more workers fit"
    else:
        why = "elastic: fewer workers fit (a worker or its node was lost: the failure above)"
    lost = f", {time.time() - max(r['time'] for r in trained):.0f} s since the last step" if (
        elastic and trained) else ""
    return (f"from {old} to {new} worker(s) at step {t.progress.step} ({why}): gradient_accumulation_steps "
            f"{accumulation} -> {tr.gradient_accumulation_steps}, global batch {global_batch(tr, new)}; "
            f"{max(0, done - t.progress.step)} step(s) trained again{lost}")
