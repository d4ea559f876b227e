"""The training state of one worker in one object: what a step changes and a checkpoint saves.

Like torchtitan's ``Trainer``: model, optimizer, scheduler, precision, the distributed context, the config
and the job's facts travel together, so a step takes ``(trainer, window, step)`` and a checkpoint takes the
trainer, instead of a dozen loose arguments.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import torch

from scaletrain.checkpoint import TrainState
from scaletrain.comm.context import DistContext
from scaletrain.comm.watchdog import Heartbeat
from scaletrain.config.schema import Config
from scaletrain.metrics.flops import model_flops_facts
from scaletrain.memory.measure import PeakMemory
from scaletrain.model import build_model, count_parameters, preload
from scaletrain.rundir import RunDir
from scaletrain.worker.optim import build_optimizer, global_batch_size
from scaletrain.worker.parallel import wrap_model
from scaletrain.worker.precision import Precision
from scaletrain.worker.spec import JobSpec


@dataclass(frozen=True)
class ModelFacts:
    """Counted on the unwrapped model, before sharding."""

    trainable: int
    total: int
    flops: dict  # metrics.flops.model_flops_facts


@dataclass
class Trainer:
    ctx: DistContext
    cfg: Config
    spec: JobSpec
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    precision: Precision
    beat: Heartbeat
    facts: ModelFacts
    memory: PeakMemory | None = None  # started before the model was built
    progress: TrainState = field(default_factory=TrainState)
    grad_norm: float = float("nan")  # of the last step, before clipping (the same on every rank)
    pending_save: object = None  # checkpoint.async_save: the save in flight (checkpoint.flush completes it)
    checkpoint_group: object = None  # its gloo process group
    restored_world_size: int | None = None  # the size the restored checkpoint was saved with
    restored_accumulation: int | None = None

    @property
    def run_dir(self) -> RunDir:
        return RunDir(self.spec.run_dir)

    @property
    def lora(self) -> bool:
        """Only the adapter is trainable: checkpoints hold trainable parameters only."""
        return self.cfg.model.finetuning_type == "lora"

    @property
    def lr(self) -> float:
        return self.scheduler.get_last_lr()[0]

    def describe(self) -> str:
        ctx, f = self.ctx, self.facts
        return (f"{ctx.world_size} x {ctx.device} ({ctx.backend}); {f.trainable:,} of {f.total:,} parameters "
                f"trainable; global batch {global_batch_size(self.cfg.train, ctx.world_size)}; "
                f"{self.spec.total_steps} steps; lr {self.spec.learning_rate:g}; {self.precision.note}")


def build_trainer(ctx: DistContext, spec: JobSpec, cfg: Config, beat: Heartbeat) -> Trainer:
    preload(lora=cfg.model.finetuning_type == "lora")  # imports before the memory baseline: no training memory
    memory = PeakMemory(ctx.device)
    seed_everything(cfg.train.seed)  # identical on every rank: random init must match before sharding
    model = build_model(cfg.model, spec.vocab_size, spec.pad_token_id, cfg.data.label_names,
                        packed=cfg.data.packing)
    trainable, total = count_parameters(model)
    facts = ModelFacts(trainable, total, model_flops_facts(model))
    model = wrap_model(model, ctx, cfg.train)
    optimizer, scheduler = build_optimizer(model, cfg.train, spec.learning_rate, spec.total_steps)
    return Trainer(ctx, cfg, spec, model, optimizer, scheduler, Precision(cfg, ctx.device), beat, facts, memory)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy as np

        np.random.seed(seed)
    except ImportError:
        pass
