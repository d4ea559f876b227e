"""The per-worker train loop. ``train()`` reads top to bottom: build, resume, loop, evaluate, save."""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import time
from pathlib import Path

import torch
import torch.distributed as dist

from scaletrain import checkpoint
from scaletrain.comm.context import DistContext
from scaletrain.comm.env import secret_values
from scaletrain.comm.watchdog import Heartbeat
from scaletrain.config.schema import Config
from scaletrain.data import Collator, load_split
from scaletrain.metrics.logs import EventLog, setup_worker_logging
from scaletrain.errors import TrainingError
from scaletrain.metrics.alerts import Alert, write_alert
from scaletrain.metrics.gpu import reader_for
from scaletrain.metrics.records import JsonlSink
from scaletrain.metrics.sampler import SystemSampler
from scaletrain.model import build_model, count_parameters
from scaletrain.redact import Redactor
from scaletrain.scaling.flops import flops_per_token, mfu, model_flops_facts, peak_tflops
from scaletrain.worker.faults import maybe_fire
from scaletrain.worker.breakdown import device_sync, shares, time_without_sync
from scaletrain.worker.evaluate import evaluate
from scaletrain.worker.optim import build_optimizer, global_batch_size
from scaletrain.worker.parallel import (all_gather_floats, all_reduce_max_async, all_reduce_sum, full_model_state,
                                        grad_sync, unwrap, wrap_model)
from scaletrain.worker.sampler import ResumableSampler
from scaletrain.worker.spec import JobSpec


RUN_UMASK = 0o027  # files of a run are not world-readable
STOP_FILE = "STOP"  # the driver creates it on Ctrl-C/SIGTERM: every rank checkpoints and stops


def train(ctx: DistContext, spec: JobSpec) -> dict:
    os.umask(RUN_UMASK)
    cfg = Config.model_validate(spec.config)
    redact = Redactor(secret_values())
    log = setup_worker_logging(spec.run_dir, ctx.world_rank, redact)
    events = EventLog(spec.run_dir, f"rank {ctx.world_rank}", redact) if ctx.is_main else (lambda *a, **k: None)
    beat = Heartbeat(spec.run_dir, ctx.world_rank, stall_s=max(5.0, cfg.comm.timeout_s / 2))
    system = SystemSampler(JsonlSink(Path(spec.run_dir) / "metrics.jsonl"), ctx.world_rank, ctx.device,
                           cfg.monitor.interval_s, reader_for(ctx.device, _vendor())).start()
    try:
        summary = run_loop(ctx, spec, cfg, log, events, beat, system)
        beat.close(clean=True)
        log.info("system sampler: %d samples, %.4f s spent sampling", system.samples, system.busy_s)
        return summary
    except BaseException as e:
        log.error("rank %d failed at step %d (phase %s): %s: %s", ctx.world_rank, beat.step_done, beat.phase,
                  type(e).__name__, e, exc_info=True)
        beat.close(clean=False)  # keep the phase it failed in: the driver's hang diagnosis reads it
        raise
    finally:
        system.stop()


