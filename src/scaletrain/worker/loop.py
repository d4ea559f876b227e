"""The per-worker train loop. ``run_loop`` reads top to bottom: build, resume, loop, finish."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import socket
import time

import torch
import torch.distributed as dist

from scaletrain.comm.context import DistContext
from scaletrain.comm.cores import bind_process, core_block, describe, usable_cores
from scaletrain.comm.device import Platform
from scaletrain.comm.watchdog import Heartbeat
from scaletrain.config.batch import for_world_size
from scaletrain.config.schema import Config
from scaletrain.config.stages import RL_STAGES
from scaletrain.data import Collator, load_split
from scaletrain.data.pixels import loader_line
from scaletrain.errors import StorageError
from scaletrain.memory.measure import held_bytes, memory_summary
from scaletrain.metrics.goodput import mark
from scaletrain.metrics.gpu import faulty_node_note, gpu_health, hardware_fault, reader_for
from scaletrain.metrics.logs import WORKER_LOGGER, EventLog, log_failure, setup_worker_logging
from scaletrain.metrics.records import JsonlSink
from scaletrain.metrics.sampler import SystemSampler
from scaletrain.redact import Redactor
from scaletrain.rundir import RUN_UMASK, RunDir
from scaletrain.worker.evaluate import evaluate
from scaletrain.worker.faults import maybe_fire
from scaletrain.worker.final import save_final
from scaletrain.worker.meter import Meter
from scaletrain.worker.parallel import all_gather_floats
from scaletrain.worker.preference import objective_for
from scaletrain.worker.resize import resize_note
from scaletrain.worker.sampler import ResumableSampler
from scaletrain.worker.seen import open_record
from scaletrain.worker.spec import JobSpec
from scaletrain.worker.step import target_tokens, train_step
from scaletrain.worker.step_check import StepCheck, due, non_finite_loss, writes_at
from scaletrain.worker.streamed import StreamData
from scaletrain.worker.trainer import Trainer, build_trainer

log = logging.getLogger(WORKER_LOGGER)  # the per-rank log file (metrics/logs.py)


def train(ctx: DistContext, spec: JobSpec) -> dict:
    os.umask(RUN_UMASK)
    if ctx.is_main:  # a worker group starts (the first, or a restart): the goodput account's worker start
        mark(spec.run_dir, "worker_start")
    cfg = for_world_size(Config.model_validate(spec.config), ctx.world_size)  # elastic: this size's accumulation
    ctx = dataclasses.replace(ctx, cp_size=cfg.scaling.context_parallel)  # the data x context parallel mesh
    redact = Redactor.from_environment()
    setup_worker_logging(spec.run_dir, ctx.world_rank, redact)
    if spec.bind_cores and ctx.device == "cpu":
        _bind_cores(ctx)
    events = EventLog(spec.run_dir, f"rank {ctx.world_rank}", redact) if ctx.is_main else (lambda *a, **k: None)
    beat = Heartbeat(spec.run_dir, ctx.world_rank, stall_s=max(5.0, cfg.comm.timeout_s / 2))
    gpu = reader_for(ctx.device, Platform.detect().vendor)
    health = gpu_health(gpu)  # ECC and retired pages now, to compare with at a failure
    system = SystemSampler(JsonlSink(RunDir(spec.run_dir).metrics), ctx.world_rank, ctx.device,
                           cfg.monitor.interval_s, gpu).start()
    try:
        summary = run_loop(ctx, spec, cfg, events, beat, system)
        beat.close(clean=True)
        log.info("system sampler: %d samples, %.4f s spent sampling", system.samples, system.busy_s)
        return summary
    except BaseException as e:
        after = gpu_health(gpu)
        fault = hardware_fault(health, after) or getattr(e, "hardware_fault", None)  # (or an injected one)
        gpu_id = (after or {}).get("bus_id") or ctx.device
        note = f"likely hardware fault: GPU {gpu_id} on {socket.gethostname()}: {fault}" if fault else ""
        if note and ctx.node_id and cfg.fault_tolerance.exclude_faulty_nodes:
            e.add_note(faulty_node_note(note, ctx.node_id))  # the controller leaves this node out of the restart
        log_failure(ctx.world_rank, beat.step_done, beat.phase, e, note)
        beat.close(clean=False)  # keep the phase it failed in: the driver's hang diagnosis reads it
        raise
    finally:
        system.stop()


def _bind_cores(ctx: DistContext) -> None:
    """This worker's threads on its own cores of the node, as the driver planned and said (comm/cores.py)."""
    block = core_block(usable_cores(), ctx.local_rank, ctx.local_world_size, torch.get_num_threads())
    if block is not None:
        log.info("cores: %d threads bound to %s", bind_process(block), describe([block]).split(": ", 1)[1])


