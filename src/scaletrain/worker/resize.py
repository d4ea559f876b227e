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
    """None when the run restarted on the size it was saved with (or this is not rank 0)."""
    restored = t.checkpointer.restored
    old, new = (restored.world_size if restored else None), t.ctx.world_size
    if old is None or old == new or not t.ctx.is_main:
        return None
    trained = [r for r in read_jsonl(t.run_dir.metrics) if r.get("kind") == "train"]
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
            f"{restored.accumulation} -> {tr.gradient_accumulation_steps}, global batch {global_batch(tr, new)}; "
            f"{max(0, done - t.progress.step)} step(s) trained again{lost}")