def run_loop(ctx: DistContext, spec: JobSpec, cfg: Config, log, events, beat: Heartbeat, system: SystemSampler) -> dict:
    _write_pid(spec.run_dir, ctx)
    log.info("worker up: %s", ctx)
    log.info("comm.env: %s", cfg.comm.env)
    seed_everything(cfg.train.seed)  # identical on every rank: random init must match before sharding
    model = build_model(cfg.model, spec.vocab_size, spec.pad_token_id)
    trainable, total = count_parameters(model)
    flops_facts = model_flops_facts(model)
    model = wrap_model(model, ctx, cfg.train.strategy)
    optimizer, scheduler = build_optimizer(model, cfg.train, spec.learning_rate, spec.total_steps)
    precision = Precision(cfg, ctx.device)
    lora = cfg.model.finetuning_type == "lora"
    state = checkpoint.TrainState()
    if ckpt := checkpoint.latest_valid(spec.run_dir):
        state = checkpoint.restore(ckpt, model, optimizer, scheduler, precision.scaler, ctx.world_rank, lora)
        events("resume", f"from {ckpt.name}: step {state.step}, epoch {state.epoch}, "
                         f"{state.micro_batches_in_epoch} micro-batches into the epoch")
    beat.finished_step(state.step)
    events("placement", placement(ctx))
    events("workers up", f"{ctx.world_size} x {ctx.device} ({ctx.backend}); {trainable:,} of {total:,} "
                         f"parameters trainable; global batch {global_batch_size(cfg.train, ctx.world_size)}; "
                         f"{spec.total_steps} steps; lr {spec.learning_rate:g}; {precision.note}")
    train_data, eval_data = load_split(spec.train_path), load_split(spec.eval_path)
    collate = Collator(spec.pad_token_id)
    sampler = ResumableSampler(len(train_data), ctx.world_size, ctx.world_rank, cfg.train.seed)
    metrics = Meter(ctx, cfg, spec, beat, system, flops_facts, precision.dtype_name,
                    {"parameters/trainable": trainable, "parameters/total": total})
    save = lambda: checkpoint.save(spec.run_dir, state, model, optimizer, scheduler, precision.scaler,  # noqa: E731
                                   ctx.world_rank, cfg.checkpoint.save_total_limit, lora)
    accum = cfg.train.gradient_accumulation_steps
    check = StepCheck(spec.run_dir, ctx.device)
    t_start, eval_time = time.perf_counter(), 0.0
    model.train()
    while state.step < spec.total_steps:
        sampler.set_position(state.epoch, state.micro_batches_in_epoch * cfg.train.per_device_train_batch_size)
        loader = torch.utils.data.DataLoader(train_data, batch_size=cfg.train.per_device_train_batch_size,
                                             sampler=sampler, collate_fn=collate, drop_last=True,
                                             num_workers=cfg.data.loader_workers,
                                             # its own generator: creating an iterator must not draw from the
                                             # global RNG, or a resumed run's dropout masks would differ
                                             generator=torch.Generator().manual_seed(cfg.train.seed + state.epoch))
        batches = iter(loader)
        while state.step < spec.total_steps:
            beat.enter("data", state.step + 1)
            maybe_fire(spec.faults, spec.run_dir, ctx.world_rank, state.step + 1)
            window = _next_window(batches, accum, metrics)
            if window is None:
                break  # epoch exhausted (a partial accumulation window is dropped)
            poison = maybe_fire(spec.faults, spec.run_dir, ctx.world_rank, state.step + 1, "nan")
            timing = {} if metrics.probe_due(state.step + 1) else None
            loss = train_step(model, optimizer, scheduler, window, cfg, ctx, precision, beat, state.step + 1, poison,
                              timing)
            beat.enter("step-check", state.step + 1)
            bad, stop = check.advance(state.step + 1, loss, wait=_writes_at(state.step + 1, cfg, spec, metrics))
            if bad:  # before any metric, eval or checkpoint of the corrupted weights
                raise non_finite_loss(spec.run_dir, *bad, ctx.world_rank, events)
            state.step += 1
            state.micro_batches_in_epoch += accum
            beat.finished_step(state.step)
            metrics.step_done(state, loss, window, scheduler.get_last_lr()[0], timing)
            if _due(cfg.train.eval_steps, state.step) and state.step < spec.total_steps:
                beat.enter("eval", state.step)
                eval_time += _run_eval(model, eval_data, collate, ctx, cfg, precision, state, metrics, events)
            saved = None
            if _due(cfg.checkpoint.save_steps, state.step):
                beat.enter("checkpoint", state.step)
                saved = save()
                events("checkpoint", f"{saved.name} saved")
            if stop:
                beat.enter("checkpoint", state.step)
                path = saved or save()
                events("stopped", f"on request at step {state.step}; {path.name} saved")
                return {"stopped": True, "step": state.step}
        if state.step >= spec.total_steps:
            break
        state.epoch += 1
        state.micro_batches_in_epoch = 0
        events("epoch", f"epoch {state.epoch} done at step {state.step}")
    train_time = time.perf_counter() - t_start - eval_time
    final_eval = {}
    beat.enter("eval", state.step)
    eval_time += _timed(lambda: final_eval.update(_eval_metrics(model, eval_data, collate, ctx, cfg, precision)))
    metrics.write({"kind": "eval", "step": state.step, **final_eval})
    log.info("eval step %d: %s", state.step, json.dumps(final_eval, sort_keys=True))
    events("eval", _fmt(final_eval))
    beat.enter("final", state.step)
    save_final(model, spec.run_dir, ctx, lora)
    summary = metrics.summary(train_time, eval_time, final_eval, state)
    if ctx.is_main:
        Path(spec.run_dir, "summary.json").write_text(json.dumps(summary, indent=1))
        events("finish", f"train {train_time:.1f}s, eval {eval_time:.1f}s, {_fmt(final_eval)}")
    return summary