def run_loop(ctx: DistContext, spec: JobSpec, cfg: Config, events, beat: Heartbeat, system: SystemSampler) -> dict:
    _write_pid(spec.run_dir, ctx)
    log.info("worker up: %s", ctx)
    log.info("comm.env: %s", cfg.comm.env)
    t = build_trainer(ctx, spec, cfg, beat, objective_for(cfg))
    if restored := t.resume():
        p = t.progress
        events("resume", f"from {restored.path.name}: step {p.step}, epoch {p.epoch}, "
                         f"{p.micro_batches_in_epoch} micro-batches into the epoch")
        if note := resize_note(t):
            events("resize", note)
    beat.finished_step(t.progress.step)
    if ctx.is_main:
        mark(spec.run_dir, "model_ready")  # built and restored: training can start
    events("placement", placement(ctx))
    events("workers up", t.describe())
    data = StreamData(t) if t.spec.stream else Data(t)
    if t.pixels is not None and ctx.is_main and not t.spec.stream and "image_refs" in data.train.column_names:
        events("images", data.images_line())
    metrics = Meter(t, system)
    clock = Clock()
    if not train_until_done(t, data, metrics, events, clock):
        return {"stopped": True, "step": t.progress.step}
    return finish(t, data, metrics, events, clock)


class Data:
    """The training and eval splits of this rank, and the resumable order of the training one."""

    def __init__(self, t: Trainer):
        self.t = t
        self.train, self.eval = load_split(t.spec.train_path), load_split(t.spec.eval_path)
        self.collate = Collator(t.spec.pad_token_id, t.stand_in, t.pixels)
        if t.objective is not None:  # e.g. reference log-probabilities, once, cached with the data
            splits = t.objective.prepare(t, {"train": self.train, "eval": self.eval}, self.collate)
            self.train, self.eval = splits["train"], splits["eval"]
        d, tr = t.cfg.data, t.cfg.train
        # Causal LM only: grouping by length could group a classification task's labels (short negative reviews).
        grpo = tr.stage in RL_STAGES  # groups of a prompt's completions stay together, in the order of the prompts
        balance = t.cfg.model.task == "causal-lm" and d.balance_ranks and not d.packing and not grpo
        # one array, read once: the datasets column answers each lengths[i] through Arrow (0.34 s an epoch of
        # 1,000 rows, ~15% of a tiny model's padded training)
        lengths = self.train.with_format("arrow")["length"].to_numpy() if balance else None
        self.sampler = ResumableSampler(len(self.train), t.ctx.dp_size, t.ctx.dp_rank, tr.seed, lengths,
                                        tr.per_device_train_batch_size, tr.gradient_accumulation_steps,
                                        group=t.cfg.rl.num_generations if grpo else 1,
                                        repeat=t.cfg.rl.num_iterations if grpo else 1)
        self.record = open_record(t.run_dir.examples, t.progress.step + 1, t.ctx) if d.record_examples else None
        self._order: tuple[int, list[int]] | None = None  # (epoch, this rank's order of it)

    def images_line(self) -> str:
        """What this rank's data-loading workers give against what a step needs (data/pixels.py): the first few
        images of the split timed here."""
        import pyarrow.compute as pc

        counts = pc.list_value_length(self.train.with_format("arrow")["image_tokens"]).fill_null(0)
        per_row = float(pc.mean(counts).as_py() or 0.0)
        refs = [w for ex in self.train.select(range(min(len(self.train), 8)))["image_refs"] for w in ex][:4]
        tr = self.t.cfg.train
        return loader_line(self.t.pixels.rate(refs), len(refs),
                           per_row * tr.per_device_train_batch_size * tr.gradient_accumulation_steps,
                           self.t.cfg.data.loader_workers)

    def record_step(self, step: int, micro_batches: int) -> None:
        """Write which examples the step that started ``micro_batches`` into the epoch trained (this rank's)."""
        if self.record is None:
            return
        epoch, b = self.t.progress.epoch, self.t.cfg.train.per_device_train_batch_size
        if self._order is None or self._order[0] != epoch:
            self._order = (epoch, self.sampler.epoch_order())
        rows = self._order[1][micro_batches * b:(micro_batches + self.t.cfg.train.gradient_accumulation_steps) * b]
        if "example_ids" in self.train.column_names:  # packed rows: their members
            rows = [i for members in self.train.select(rows)["example_ids"] for i in members]
        self.record.write(step, epoch, [int(i) for i in rows])

    def batches(self):
        """The rest of the current epoch from the trainer's data position."""
        cfg, progress = self.t.cfg, self.t.progress
        samples = progress.micro_batches_in_epoch * cfg.train.per_device_train_batch_size
        self.sampler.set_position(progress.epoch, samples)
        return iter(torch.utils.data.DataLoader(
            self.train, batch_size=cfg.train.per_device_train_batch_size, sampler=self.sampler,
            collate_fn=self.collate, drop_last=True, num_workers=cfg.data.loader_workers,
            # its own generator: creating an iterator must not draw from the global RNG, or a resumed run's
            # dropout masks would differ
            generator=torch.Generator().manual_seed(cfg.train.seed + progress.epoch)))


