"""Step timing and the metric records of a run: every ``logging_steps`` a train record aggregated over ranks
(written by rank 0), breakdown records on probe steps, and the summary at the end."""

from __future__ import annotations

import time

import torch

from scaletrain.config.batch import global_batch
from scaletrain.metrics.experts import router_health
from scaletrain.metrics.flops import flops_per_token, mfu, peak_tflops
from scaletrain.metrics.records import JsonlSink
from scaletrain.metrics.sampler import CpuShare, SystemSampler
from scaletrain.worker.breakdown import shares
from scaletrain.worker.compile import compile_seconds
from scaletrain.worker.parallel import all_gather_floats, all_reduce_sum
from scaletrain.worker.step_check import due
from scaletrain.worker.trainer import Trainer


def _nodes(ctx) -> list[str]:
    """Each rank's host name (a collective under torch.distributed)."""
    import socket

    import torch.distributed as dist

    me = socket.gethostname()
    if not (dist.is_available() and dist.is_initialized()):
        return [me]
    everyone = [None] * ctx.world_size
    dist.all_gather_object(everyone, me)
    return everyone


def device_name(device: str) -> str:
    return torch.cuda.get_device_name(torch.device(device)) if device.startswith("cuda") else "cpu"


class Meter:
    def __init__(self, trainer: Trainer, sampler: SystemSampler):
        self.t, self.sampler = trainer, sampler
        self.ctx, self.cfg, self.spec = trainer.ctx, trainer.cfg, trainer.spec
        self.device_name = device_name(self.ctx.device)
        # MFU is never guessed: an unknown device gives None (and a warning from peak_tflops).
        self.peak = peak_tflops(self.device_name, trainer.precision.dtype_name) if self.device_name != "cpu" else None
        self.sink = JsonlSink(trainer.run_dir.metrics) if self.ctx.is_main else None
        self.samples_total = self.tokens_total = 0.0
        self.last_wait = 0.0
        self.nodes = _nodes(self.ctx)  # each rank's host, for naming a straggler's node
        self.cpu = CpuShare()  # the process's CPU share over each record's window: a straggler's host cause
        self.compiling = trainer.cfg.train.compile  # compile time is kept out of step time (goodput/compile_s)
        self.compile_mark = compile_seconds() if self.compiling else 0.0
        self._reset()

    def _reset(self):
        self.t0 = time.perf_counter()
        self.cpu.start()
        self.loss = self.samples = self.tokens = self.positions = self.wait = self.ready = self.skipped = 0.0
        self.steps = 0

    def exclude(self, seconds: float) -> None:
        """Keep ``seconds`` (an eval, a checkpoint) out of the window's step time and throughput."""
        self.t0 += seconds

    def data_wait(self, seconds: float) -> None:
        self.wait += seconds
        self.last_wait = seconds

    def probe_due(self, step: int) -> bool:
        # context parallelism communicates inside forward too: the no-sync probe would not isolate the gradient sync
        return (due(self.cfg.monitor.breakdown_every, step) and self.cfg.train.strategy == "ddp"
                and self.ctx.cp_size == 1)

    def record_due(self, step: int) -> bool:
        return due(self.cfg.train.logging_steps, step) or step == self.spec.total_steps

    def _breakdown(self, step: int, timing: dict) -> None:
        self.t.beat.enter("metrics", step)
        values = [self.last_wait, timing["compute_s"], timing["fwd_bwd_sync_s"], timing["optimizer_s"]]
        mean = [v / self.ctx.world_size for v in all_reduce_sum(values, self.ctx.device)]
        self.write({"kind": "breakdown", "step": step, "world_size": self.ctx.world_size, **shares(*mean)})

    def step_done(self, loss: float, window: list[dict], timing: dict | None = None) -> None:
        step = self.t.progress.step
        if timing:
            self._breakdown(step, timing)
            self.t0 += timing.get("probe_s", 0.0)
        self.steps += 1
        self.ready += self.t.ready_s
        self.loss += loss
        # the ranks of a context-parallel group share each batch: each counts its share
        cp = self.ctx.cp_size
        self.samples += sum(int(b["num_examples"]) for b in window) / cp
        self.tokens += sum(int(b["num_tokens"]) for b in window) / cp
        self.positions += sum(b["input_ids"].numel() for b in window) / cp  # with padding
        self.skipped += sum(int(b.get("images_skipped", 0)) for b in window) / cp  # data/pixels.py
        if self.record_due(step):
            self._flush()

    def _flush(self) -> None:
        progress = self.t.progress
        compiled = compile_seconds() - self.compile_mark if self.compiling else 0.0
        self.compile_mark += compiled
        elapsed = time.perf_counter() - self.t0 - compiled
        self.t.beat.enter("metrics", progress.step)
        router = [*self.t.router.sums, *self.t.router.health_values()] if self.t.router is not None else []
        loss, samples, tokens, positions, skipped, *pref = all_reduce_sum(
            [self.loss, self.samples, self.tokens, self.positions, self.skipped, *self.t.objective_sums, *router],
            self.ctx.device)
        pref, router_totals = pref[:len(pref) - len(router)], pref[len(pref) - len(router):]
        system = {**self.sampler.sample(cpu=False), "system/cpu_pct": self.cpu.pct()}
        per_rank = all_gather_floats([elapsed / self.steps, self.wait / self.steps, system["memory/rss_gib"],
                                      self.tokens, self.ready / self.steps, system["system/cpu_pct"], compiled],
                                     self.ctx.device)
        rank_tokens = [r[3] for r in per_rank]
        mean_tokens = sum(rank_tokens) / len(rank_tokens)
        slowest = max(r[0] for r in per_rank) * self.steps
        wait = max(r[1] for r in per_rank) * self.steps
        self.samples_total += samples
        self.tokens_total += tokens
        record = {
            "kind": "train", "step": progress.step, "epoch": progress.epoch, "total_steps": self.spec.total_steps,
            "scaling/workers": self.t.ctx.world_size,
            "scaling/gradient_accumulation_steps": self.t.cfg.train.gradient_accumulation_steps,
            "window_steps": self.steps,
            "train/loss": loss / self.ctx.world_size / self.steps, "train/lr": self.t.lr,
            "train/grad_norm": self.t.grad_norm,
            "throughput/samples_per_s": samples / slowest, "throughput/tokens_per_s": tokens / slowest,
            "time/step_s": slowest / self.steps, "time/data_wait_s": wait / self.steps,
            **system,
            "ranks/step_s": [r[0] for r in per_rank], "ranks/data_wait_s": [r[1] for r in per_rank],
            "ranks/rss_gib": [r[2] for r in per_rank], "ranks/tokens": rank_tokens,
            # each rank's time to reach the gradient sync (its own work: the rest of its step is waiting for the
            # slowest) and its process's CPU share: what tells a straggler's cause
            "ranks/ready_s": [r[4] for r in per_rank], "ranks/cpu_pct": [r[5] for r in per_rank],
            "ranks/node": self.nodes,
            # the share of computed positions that are padding, and how unevenly the ranks' tokens were dealt
            "data/padding_pct": 100.0 * (1 - tokens / positions) if positions else 0.0,
            "data/tokens_per_rank_spread": (max(rank_tokens) - min(rank_tokens)) / mean_tokens if mean_tokens else 0.0,
        }
        if self.t.pixels is not None:  # images that could not be used when a loader read them: their records skipped
            record["data/images_skipped"] = int(round(skipped))
        if self.compiling:  # the slowest rank's, as the step time
            record["time/compile_s"] = max(r[6] for r in per_rank)
        if router_totals and router_totals[1]:  # the steps' auxiliary values summed over ranks / the steps
            record["train/moe_aux_loss"] = router_totals[0] * self.ctx.world_size / router_totals[1]
            if self.t.router.z_coef:
                record["train/moe_z_loss"] = router_totals[2] * self.ctx.world_size / router_totals[1]
            self.t.router.sums[:] = [0.0, 0.0, 0.0]
            e = self.t.router.experts.count
            counts = router_totals[3:]
            record.update(router_health([counts[i:i + e] for i in range(0, len(counts), e)]))
        if self.t.objective is not None:
            record.update(self.t.objective.record(pref))
            self.t.objective_sums[:] = [0.0] * len(self.t.objective_sums)
        if samples:
            f = self.t.facts.flops
            per_token = flops_per_token(f["n_params"], f["n_layers"], f["hidden"], int(tokens / samples),
                                        f["lora_params"] if self.t.lora else None)
            record["perf/flops_per_token"] = per_token
            value = mfu(tokens / slowest / self.ctx.world_size, per_token, self.peak)
            if value is not None:
                record["perf/mfu"] = value
        self.write(record)
        self._reset()

    def write(self, record: dict) -> None:
        if self.sink:
            self.sink.write({"time": time.time(), **record})

    def summary(self, train_time: float, eval_time: float, final_eval: dict) -> dict:
        cfg, progress = self.cfg, self.t.progress
        return {
            "world_size": self.ctx.world_size, "backend": self.ctx.backend, "device": self.ctx.device,
            "strategy": cfg.train.strategy, "task": cfg.model.task, "model": cfg.model.name_or_path,
            "finetuning_type": cfg.model.finetuning_type,
            "global_batch_size": global_batch(cfg.train, self.ctx.dp_size),
            "learning_rate": self.spec.learning_rate, "steps": progress.step, "epochs": progress.epoch,
            "train_time_s": train_time, "eval_time_s": eval_time,
            "throughput/samples_per_s": self.samples_total / train_time if train_time > 0 else 0.0,
            "throughput/tokens_per_s": self.tokens_total / train_time if train_time > 0 else 0.0,
            "samples_per_step_per_device": (cfg.train.per_device_train_batch_size
                                            * cfg.train.gradient_accumulation_steps),
            "parameters/trainable": self.t.facts.trainable, "parameters/total": self.t.facts.total,
            **self.t.facts.lora, "final": final_eval,
        }