def placement(ctx: DistContext) -> str:
    """Which node each rank runs on (a collective: every rank calls it)."""
    import socket

    me = f"node {ctx.node_id[:12] or '-'} ({socket.gethostname()}, local rank {ctx.local_rank})"
    everyone = [me]
    if dist.is_available() and dist.is_initialized():
        everyone = [None] * ctx.world_size
        dist.all_gather_object(everyone, me)
    return "; ".join(f"rank {r}: {where}" for r, where in enumerate(everyone))


class StepCheck:
    """Every rank takes the same decision at the same step on (some rank's loss is NaN/Inf, some rank saw the
    stop file), agreed with a two-float all-reduce.

    The all-reduce of step N finishes in the background while step N+1 computes and is read after it: waiting
    for it every step cost 7% of throughput with 2 gloo workers (benchmarks/step_check_cost.py). A step that
    writes anything (metrics, eval, checkpoint) or ends the run waits for its own answer, so nothing is
    written from a step whose loss some rank saw diverge."""

    def __init__(self, run_dir: str, device: str):
        self.run_dir, self.device = run_dir, device
        self._pending = None  # (step, this rank's loss, result of the all-reduce)

    def advance(self, step: int, loss: float, wait: bool) -> tuple[tuple[int, float] | None, bool]:
        """Read the previous step's answer, post this step's (and read it too with ``wait``).

        Returns ((step, this rank's loss) of the first non-finite step read, or None; stop requested)."""
        answers = [self._read()] if self._pending else []
        bad = 0.0 if math.isfinite(loss) else 1.0
        seen = 1.0 if os.path.exists(os.path.join(self.run_dir, STOP_FILE)) else 0.0
        self._pending = (step, loss, all_reduce_max_async([bad, seen], self.device))
        if wait:
            answers.append(self._read())
        first_bad = next(((s, loss_s) for s, loss_s, b, _ in answers if b), None)
        return first_bad, any(stop for *_, stop in answers)

    def _read(self) -> tuple[int, float, bool, bool]:
        step, loss, result = self._pending
        self._pending = None
        bad, seen = result()
        return step, loss, bad > 0, seen > 0


def _due(every: int, step: int) -> bool:
    """A schedule of every ``every`` steps (0: never)."""
    return bool(every) and step % every == 0


def _writes_at(step: int, cfg: Config, spec: JobSpec, metrics: "Meter") -> bool:
    """Whether the loop writes a metric record, evaluates or checkpoints after ``step`` (or the run ends)."""
    return (metrics.record_due(step) or metrics.probe_due(step) or step >= spec.total_steps
            or _due(cfg.train.eval_steps, step) or _due(cfg.checkpoint.save_steps, step))


def non_finite_loss(run_dir: str, step: int, loss: float, rank: int, events) -> TrainingError:
    mine = "" if math.isfinite(loss) else f" (rank {rank}: {loss})"
    alert = Alert("non_finite_loss", f"loss is not finite at step {step}{mine}; the run stops before saving anything "
                                     f"from this step", step=step, rank=rank, severity="error")
    if rank == 0:
        write_alert(run_dir, alert)
        events("alert", f"{alert.rule}: {alert.message}")
    return TrainingError(f"{alert.message}; lower train.learning_rate, set train.max_grad_norm, or check the data "
                         f"(the last checkpoint is intact)")


def train_step(model, optimizer, scheduler, window: list[dict], cfg: Config, ctx: DistContext, precision,
               beat: Heartbeat, step: int, poison: bool = False, timing: dict | None = None) -> float:
    """One optimizer step over ``window`` micro-batches; gradients sync on the last one only.

    With ``timing`` (a breakdown probe step) the phases are timed with device syncs in between."""
    loss_sum = 0.0
    if timing is not None:
        if ctx.world_size > 1:  # one worker has no gradient sync to expose
            timing["compute_s"] = time_without_sync(model, window, cfg.train.strategy, ctx.device, precision, optimizer)
            timing["probe_s"] = timing["compute_s"]  # extra work of this probe: kept out of throughput
        t0 = time.perf_counter()
    for i, batch in enumerate(window):
        last = i == len(window) - 1
        batch = {k: v.to(ctx.device, non_blocking=True) for k, v in batch.items()}
        # FSDP all-gathers parameters in forward, so there forward is a collective phase.
        beat.enter("forward-gather" if cfg.train.strategy == "fsdp" else "forward", step)
        with grad_sync(model, cfg.train.strategy, enabled=last), precision.autocast():
            loss = model(**batch).loss / len(window)
        if poison:  # fault injection: a NaN loss, as a diverging run produces
            loss = loss * float("nan")
        if last:
            beat.enter("sync", step)  # backward of the last micro-batch all-reduces gradients
        precision.backward(loss)
        loss_sum += loss.item()
    if timing is not None:
        device_sync(ctx.device)
        timing["fwd_bwd_sync_s"] = time.perf_counter() - t0
        timing.setdefault("compute_s", timing["fwd_bwd_sync_s"])
        t0 = time.perf_counter()
    beat.enter("optimizer", step)
    precision.unscale(optimizer)
    if cfg.train.max_grad_norm > 0:
        torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.grad is not None],
                                       cfg.train.max_grad_norm)
    precision.step(optimizer)
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    if timing is not None:
        device_sync(ctx.device)
        timing["optimizer_s"] = time.perf_counter() - t0
    return loss_sum