class Clock:
    """Wall time of training with evaluation kept out."""

    def __init__(self):
        self.start, self.eval_s = time.perf_counter(), 0.0

    def timed_eval(self, fn) -> float:
        t0 = time.perf_counter()
        fn()
        seconds = time.perf_counter() - t0
        self.eval_s += seconds
        return seconds

    def train_s(self) -> float:
        return time.perf_counter() - self.start - self.eval_s


def train_until_done(t: Trainer, data: Data, metrics: Meter, events, clock: Clock) -> bool:
    """Optimizer steps until ``total_steps``; False when a stop was requested (after its checkpoint)."""
    cfg, spec, progress, beat = t.cfg, t.spec, t.progress, t.beat
    accum = cfg.train.gradient_accumulation_steps
    check = StepCheck(spec.run_dir, t.ctx.device)
    t.model.train()
    while progress.step < spec.total_steps:
        windows = Windows(data.batches(), accum, metrics)
        t.peek = windows.peek
        while progress.step < spec.total_steps:
            step = progress.step + 1
            beat.enter("data", step)
            maybe_fire(spec.faults, spec.run_dir, t.ctx.world_rank, step)
            window = windows.next()
            if window is None:
                break  # epoch exhausted (a partial accumulation window is dropped)
            poison = maybe_fire(spec.faults, spec.run_dir, t.ctx.world_rank, step, "nan")
            if maybe_fire(spec.faults, spec.run_dir, t.ctx.world_rank, step, "ioerror"):
                t.checkpointer.fail_next_write = True
            timing = {} if metrics.probe_due(step) else None
            loss = train_step(t, window, step, poison, timing)
            beat.enter("step-check", step)
            bad, stop = check.advance(step, loss, wait=writes_at(step, cfg, spec, metrics))
            if bad:  # before any metric, eval or checkpoint of the corrupted weights
                raise non_finite_loss(spec.run_dir, *bad, t.ctx.world_rank, events, _tokens(t, window),
                                      t.checkpointer.saved(), spec.store)
            progress.step = step
            data.record_step(step, progress.micro_batches_in_epoch)
            progress.micro_batches_in_epoch += accum
            beat.finished_step(step)
            metrics.step_done(loss, window, timing)
            if t.compiled is not None and (note := t.compiled.fallback_note()):
                events("compile", note)
            if due(cfg.train.eval_steps, step) and step < spec.total_steps:
                run_eval(t, data, metrics, events, clock)
            saved = save_checkpoint(t, metrics, events) if due(cfg.checkpoint.save_steps, step) else None
            if stop:
                path = saved or save_checkpoint(t, metrics, events, announce=False, must=True)
                t.checkpointer.flush()  # an async save is complete before the run stops
                events("stopped", f"on request at step {step}; {path.name} saved")
                return False
        if progress.step >= spec.total_steps:
            break
        progress.epoch += 1
        progress.micro_batches_in_epoch = 0
        events("epoch", f"epoch {progress.epoch} done at step {progress.step}")
    return True


def _tokens(t: Trainer, window: list[dict]) -> int | None:
    return sum(map(target_tokens, window)) if t.cfg.model.task == "causal-lm" else None


def finish(t: Trainer, data: Data, metrics: Meter, events, clock: Clock) -> dict:
    """The final evaluation, ``final/`` and (rank 0) ``summary.json``."""
    train_time = clock.train_s()
    if isinstance(data, StreamData):
        log.info(data.summary())
    if t.ctx.is_main:
        mark(t.spec.run_dir, "train_end")  # the goodput account's finish: the final eval, save and teardown
    t.checkpointer.flush()  # an async save still being written
    final_eval = run_eval(t, data, metrics, events, clock, final=True)
    t.beat.enter("final", t.progress.step)
    dtype = save_final(t)
    summary = metrics.summary(train_time, clock.eval_s, final_eval)
    held = held_bytes(t.model, t.optimizer)
    ranks = all_gather_floats([float(t.memory.peak_bytes()), *map(float, held)], t.ctx.device)
    if t.ctx.is_main:
        summary.update(memory_summary(t.cfg, t.spec.memory_shape, t.ctx.world_size, t.ctx.device,
                                      [r[0] for r in ranks]))
        summary.update({**t.precision.policy.table(), "precision/final": dtype,
                        "memory/param_bytes_per_rank": [int(r[1]) for r in ranks],
                        "memory/optimizer_bytes_per_rank": [int(r[2]) for r in ranks]})
        t.run_dir.summary.write_text(json.dumps(summary, indent=1))
        events("finish", f"train {train_time:.1f}s, eval {clock.eval_s:.1f}s, {_fmt(final_eval)}")
    return summary


