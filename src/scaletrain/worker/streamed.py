"""A rank's data when the run streams (``data.streaming``): the seeded record stream of every rank
(``data/stream.py``), this rank's share of each micro-batch tokenized as it comes, and the stream's position
handed to the checkpoint after every step."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from scaletrain.data import IGNORE_INDEX, Collator, load_split
from scaletrain.data.stream import SAMPLE, ShardStream, StreamEncoder, StreamSource, first_records, parse
from scaletrain.errors import DataError
from scaletrain.metrics.logs import WORKER_LOGGER
from scaletrain.worker.seen import open_record

if TYPE_CHECKING:
    from scaletrain.worker.trainer import Trainer

log = logging.getLogger(WORKER_LOGGER)
CHECK_AFTER = 200  # records of this rank before data.max_bad_ratio is checked on the running count


class StreamData:
    """The loop's ``Data`` for a stream: the same ``batches``, ``record_step``, ``eval`` and ``collate``."""

    def __init__(self, t: Trainer):
        from scaletrain.model.tokenizer import load_tokenizer

        self.t = t
        self.eval = load_split(t.spec.eval_path)
        self.collate = Collator(t.spec.pad_token_id, t.stand_in, t.pixels)
        d = t.cfg.data
        self.src = StreamSource.from_spec(t.spec.stream)
        self.stream = ShardStream(self.src, t.cfg.train.seed, d.buffer_size, t.progress.stream)
        tokenizer = load_tokenizer(t.cfg.model.name_or_path)
        # the encoder's column check on the records the driver checked before any worker started
        self.encode = StreamEncoder(self.src, t.cfg, tokenizer, first_records(self.src, SAMPLE)[0])
        self.seen, self.skipped, self.first_bad = 0, {}, None
        self.ids: list[int] = []  # this rank's records of the current step
        self.record = open_record(t.run_dir.examples, t.progress.step + 1, t.ctx) if d.record_examples else None

    def batches(self):
        """Micro-batches without end (the stream's epochs follow one another): each takes the stream's next
        ranks x batch records and keeps this rank's every N-th."""
        b, n, r = self.t.cfg.train.per_device_train_batch_size, self.t.ctx.dp_size, self.t.ctx.dp_rank
        while True:
            mine = [next(self.stream) for _ in range(n * b)][r::n]
            self.ids += [rid for rid, _ in mine]
            yield self.collate(self._examples(mine))

    def _examples(self, mine: list) -> list[dict]:
        records, where = [], []
        for rid, raw in mine:
            rec = parse(self.src, rid, raw)
            if isinstance(rec, str):
                self._skip(rec, rid)
            else:
                records.append(rec)
                where.append(rid)
        rows, reasons = self.encode(records)
        for rid, why in zip(where, reasons):
            if why:
                self._skip(why, rid)
        self.seen += len(mine)
        bad = sum(self.skipped.values())
        if self.seen >= CHECK_AFTER and bad > self.t.cfg.data.max_bad_ratio * self.seen:
            raise DataError(f"{self.src.key}={self.src.root}: {bad} of the {self.seen} records rank "
                            f"{self.t.ctx.world_rank} read cannot be trained on (more than data.max_bad_ratio="
                            f"{self.t.cfg.data.max_bad_ratio:g}); the first is {self.first_bad}; fix the data or "
                            f"the columns/formatting keys")
        # A micro-batch whose records were all skipped still joins the step: one padding token, no target.
        return rows or [{"input_ids": [self.t.spec.pad_token_id], "labels": [IGNORE_INDEX]}]

    def _skip(self, why: str, rid: int) -> None:
        self.skipped[why] = self.skipped.get(why, 0) + 1
        if self.first_bad is None:
            self.first_bad = f"{self.src.name(rid)}: {why}"
            log.warning("stream: skipped %s: %s", self.src.name(rid), why)

    def record_step(self, step: int, micro_batches: int) -> None:
        """The step is done: its position goes to the next checkpoint, its records to data.record_examples."""
        self.t.progress.stream = self.stream.state()
        self.t.progress.epoch = self.stream.pos.epoch
        if self.record is not None:
            self.record.write(step, self.stream.pos.epoch, self.ids)
        self.ids = []

    def summary(self) -> str:
        bad = sum(self.skipped.values())
        return (f"stream: {self.seen} records read by this rank, {bad} skipped"
                + (f" ({', '.join(f'{n} {why}' for why, n in self.skipped.items())})" if bad else ""))