def _next_window(batches, accum: int, metrics: "Meter") -> list[dict] | None:
    window = []
    t0 = time.perf_counter()
    for _ in range(accum):
        try:
            window.append(next(batches))
        except StopIteration:
            return None
    metrics.data_wait(time.perf_counter() - t0)
    return window


def _eval_metrics(model, eval_data, collate, ctx, cfg, precision) -> dict:
    return evaluate(model, eval_data, collate, ctx, cfg.train.per_device_eval_batch_size, cfg.model.task,
                    cfg.model.num_labels, precision.autocast)


def _run_eval(model, eval_data, collate, ctx, cfg, precision, state, metrics, events) -> float:
    out = {}
    seconds = _timed(lambda: out.update(_eval_metrics(model, eval_data, collate, ctx, cfg, precision)))
    metrics.write({"kind": "eval", "step": state.step, **out, "time/eval_s": seconds})
    events("eval", f"step {state.step}: {_fmt(out)}")
    return seconds


def save_final(model, run_dir: str, ctx: DistContext, lora: bool) -> None:
    """``final/``: a transformers (or peft adapter) directory loadable with from_pretrained."""
    state = full_model_state(model, trainable_only=False)  # collective under FSDP
    if ctx.is_main:
        inner = unwrap(model)
        inner.save_pretrained(str(Path(run_dir) / "final"), state_dict=state, safe_serialization=True)
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


class Precision:
    """bf16/fp16 autocast where the device supports it; fp32 on CPU with a note."""

    def __init__(self, cfg: Config, device: str):
        on_gpu = device.startswith("cuda")
        wanted = "bf16" if cfg.train.bf16 else "fp16" if cfg.train.fp16 else None
        self.dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(wanted) if on_gpu else None
        self.device_type = "cuda" if on_gpu else "cpu"
        self.scaler = torch.amp.GradScaler("cuda") if on_gpu and wanted == "fp16" else None
        self.dtype_name = wanted if self.dtype is not None else "fp32"
        if wanted and not on_gpu:
            self.note = f"{wanted} requested but training on CPU: using fp32"
        else:
            self.note = f"precision {wanted or 'fp32'}"

    def autocast(self):
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype)

    def backward(self, loss):
        (self.scaler.scale(loss) if self.scaler else loss).backward()

    def unscale(self, optimizer):
        if self.scaler:
            self.scaler.unscale_(optimizer)

    def step(self, optimizer):
        if self.scaler:
            self.scaler.step(optimizer)
            self.scaler.update()
        else:
            optimizer.step()


