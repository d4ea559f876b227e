"""Step planning, LR scaling, optimizer and scheduler: pure functions of the config."""

from __future__ import annotations

import math

from scaletrain.config.schema import Config, TrainConfig
from scaletrain.errors import ConfigError


def global_batch_size(train: TrainConfig, world_size: int) -> int:
    return train.per_device_train_batch_size * train.gradient_accumulation_steps * world_size


def scaled_learning_rate(train: TrainConfig, world_size: int) -> float:
    """``learning_rate`` scaled by global batch / reference batch (linear or sqrt rule).

    The reference defaults to the 1-worker global batch, so the 1-worker baseline keeps its LR.
    """
    if train.lr_scaling == "none":
        return train.learning_rate
    ref = train.lr_reference_batch or global_batch_size(train, 1)
    ratio = global_batch_size(train, world_size) / ref
    return train.learning_rate * (ratio if train.lr_scaling == "linear" else math.sqrt(ratio))


def steps_per_epoch(num_train: int, train: TrainConfig, world_size: int) -> int:
    # Each rank drops its last partial micro-batch, and a partial accumulation window is dropped too.
    per_rank = num_train // world_size
    return per_rank // train.per_device_train_batch_size // train.gradient_accumulation_steps


def total_steps(num_train: int, cfg: Config, world_size: int) -> int:
    spe = steps_per_epoch(num_train, cfg.train, world_size)
    if spe == 0:
        gb = global_batch_size(cfg.train, world_size)
        raise ConfigError(
            f"data.train_file has {num_train} training example(s), fewer than one global batch of {gb} "
            f"(per_device_train_batch_size x gradient_accumulation_steps x num_workers); "
            f"lower train.per_device_train_batch_size or add data"
        )
    if cfg.train.max_steps > 0:
        return cfg.train.max_steps
    return max(1, math.ceil(cfg.train.num_train_epochs * spe))


def warmup_steps(train: TrainConfig, total: int) -> int:
    return train.warmup_steps or int(math.ceil(train.warmup_ratio * total))


FUSED_DEVICES = ("cpu", "cuda")  # device types torch's fused AdamW runs on (ROCm is "cuda")


def build_optimizer(model, train: TrainConfig, lr: float, total: int):
    import torch
    from transformers import get_scheduler

    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (no_decay if p.ndim < 2 or "norm" in name.lower() else decay).append(p)
    groups = [{"params": decay, "weight_decay": train.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    # torch's fused AdamW kernel (CPU and CUDA/ROCm, as torchtitan's default): one MiniLM step (22.7M parameters,
    # 1 CPU thread) takes 16 ms against 113 ms for the per-parameter loop and 96 ms for foreach.
    fused = all(p.device.type in FUSED_DEVICES and p.is_floating_point() for g in groups for p in g["params"])
    optimizer = torch.optim.AdamW(groups, lr=lr, betas=(train.adam_beta1, train.adam_beta2),
                                  **({"fused": True} if fused else {"foreach": False}))
    scheduler = get_scheduler(train.lr_scheduler_type, optimizer,
                              num_warmup_steps=warmup_steps(train, total), num_training_steps=total)
    return optimizer, scheduler


def accumulation_for(global_batch: int, batch: int, workers: int, exact: bool = True) -> int | None:
    """The gradient accumulation that keeps ``global_batch`` on ``workers`` (None: it cannot, exactly); with
    ``exact=False`` the nearest one (at least 1)."""
    accum, rest = divmod(global_batch, batch * workers)
    if not rest and accum >= 1:
        return accum
    return None if exact else max(1, round(global_batch / (batch * workers)))


def for_world_size(cfg, world_size: int):
    """The config a worker of an elastic run trains with on ``world_size`` workers: the global batch of
    ``scaling.num_workers`` (max) workers, through gradient_accumulation_steps."""
    s, t = cfg.scaling, cfg.train
    if world_size == s.num_workers:
        return cfg
    global_batch = t.per_device_train_batch_size * t.gradient_accumulation_steps * s.num_workers
    accum = accumulation_for(global_batch, t.per_device_train_batch_size, world_size,
                             exact=s.elastic_batch == "exact")
    if accum is None:  # checked at load: only a world size outside the range gets here
        raise ValueError(f"{world_size} workers cannot keep the global batch {global_batch}")
    return cfg.model_copy(update={"train": t.model_copy(update={"gradient_accumulation_steps": accum}),
                                  "scaling": s.model_copy(update={"num_workers": world_size})})
