"""The record of the examples each optimizer step trained (``data.record_examples``).

Each data-parallel rank appends one JSON line per step, ``{"step", "epoch", "ids"}``, to
``<run>/examples/from-step-<S>-rank-<R>.jsonl``, where S is the first step of this attempt (0 for a fresh run,
the checkpoint's step + 1 for a resume). A run killed after its last checkpoint has recorded steps its resume
trains again: the later attempt's lines supersede them, so ``trained`` reads what the weights actually saw. The
ids are rows of the tokenized train split (a packed row counts its members: ``data/packing.py``'s
``example_ids``), so the same data seen at another world size has the same ids. Ray Data has no such record;
torchtitan and TRL keep none either; it is a few bytes per example.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

FILE = re.compile(r"from-step-(\d+)-rank-(\d+)\.jsonl")


def start_attempt(folder: Path, first_step: int) -> None:
    """Before any rank opens its file (one rank, then a barrier): an earlier attempt from the same step (a restart
    from the same checkpoint, maybe at another world size) trained nothing the weights kept, so its files go."""
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob(f"from-step-{first_step}-rank-*.jsonl"):
        old.unlink()


def open_record(folder: Path, first_step: int, ctx) -> ExampleRecord | None:
    """This rank's record from ``first_step`` on (a collective: every rank calls it). A context-parallel group's
    ranks share their examples, so its first rank writes them; the others get None."""
    import torch.distributed as dist

    if ctx.is_main:
        start_attempt(folder, first_step)
    if dist.is_initialized():
        dist.barrier()
    return ExampleRecord(folder, first_step, ctx.dp_rank) if ctx.cp_rank == 0 else None


class ExampleRecord:
    """One rank's file of this attempt (``start_attempt`` has run)."""

    def __init__(self, folder: Path, first_step: int, rank: int):
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / f"from-step-{first_step}-rank-{rank}.jsonl"
        # line-buffered: a killed rank keeps the steps it wrote; open for the run, closed with the process
        self.file = open(self.path, "a", buffering=1)  # noqa: SIM115

    def write(self, step: int, epoch: int, ids: list[int]) -> None:
        self.file.write(json.dumps({"step": step, "epoch": epoch, "ids": ids}) + "\n")

    def close(self) -> None:
        self.file.close()


def trained(folder: Path) -> dict[int, dict]:
    """Step -> {"epoch", "ids"} (all ranks' ids, rank order) as the run's weights saw them: for each step, the
    lines of the latest attempt that started at or before it."""
    attempts: dict[int, dict[int, list[dict]]] = {}
    for path in sorted(Path(folder).glob("from-step-*-rank-*.jsonl")):
        first, rank = map(int, FILE.fullmatch(path.name).groups())
        lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        attempts.setdefault(first, {})[rank] = lines
    steps: dict[int, dict] = {}
    for first in sorted(attempts):
        by_step: dict[int, dict] = {}
        for rank in sorted(attempts[first]):
            for rec in attempts[first][rank]:
                entry = by_step.setdefault(rec["step"], {"epoch": rec["epoch"], "ids": []})
                entry["ids"] += rec["ids"]
        steps = {s: e for s, e in steps.items() if s < first}  # a later attempt redoes everything from its start
        steps.update(by_step)
    return dict(sorted(steps.items()))