def run_eval(t: Trainer, data: Data, metrics: Meter, events, clock: Clock, final: bool = False) -> dict:
    """Evaluate on every rank's shard, record it (a mid-run eval with its time) and log it."""
    t.beat.enter("eval", t.progress.step)
    out = {}
    seconds = clock.timed_eval(lambda: out.update(evaluate(t, data.eval, data.collate)))
    step = t.progress.step
    metrics.exclude(seconds)
    timed = "time/final_eval_s" if final else "time/eval_s"  # the final one is not a pause between steps
    metrics.write({"kind": "eval", "step": step, **out, timed: seconds})
    if final:
        log.info("eval step %d: %s", step, json.dumps(out, sort_keys=True))
    events("eval", _fmt(out) if final else f"step {step}: {_fmt(out)}")
    return out


def save_checkpoint(t: Trainer, metrics: Meter, events, announce: bool = True, must: bool = False):
    """The checkpoint's path; None when it could not be written and checkpoint.on_write_error is warn (``must``:
    a stop needs it, so it fails regardless)."""
    t.beat.enter("checkpoint", t.progress.step)
    t0 = time.perf_counter()
    try:
        path = t.save()
    except StorageError as e:
        if must or t.cfg.checkpoint.on_write_error == "fail":
            raise
        metrics.exclude(time.perf_counter() - t0)
        if t.ctx.is_main:
            events("checkpoint failed", f"{e}; training goes on (checkpoint.on_write_error=warn), the next save "
                                        f"tries again")
        return None
    seconds = time.perf_counter() - t0
    metrics.exclude(seconds)
    metrics.write({"kind": "checkpoint", "step": t.progress.step, "time/checkpoint_s": seconds})
    if announce:
        events("checkpoint", f"{path.name} saved")
    return path


def placement(ctx: DistContext) -> str:
    """Which node each rank runs on (a collective: every rank calls it)."""
    import socket

    me = f"node {ctx.node_id[:12] or '-'} ({socket.gethostname()}, local rank {ctx.local_rank})"
    everyone = [me]
    if dist.is_available() and dist.is_initialized():
        everyone = [None] * ctx.world_size
        dist.all_gather_object(everyone, me)
    return "; ".join(f"rank {r}: {where}" for r, where in enumerate(everyone))


class Windows:
    """The epoch's accumulation windows in order, with a look ahead: asynchronous GRPO sends the next steps' prompts
    to its rollout actors while a step trains (worker/async_rollouts.py). A window looked at is the one the loop gets
    next; the epoch's position (and so a resume) counts the windows trained, never those looked at."""

    def __init__(self, batches, accum: int, metrics: Meter):
        self.batches, self.accum, self.metrics = batches, accum, metrics
        self.ahead: list[list[dict]] = []

    def next(self) -> list[dict] | None:
        return self.ahead.pop(0) if self.ahead else _next_window(self.batches, self.accum, self.metrics)

    def peek(self, n: int) -> list[dict] | None:
        """The window ``n`` steps after the current one (1: the next), or None when the epoch ends first."""
        while len(self.ahead) < n:
            window = _next_window(self.batches, self.accum, self.metrics)
            if window is None:
                return None
            self.ahead.append(window)
        return self.ahead[n - 1]


def _next_window(batches, accum: int, metrics: Meter) -> list[dict] | None:
    window = []
    t0 = time.perf_counter()
    for _ in range(accum):
        try:
            window.append(next(batches))
        except StopIteration:
            return None
    metrics.data_wait(time.perf_counter() - t0)
    return window


def _write_pid(run_dir: str, ctx: DistContext) -> None:
    # Lets tests and operators signal a specific rank (fault injection, stack dumps).
    path = RunDir(run_dir).pid(ctx.world_rank)
    path.parent.mkdir(exist_ok=True)
    path.write_text(str(os.getpid()))


def _fmt(d: dict) -> str:
    return ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in d.items())