class Meter:
    """Step timing and the metric record every ``logging_steps`` (aggregated over ranks, written by rank 0)."""

    def __init__(self, ctx: DistContext, cfg: Config, spec: JobSpec, beat: Heartbeat, sampler: SystemSampler,
                 flops_facts: dict, dtype: str, parameters: dict):
        self.ctx, self.cfg, self.spec, self.beat, self.sampler = ctx, cfg, spec, beat, sampler
        self.parameters = parameters
        self.flops_facts = flops_facts
        name = "cpu"
        if ctx.device.startswith("cuda"):
            name = torch.cuda.get_device_name(torch.device(ctx.device))
        self.device_name = name
        self.peak = peak_tflops(name, dtype) if name != "cpu" else None
        self.sink = JsonlSink(Path(spec.run_dir) / "metrics.jsonl") if ctx.is_main else None
        self.samples_total = self.tokens_total = 0.0
        self.last_wait = 0.0
        self._reset()

    def _reset(self):
        self.t0 = time.perf_counter()
        self.loss = self.samples = self.tokens = self.wait = 0.0
        self.steps = 0

    def data_wait(self, seconds: float) -> None:
        self.wait += seconds
        self.last_wait = seconds

    def probe_due(self, step: int) -> bool:
        return _due(self.cfg.monitor.breakdown_every, step) and self.cfg.train.strategy == "ddp"

    def record_due(self, step: int) -> bool:
        return _due(self.cfg.train.logging_steps, step) or step == self.spec.total_steps

    def _breakdown(self, state, timing: dict) -> None:
        self.beat.enter("metrics", state.step)
        values = [self.last_wait, timing["compute_s"], timing["fwd_bwd_sync_s"], timing["optimizer_s"]]
        mean = [v / self.ctx.world_size for v in all_reduce_sum(values, self.ctx.device)]
        self.write({"kind": "breakdown", "step": state.step, "world_size": self.ctx.world_size, **shares(*mean)})

    def step_done(self, state, loss: float, window: list[dict], lr: float, timing: dict | None = None) -> None:
        if timing:
            self._breakdown(state, timing)
            self.t0 += timing.get("probe_s", 0.0)
        self.steps += 1
        self.loss += loss
        self.samples += sum(b["input_ids"].shape[0] for b in window)
        self.tokens += sum(int(b["attention_mask"].sum()) for b in window)
        if self.record_due(state.step):
            self._flush(state, lr)

    def _flush(self, state, lr: float) -> None:
        elapsed = time.perf_counter() - self.t0
        self.beat.enter("metrics", state.step)
        loss, samples, tokens = all_reduce_sum([self.loss, self.samples, self.tokens], self.ctx.device)
        system = self.sampler.sample()
        per_rank = all_gather_floats([elapsed / self.steps, self.wait / self.steps, system["memory/rss_gib"]],
                                     self.ctx.device)
        slowest = max(r[0] for r in per_rank) * self.steps
        wait = max(r[1] for r in per_rank) * self.steps
        self.samples_total += samples
        self.tokens_total += tokens
        record = {
            "kind": "train", "step": state.step, "epoch": state.epoch, "total_steps": self.spec.total_steps,
            "train/loss": loss / self.ctx.world_size / self.steps, "train/lr": lr,
            "throughput/samples_per_s": samples / slowest, "throughput/tokens_per_s": tokens / slowest,
            "time/step_s": slowest / self.steps, "time/data_wait_s": wait / self.steps,
            "world_size": self.ctx.world_size, **system,
            "ranks/step_s": [r[0] for r in per_rank], "ranks/data_wait_s": [r[1] for r in per_rank],
            "ranks/rss_gib": [r[2] for r in per_rank],
        }
        if samples:
            f = self.flops_facts
            per_token = flops_per_token(f["n_params"], f["n_layers"], f["hidden"], int(tokens / samples),
                                        f["lora_params"] if self.cfg.model.finetuning_type == "lora" else None)
            record["perf/flops_per_token"] = per_token
            value = mfu(tokens / slowest / self.ctx.world_size, per_token, self.peak)
            if value is not None:
                record["perf/mfu"] = value
        self.write(record)
        self._reset()

    def write(self, record: dict) -> None:
        if self.sink:
            self.sink.write({"time": time.time(), **record})

    def summary(self, train_time: float, eval_time: float, final_eval: dict, state) -> dict:
        return {
            "world_size": self.ctx.world_size, "backend": self.ctx.backend, "device": self.ctx.device,
            "strategy": self.cfg.train.strategy, "task": self.cfg.model.task, "model": self.cfg.model.name_or_path,
            "finetuning_type": self.cfg.model.finetuning_type,
            "global_batch_size": global_batch_size(self.cfg.train, self.ctx.world_size),
            "learning_rate": self.spec.learning_rate, "steps": state.step, "epochs": state.epoch,
            "train_time_s": train_time, "eval_time_s": eval_time,
            "throughput/samples_per_s": self.samples_total / train_time if train_time > 0 else 0.0,
            "throughput/tokens_per_s": self.tokens_total / train_time if train_time > 0 else 0.0,
            "samples_per_step_per_device": self.cfg.train.per_device_train_batch_size
            * self.cfg.train.gradient_accumulation_steps,
            **self.parameters,
            "final": final_eval,
        }


def _vendor() -> str:
    import torch

    return "rocm" if getattr(torch.version, "hip", None) else "cuda"


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy as np

        np.random.seed(seed)
    except ImportError:
        pass


def _write_pid(run_dir: str, ctx: DistContext) -> None:
    # Lets tests and operators signal a specific rank (fault injection, stack dumps).
    pids = Path(run_dir) / "pids"
    pids.mkdir(exist_ok=True)
    (pids / f"rank-{ctx.world_rank}.pid").write_text(str(os.getpid()))


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _fmt(d: dict) -> str:
    return ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in d.items())

